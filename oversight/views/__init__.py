"""Oversight pages: each role's home, the audit trail, the error pages and the health endpoint."""

from __future__ import annotations

import json
import logging
import secrets
import sys
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import permission_required
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.paginator import Paginator
from django.db.models import Count
from django.http import (
    FileResponse,
    Http404,
    HttpResponse,
    HttpResponseServerError,
)
from django.shortcuts import render
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST

from accounts import roles
from accounts.denials import record_denial
from accounts.models import AccessDenial
from audit.chain import case_chain
from audit.checkpoints import latest_checkpoint, verify_anchored_chain
from audit.export import export_case_bundle
from audit.models import AuditEvent
from audit.signing import current_key_id, public_keys
from oversight.api import EXPORT_AUDIT
from oversight.queries import inbox_for
from planning import rules
from planning.models import Case, CaseStatus
from planning.queries import case_for
from web.http import HTMX_VARY, HtmxHttpRequest, render_partial

logger = logging.getLogger(__name__)

TRAIL_PAGE_SIZE = 50
VERIFIER_FILE = "casehub_verify.py"


@require_GET
def home(request: HtmxHttpRequest) -> HttpResponse:
    """Show the signed-in user the landing page of their role."""
    user = request.user
    role = roles.role_of(user)
    context: dict[str, object] = {"role": role}
    if user.has_perm(rules.VIEW_AUDIT):
        context["recent_events"] = AuditEvent.objects.order_by("-time", "-id")[:10]
    if user.has_perm(rules.VIEW_AUDIT) or user.has_perm(rules.CONFIGURE):
        today = _day_start(timezone.localdate())
        context["events_today"] = AuditEvent.objects.filter(time__gte=today).count()
    if user.has_perm("oversight.decide_gate"):
        pending = inbox_for(user).select_related("case", "node", "version")
        context["first_pending"] = list(pending.order_by("deadline", "id")[:5])
    if rules.can_submit_cases(user):
        counts = dict(
            Case.objects.filter(submitter_id=user.pk)
            .values_list("status")
            .annotate(n=Count("pk"))
            .values_list("status", "n")
        )
        context["my_cases"] = [
            (value, label, counts[value]) for value, label in CaseStatus.choices if value in counts
        ]
        context["my_case_total"] = sum(counts.values())
    return render(request, "oversight/home.html", context)


def _error_page(
    request: HtmxHttpRequest, template: str, status: int, message: str, **extra: object
) -> HttpResponse:
    if not hasattr(request, "user"):
        # Refused before the sign-in middleware ran (a Host header not in ALLOWED_HOSTS).
        request.user = AnonymousUser()
    context = {"message": message, "can_read_cases": rules.can_read_cases(request.user), **extra}
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
    """Render the 403 page in the site's layout (a notice for htmx), with the reason given.

    Recorded as an access denial (aggregated per client and minute).
    """
    # PermissionDenied messages are written by CaseHub's own checks, for the user to read.
    message = str(exception) if isinstance(exception, PermissionDenied) else ""
    if message:
        # Checks word their reasons as clauses ("only admins manage users"): show a sentence.
        message = message[0].upper() + message[1:].rstrip(".") + "."
    record_denial(request, AccessDenial.Kind.FORBIDDEN)
    # Some refusals no role would lift (an admin's change to a user's record, adding a tool).
    ask_for_role = not isinstance(exception, roles.NoRoleAllows)
    return _error_page(request, "403.html", 403, message, ask_for_role=ask_for_role)


def page_not_found(request: HtmxHttpRequest, exception: Exception) -> HttpResponse:
    """Render the 404 page in the site's layout (a notice for htmx); the reason stays private.

    Recorded as an access denial (aggregated per client and minute), unless for a static file.
    """
    record_denial(request, AccessDenial.Kind.NOT_FOUND)
    return _error_page(request, "404.html", 404, "")


def bad_request(request: HtmxHttpRequest, exception: Exception) -> HttpResponse:
    """Render the 400 page (a notice for htmx): the request was malformed or too large."""
    too_big = isinstance(exception, RequestDataTooBig)
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    message = f"The form sent more than {limit:,} bytes." if too_big else ""
    return _error_page(request, "400.html", 400, message)


