"""The project's own endpoint: GET /health (database, broker and workers)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.http import HttpRequest, HttpResponsePermanentRedirect, JsonResponse
from django.templatetags.static import static
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from execution.heartbeats import worker_status
from oversight.dispatch import broker_status


def _database_status() -> dict[str, object]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        return {"ok": False, "vendor": connection.vendor, "error": type(exc).__name__}
    return {"ok": True, "vendor": connection.vendor}


@never_cache
@login_not_required
@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """Report database, broker and worker heartbeat; 200 when all are healthy, else 503."""
    checks = {
        "database": _database_status(),
        "broker": broker_status(),
        "worker": worker_status(),
    }
    healthy = all(check["ok"] for check in checks.values())
    body = {"status": "ok" if healthy else "degraded", **checks}
    return JsonResponse(body, status=200 if healthy else 503)


@login_not_required
@require_GET
def favicon(request: HttpRequest) -> HttpResponsePermanentRedirect:
    """Send a browser's `/favicon.ico` probe (the admin's pages link no icon) to the static one."""
    return HttpResponsePermanentRedirect(static("casehub/favicon.ico"))
