"""GET /metrics: the Prometheus exposition of every CaseHub process, for allowed scrapers only."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)

from observability import metrics
from observability.collector import CaseHubCollector
from web.http import client_ip

logger = logging.getLogger(__name__)


def refusal(request: HttpRequest) -> str | None:
    """Return why this scrape is refused (`address` or `token`), or None when it is allowed.

    The client's address (REMOTE_ADDR, or X-Forwarded-For behind CASEHUB_TRUSTED_PROXY_COUNT
    proxies) must be in CASEHUB_METRICS_ALLOW, and when CASEHUB_METRICS_TOKEN is set the request
    must carry `Authorization: Bearer <token>` as well.
    """
    try:
        address = ipaddress.ip_address(client_ip(request))
    except ValueError:
        return "address"
    if not any(address in network for network in settings.CASEHUB_METRICS_ALLOW):
        return "address"
    token = settings.CASEHUB_METRICS_TOKEN
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), token):
            return "token"
    return None


def exposition() -> bytes:
    """Return the metrics of all processes (multiprocess mode) or of this one, and the gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        counted = CollectorRegistry()
        multiprocess.MultiProcessCollector(counted)
    else:
        counted = REGISTRY
    gauges = CollectorRegistry()
    gauges.register(CaseHubCollector())
    # Two registries, no metric name in both: their expositions follow one another.
    return generate_latest(counted) + generate_latest(gauges)


@never_cache
@login_not_required
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Answer a scrape with the exposition, or 403 for a client that is not allowed.

    A refusal is counted and logged, not audited as an access denial: a misconfigured scraper
    asks every few seconds, and the audit trail is for people's actions.
    """
    reason = refusal(request)
    if reason is not None:
        metrics.SCRAPES_REFUSED.labels(reason).inc()
        logger.warning("metrics: scrape refused (%s) from %s", reason, client_ip(request))
        return HttpResponse("Forbidden\n", status=403, content_type="text/plain")
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