def server_error(request: HtmxHttpRequest) -> HttpResponse:
    """Render the generic 500 page (a notice for htmx) naming an error id; log the error under it.

    Never shows the exception. When the page itself cannot be rendered (the database is down, say)
    a plain page with the same id is answered instead.
    """
    error_id = secrets.token_hex(8)
    exc_info = sys.exc_info()
    logger.error(
        "Error %s: %s %s failed",
        error_id,
        request.method,
        request.path,
        exc_info=exc_info if exc_info[0] is not None else None,
    )
    try:
        return _error_page(request, "500.html", 500, "", error_id=error_id)
    except Exception:
        logger.exception("Error %s: the error page could not be rendered", error_id)
        return HttpResponseServerError(
            f"<!doctype html><title>Server error</title><h1>Server error</h1>"
            f"<p>Something went wrong on our side (error id {error_id}).</p>",
            content_type="text/html; charset=utf-8",
        )


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


@dataclass(frozen=True, slots=True)
class TrailFilters:
    """The filters of a case's trail, as read from the URL; `problems` names the unreadable ones."""

    actor: str = ""
    action: str = ""
    since: date | None = None
    until: date | None = None
    problems: tuple[str, ...] = ()

    def query(self, page: int | None = None) -> str:
        """Return the URL query string of these filters (and a page number)."""
        params = {
            "actor": self.actor,
            "action": self.action,
            "from": self.since.isoformat() if self.since else "",
            "to": self.until.isoformat() if self.until else "",
        }
        if page is not None:
            params["page"] = str(page)
        return urlencode({k: v for k, v in params.items() if v})


def _date_param(
    request: HtmxHttpRequest, name: str, label: str, problems: list[str]
) -> date | None:
    raw = request.GET.get(name, "").strip()
    if not raw:
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError:
        problems.append(f"{label} is not a date (YYYY-MM-DD); it was ignored.")
        return None


def _trail_filters(request: HtmxHttpRequest) -> TrailFilters:
    problems: list[str] = []
    since = _date_param(request, "from", "From", problems)
    until = _date_param(request, "to", "To", problems)
    return TrailFilters(
        actor=request.GET.get("actor", "").strip()[:150],
        action=request.GET.get("action", "").strip()[:100],
        since=since,
        until=until,
        problems=tuple(problems),
    )


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class ChangeRow:
    """One field of a before/after change: the values on each side and whether they differ."""

    field: str
    before: str
    after: str
    changed: bool


def _changes(before: Any, after: Any) -> list[ChangeRow]:
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return [ChangeRow("", _pretty(before), _pretty(after), before != after)]
    return [
        ChangeRow(
            str(key),
            _pretty(before[key]) if key in before else "—",
            _pretty(after[key]) if key in after else "—",
            before.get(key) != after.get(key) or (key in before) != (key in after),
        )
        for key in sorted({*before, *after}, key=str)
    ]


@dataclass(frozen=True, slots=True)
class TrailEntry:
    """An event as the trail page shows it: the event, its data pretty-printed, its changes."""

    event: AuditEvent
    data: str
    reason: str
    changes: list[ChangeRow]


def _entry(event: AuditEvent) -> TrailEntry:
    data = event.data if isinstance(event.data, dict) else {"value": event.data}
    changes: list[ChangeRow] = []
    if "before" in data and "after" in data:
        changes = _changes(data["before"], data["after"])
    else:
        # Admin changes carry {field: {"before": old, "after": new}}.
        for name, value in data.items():
            if isinstance(value, dict) and set(value) == {"before", "after"}:
                changes.extend(
                    ChangeRow(str(name), r.before, r.after, r.changed)
                    for r in _changes(value["before"], value["after"])
                )
    reason = data.get("reason")
    return TrailEntry(
        event=event,
        data=_pretty(event.data),
        reason=reason if isinstance(reason, str) else ("" if reason is None else _pretty(reason)),
        changes=changes,
    )


@dataclass(frozen=True, slots=True)
class Integrity:
    """The verifier's verdict on a stored chain, for the banner."""

    ok: bool
    events: int
    first_seq: int | None
    first_problem: str
    problem_count: int
    checkpoint_seq: int | None = None


def _integrity(chain: str) -> Integrity:
    try:
        verification = verify_anchored_chain(chain)
        checkpoint = latest_checkpoint(chain)
    except ValueError as exc:
        return Integrity(False, 0, None, f"checkpoint: {exc}", 1)
    checkpoint_seq = checkpoint.seq if checkpoint is not None else None
    problems = sorted(verification.problems, key=lambda p: p.seq)
    if not problems:
        return Integrity(True, verification.count, None, "", 0, checkpoint_seq)
    first = problems[0]
    return Integrity(
        False, verification.count, first.seq, first.problem, len(problems), checkpoint_seq
    )


