"""Oversight pages: each role's home, the audit trail, the error pages and the health endpoint."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth.decorators import login_not_required, permission_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from casehub.http import HTMX_VARY, HtmxHttpRequest, render_partial
from oversight import roles
from oversight.dispatch import broker_status
from oversight.models import AuditEvent, WorkerHeartbeat
from planning import rules


@require_GET
def home(request: HtmxHttpRequest) -> HttpResponse:
    """Show the signed-in user the landing page of their role."""
    role = roles.role_of(request.user)
    context: dict[str, object] = {"role": role}
    if request.user.has_perm(rules.VIEW_AUDIT):
        context["recent_events"] = AuditEvent.objects.order_by("-time", "-id")[:10]
    return render(request, "oversight/home.html", context)


def _error_page(request: HtmxHttpRequest, template: str, status: int, message: str) -> HttpResponse:
    context = {"message": message, "can_read_cases": rules.can_read_cases(request.user)}
    if getattr(request, "htmx", False):
        # A small notice in the page's error region instead of whatever the request targeted.
        response = render(request, f"{template}#error-notice", context, status=status)
        response["HX-Retarget"] = "#htmx-error"
        response["HX-Reswap"] = "innerHTML"
    else:
        response = render(request, template, context, status=status)
    patch_vary_headers(response, HTMX_VARY)
    return response


def permission_denied(request: HtmxHttpRequest, exception: Exception) -> HttpResponse:
    """Render the 403 page in the site's layout (a notice for htmx), with the reason given."""
    # PermissionDenied messages are written by CaseHub's own checks, for the user to read.
    message = str(exception) if isinstance(exception, PermissionDenied) else ""
    return _error_page(request, "403.html", 403, message)


def page_not_found(request: HtmxHttpRequest, exception: Exception) -> HttpResponse:
    """Render the 404 page in the site's layout (a notice for htmx); the reason stays private."""
    return _error_page(request, "404.html", 404, "")


@require_GET
@permission_required(rules.VIEW_AUDIT, raise_exception=True)
def audit_list(request: HtmxHttpRequest) -> HttpResponse:
    """List audit events, newest first, optionally filtered by action prefix and chain."""
    events = AuditEvent.objects.order_by("-time", "-id")
    action = request.GET.get("action", "").strip()
    chain = request.GET.get("chain", "").strip()
    if action:
        events = events.filter(action__startswith=action)
    if chain:
        events = events.filter(chain=chain)
    page = Paginator(events, 50).get_page(request.GET.get("page"))
    context = {"page": page, "action": action, "chain": chain}
    return render_partial(request, "oversight/audit_list.html", context, partials={"audit-table"})


def _database_status() -> dict[str, object]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        return {"ok": False, "vendor": connection.vendor, "error": type(exc).__name__}
    return {"ok": True, "vendor": connection.vendor}


def _worker_status() -> dict[str, object]:
    stale_after = timedelta(seconds=settings.CASEHUB_HEARTBEAT_STALE_S)
    try:
        beats = list(WorkerHeartbeat.objects.order_by("-last_seen")[:20])
    except Exception as exc:
        return {"ok": False, "workers": [], "error": type(exc).__name__}
    now = timezone.now()
    alive = [b for b in beats if now - b.last_seen <= stale_after]
    return {
        "ok": bool(alive),
        "alive": len(alive),
        "workers": [
            {
                "hostname": b.hostname,
                "last_seen": b.last_seen.isoformat(),
                "age_s": round((now - b.last_seen).total_seconds(), 1),
            }
            for b in beats
        ],
    }


@never_cache
@login_not_required
@require_GET
def health(request: HttpRequest) -> JsonResponse:
    """Report database, broker and worker heartbeat; 200 when all are healthy, else 503."""
    checks = {
        "database": _database_status(),
        "broker": broker_status(),
        "worker": _worker_status(),
    }
    healthy = all(check["ok"] for check in checks.values())
    body = {"status": "ok" if healthy else "degraded", **checks}
    return JsonResponse(body, status=200 if healthy else 503)