def _signing_keys() -> list[dict[str, object]]:
    current = current_key_id()
    keys = [
        {"key_id": key_id, "public_key": raw.hex(), "current": key_id == current}
        for key_id, raw in public_keys().items()
    ]
    return sorted(keys, key=lambda key: (not key["current"], key["key_id"]))


def _require_exporter(request: HtmxHttpRequest) -> None:
    if not request.user.has_perm(EXPORT_AUDIT):
        raise PermissionDenied("Only auditors may export audit trails.")


def _require_key_reader(request: HtmxHttpRequest) -> None:
    if not (request.user.has_perm(EXPORT_AUDIT) or request.user.has_perm(rules.CONFIGURE)):
        raise PermissionDenied("Only auditors and admins may download the verifier and keys.")


@require_GET
@permission_required(rules.VIEW_AUDIT, raise_exception=True)
def case_trail(request: HtmxHttpRequest, case_id: int) -> HttpResponse:
    """Show a case's audit chain in seq order, filtered, with the verifier's integrity banner.

    403 unless you may view the audit trail; Http404 when the case does not exist.
    """
    case = case_for(request.user, case_id)
    chain = case_chain(case.pk)
    filters = _trail_filters(request)
    events = AuditEvent.objects.filter(chain=chain).order_by("seq")
    if filters.actor:
        events = events.filter(actor_label__iexact=filters.actor)
    if filters.action:
        events = events.filter(action__startswith=filters.action)
    if filters.since:
        events = events.filter(time__gte=_day_start(filters.since))
    if filters.until:
        events = events.filter(time__lt=_day_start(filters.until + timedelta(days=1)))
    page = Paginator(events, TRAIL_PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "case": case,
        "chain": chain,
        "filters": filters,
        "page": page,
        "entries": [_entry(event) for event in page.object_list],
        "previous_query": filters.query(page.previous_page_number()) if page.has_previous() else "",
        "next_query": filters.query(page.next_page_number()) if page.has_next() else "",
        "integrity": _integrity(chain),
        "can_export": request.user.has_perm(EXPORT_AUDIT),
        "signing_keys": _signing_keys(),
        # How many times the key list has asked for the key an export is making (see the page).
        "key_wait": _key_wait(request),
    }
    return render_partial(
        request, "oversight/case_trail.html", context, partials={"trail-events", "signing-keys"}
    )


def _key_wait(request: HtmxHttpRequest) -> int:
    value = request.GET.get("key_wait", "")
    return int(value) if value.isdigit() and len(value) < 3 else 0


@require_POST
@permission_required(rules.VIEW_AUDIT, raise_exception=True)
def case_trail_export(request: HtmxHttpRequest, case_id: int) -> FileResponse:
    """Download the case's signed audit bundle, as `/api/audit/export` does; the export is audited.

    403 unless you are an auditor; Http404 when the case does not exist.
    """
    _require_exporter(request)
    case = case_for(request.user, case_id)
    bundle = export_case_bundle(case_id=case.pk, exporter=request.user)  # type: ignore[arg-type]
    return FileResponse(
        bundle.file, as_attachment=True, filename=bundle.filename, content_type="application/zip"
    )


@require_GET
def verifier_download(request: HtmxHttpRequest) -> FileResponse:
    """Download casehub_verify.py, the offline verifier, exactly as the server runs it.

    403 unless you are an auditor or an admin.
    """
    _require_key_reader(request)
    path = settings.BASE_DIR / VERIFIER_FILE
    return FileResponse(
        path.open("rb"), as_attachment=True, filename=VERIFIER_FILE, content_type="text/x-python"
    )


@require_GET
def public_key_download(request: HtmxHttpRequest, key_id: str) -> HttpResponse:
    """Download one signing key's public half as hex, current or retired.

    403 unless you are an auditor or an admin; Http404 for a key this installation never had.
    """
    _require_key_reader(request)
    raw = public_keys().get(key_id)
    if raw is None:
        raise Http404("No such signing key")
    response = HttpResponse(f"{raw.hex()}\n", content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="casehub-audit-key-{key_id}.pub"'
    return response
