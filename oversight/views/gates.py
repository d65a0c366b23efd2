"""Officers' pages: the review inbox, a gate's page and its decisions, a case's gates, and the
notifications of the signed-in user."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_GET, require_POST

from accounts import oidc
from accounts.signin import is_password_sign_in_off
from oversight.actions.gates import (
    DecisionDenied,
    DecisionInput,
    GateConflict,
    ReasonInvalid,
    SignatureRefused,
    bulk_approve,
    can_decide,
    decide_gate,
    signature_meaning,
)
from oversight.actions.notifications import mark_notifications_read
from oversight.models import (
    Gate,
    GateDecision,
    GateKind,
    GateRisk,
    Notification,
    ReasonCode,
)
from oversight.policy import RISK_CLASSES
from oversight.queries import inbox_for, visible_gate
from oversight.upstream import shown_input, step_output
from planning.catalogue import registered_packs
from planning.core.diff import PlanDiff, diff_plans
from planning.core.refs import REF_KEY, is_ref
from planning.dot import plan_dot
from planning.estimates import llm_steps
from planning.models import PlanNode, PlanVersion, Tool
from planning.queries import case_for, visible_cases
from planning.versions import load_plan
from web.http import HtmxHttpRequest, render_partial

INBOX_PAGE_SIZE = 25
NOTIFICATIONS_PAGE_SIZE = 30
SORTS: dict[str, tuple[str, ...]] = {
    "deadline": ("deadline", "id"),
    "-deadline": ("-deadline", "-id"),
}
# The risk classes, mildest first; all but `read` change something (the plan's consequences,
# listed on every gate page).
RISK_ORDER = RISK_CLASSES
CONSEQUENTIAL = frozenset(RISK_ORDER[1:])


# The inbox ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InboxFilters:
    """The inbox's filters and sort order as read from the URL (unknown values are ignored)."""

    case: int | None = None
    domain: str = ""
    kind: str = ""
    risk: str = ""
    sort: str = "deadline"

    def query(self, **changes: Any) -> str:
        """Return the URL query of these filters, with some values changed (e.g. the page)."""
        params: dict[str, Any] = {
            "case": self.case or "",
            "domain": self.domain,
            "kind": self.kind,
            "risk": self.risk,
            "sort": "" if self.sort == "deadline" else self.sort,
        }
        params.update(changes)
        return urlencode({k: v for k, v in params.items() if v not in ("", None)})


def _inbox_filters(request: HtmxHttpRequest) -> InboxFilters:
    raw_case = request.GET.get("case", "").strip().lstrip("#")
    domain = request.GET.get("domain", "").strip()
    kind = request.GET.get("kind", "").strip()
    risk = request.GET.get("risk", "").strip()
    sort = request.GET.get("sort", "").strip()
    return InboxFilters(
        case=int(raw_case) if raw_case.isdigit() and len(raw_case) < 12 else None,
        domain=domain if domain in registered_packs() else "",
        kind=kind if kind in GateKind.values else "",
        risk=risk if risk in GateRisk.values else "",
        sort=sort if sort in SORTS else "deadline",
    )


def _bulk_ready(gate: Gate) -> bool:
    return gate.kind == GateKind.STEP and gate.risk == GateRisk.LOW and not gate.needs_signature


@require_GET
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    """List the open gates waiting for the user's decision, filtered and sorted from the URL.

    Separation of duties is in the query (`inbox_for`): never the user's own cases, never a
    version they edited; admins and users who do not decide gates see an empty inbox.
    """
    filters = _inbox_filters(request)
    # Prefetched, not joined: the page of 50 is picked from the gate table alone (by deadline),
    # then its cases, versions and nodes are read by id.
    gates = inbox_for(request.user).prefetch_related("case", "version", "node")
    if filters.case is not None:
        gates = gates.filter(case_id=filters.case)
    if filters.domain:
        gates = gates.filter(case__domain=filters.domain)
    if filters.kind:
        gates = gates.filter(kind=filters.kind)
    if filters.risk:
        gates = gates.filter(risk=filters.risk)
    gates = gates.order_by(*SORTS[filters.sort])
    page = Paginator(gates, INBOX_PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [{"gate": gate, "bulk": _bulk_ready(gate)} for gate in page.object_list]
    context = {
        "page": page,
        "rows": rows,
        "filters": filters,
        "has_bulk": any(row["bulk"] for row in rows),
        "domains": [(slug, pack.name) for slug, pack in registered_packs().items()],
        "kinds": GateKind.choices,
        "risks": GateRisk.choices,
        "previous_query": filters.query(page=page.previous_page_number())
        if page.has_previous()
        else "",
        "next_query": filters.query(page=page.next_page_number()) if page.has_next() else "",
        "deadline_query": filters.query(sort="-deadline" if filters.sort == "deadline" else ""),
        "here": f"{request.path}?{request.GET.urlencode()}" if request.GET else request.path,
        "may_decide": request.user.has_perm("oversight.decide_gate"),
    }
    return render_partial(request, "oversight/gate_inbox.html", context, partials={"inbox-table"})


def _back_to_inbox(request: HtmxHttpRequest) -> HttpResponse:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return redirect(target)
    return redirect("oversight:inbox")


@require_POST
def inbox_approve(request: HtmxHttpRequest) -> HttpResponse:
    """Approve the selected low-risk step gates of one plan version, one decision each.

    Raises Http404 when a selected gate is not of a case the user may read, PermissionDenied
    (DecisionDenied) when the user may not decide one of them; a selection that bulk approval
    does not take comes back to the inbox with the reason.
    """
    raw = request.POST.getlist("gate")
    ids = [int(value) for value in raw if value.isdigit() and len(value) < 12]
    if len(ids) != len(raw) or not ids:
        messages.error(request, "Select at least one low-risk step gate to approve together.")
        return _back_to_inbox(request)
    # A gate of a case the user may not read is no gate at all (W4): 404, as its page answers,
    # so that the answer cannot tell another user's gate from a missing one.
    readable = Gate.objects.filter(pk__in=ids, case__in=visible_cases(request.user)).count()
    if readable != len(set(ids)):
        raise _not_found(request, "gate", ids[0])
    try:
        decided = bulk_approve(gate_ids=ids, user=request.user)  # type: ignore[arg-type]
    except Gate.DoesNotExist:
        raise Http404("No such gate") from None
    except GateConflict as exc:
        messages.error(request, f"Nothing was approved: {exc}.")
        return _back_to_inbox(request)
    approved = sum(1 for gate in decided if gate.status == "approved")
    messages.success(
        request,
        f"Recorded {len(decided)} approval{'s' if len(decided) != 1 else ''}, one per gate"
        f" ({approved} gate{'s' if approved != 1 else ''} now approved).",
    )
    return _back_to_inbox(request)


# A gate's page -----------------------------------------------------------------------------


def _not_found(request: HtmxHttpRequest, what: str, object_id: int) -> Http404:
    """Return the 404 for something the user may not see (or that does not exist), W4.

    The 404 handler records the attempt, aggregated per client and minute
    (`accounts.denials`), so an id scan cannot flood the audit chain.
    """
    return Http404(f"No such {what}")


def _gate_for(request: HtmxHttpRequest, gate_id: int) -> Gate:
    try:
        return visible_gate(request.user, gate_id)
    except Http404:
        raise _not_found(request, "gate", gate_id) from None


def _node_url(case_id: int) -> Callable[[PlanNode], str]:
    marker = 987654321
    pattern = reverse("planning:node-detail", kwargs={"case_id": case_id, "node_id": marker})
    head, tail = pattern.rsplit(str(marker), 1)
    return lambda node: f"{head}{node.pk}{tail}"


def _subjects(node: PlanNode, by_key: Mapping[str, PlanNode], limit: int = 3) -> list[str]:
    """Return the literal values a step acts on, following its references upstream.

    A payment hold takes the audit report, which came from the invoice's fields: the subject
    is the invoice id. Breadth-first, each step visited once.
    """
    found: list[str] = []
    seen: set[str] = set()
    frontier = [node]
    while frontier and len(found) < limit:
        upstream: list[PlanNode] = []
        for step in frontier:
            if step.key in seen:
                continue
            seen.add(step.key)
            inputs = step.inputs if isinstance(step.inputs, dict) else {}
            for value in inputs.values():
                if is_ref(value):
                    if value[REF_KEY] in by_key:
                        upstream.append(by_key[value[REF_KEY]])
                elif isinstance(value, str | int | float) and not isinstance(value, bool):
                    text = str(value)
                    if text and text not in found:
                        found.append(text)
        frontier = upstream
    return found[:limit]


@dataclass(frozen=True, slots=True)
class Consequence:
    """A step of the plan that writes, pays, calls out or destroys, as the gate page lists it."""

    node: PlanNode
    action: str
    subjects: list[str]
    risk: str
    inputs: list[tuple[str, str]]
    is_this_gate: bool

    @property
    def summary(self) -> str:
        on = f" on {', '.join(self.subjects)}" if self.subjects else ""
        return f"{self.action}{on} — {self.risk}"


def _risk_of(node: PlanNode, tool_risks: Mapping[str, str]) -> str:
    """Return the worse of the tool's registered risk class and the step's declared one."""
    classes = [r for r in (tool_risks.get(node.tool, ""), node.risk) if r]
    # An unknown class counts as the worst: fail closed, as the gating policy does.
    return max(classes, key=lambda r: RISK_ORDER.index(r) if r in RISK_ORDER else 99, default="")


def _inputs_of(node: PlanNode) -> dict[str, Any]:
    return node.inputs if isinstance(node.inputs, dict) else {}


def _consequences(
    leaves: list[PlanNode],
    by_key: Mapping[str, PlanNode],
    gated: PlanNode | None,
    tool_risks: Mapping[str, str],
) -> list[Consequence]:
    found = []
    for leaf in leaves:
        risk = _risk_of(leaf, tool_risks)
        if risk not in CONSEQUENTIAL and not (risk and risk not in RISK_ORDER):
            continue
        inputs = leaf.inputs if isinstance(leaf.inputs, dict) else {}
        found.append(
            Consequence(
                node=leaf,
                action=leaf.tool or f"{leaf.agent or 'a person'}: {leaf.task}",
                subjects=_subjects(leaf, by_key),
                risk=risk,
                inputs=[(str(name), shown_input(value, by_key)) for name, value in inputs.items()],
                is_this_gate=gated is not None and leaf.pk == gated.pk,
            )
        )
    return found


def _reason_label(code: str) -> str:
    """Return the label of reason code `code` (the code itself when it has none)."""
    if not code:
        return ""
    return ReasonCode.objects.filter(code=code).values_list("label", flat=True).first() or code


def _reject_codes() -> list[ReasonCode]:
    # JSON containment is not portable to SQLite: the list is short, filter it here.
    return [c for c in ReasonCode.objects.filter(active=True) if "reject" in (c.applies_to or [])]


def _changes_from_previous(version: PlanVersion) -> PlanDiff | None:
    """Return what changed from the version before `version`; None for a first version."""
    previous = PlanVersion.objects.filter(case_id=version.case_id, number=version.number - 1)
    before = previous.first() if version.number > 1 else None
    return diff_plans(load_plan(before), load_plan(version)) if before is not None else None


def _gate_context(
    request: HtmxHttpRequest,
    gate: Gate,
    *,
    errors: Mapping[str, str] | None = None,
    notice: str = "",
    posted: Mapping[str, str] | None = None,
) -> dict[str, object]:
    case = gate.case
    version = gate.version
    node = gate.node
    nodes = list(PlanNode.objects.filter(version=version).order_by("position"))
    by_key = {n.key: n for n in nodes if n.is_leaf}
    by_pk = {n.pk: n for n in nodes}
    leaves = [n for n in nodes if n.is_leaf]
    tool_risks = dict(
        Tool.objects.filter(name__in={n.tool for n in leaves if n.tool}).values_list("name", "risk")
    )
    url_for = _node_url(case.pk)
    parent = by_pk.get(node.parent_id) if node is not None and node.parent_id else None
    siblings = (
        [n for n in nodes if n.parent_id == node.parent_id and n.pk != node.pk]
        if node is not None
        else []
    )
    for sibling in siblings:
        sibling.url = url_for(sibling)  # type: ignore[attr-defined]
    # What the step acts on, as it is now: each upstream output once its step ran.
    upstream = [step_output(key, by_key.get(key)) for key in node.depends_on] if node else []
    inputs = node.inputs if node is not None and isinstance(node.inputs, dict) else {}
    why_not = can_decide(request.user, gate)  # type: ignore[arg-type]
    is_current = case.current_version_id == gate.version_id
    may_decide = why_not is None and gate.is_open and is_current
    decisions = list(gate.decisions.order_by("time", "id"))
    if any(d.reason_code for d in decisions):
        labels = dict(ReasonCode.objects.values_list("code", "label"))
        for d in decisions:
            d.reason_label = labels.get(d.reason_code, d.reason_code)  # type: ignore[attr-defined]
    return {
        "gate": gate,
        "case": case,
        "version": version,
        "node": node,
        "node_url": url_for(node) if node is not None else "",
        "parent": parent,
        "siblings": siblings,
        "inputs": [(str(k), shown_input(v, by_key)) for k, v in inputs.items()],
        "inputs_json": json.dumps(inputs, indent=2, ensure_ascii=False, sort_keys=True),
        "upstream": upstream,
        "output": step_output(node.key, node) if node is not None else None,
        "ran_count": sum(1 for leaf in leaves if leaf.attempts or leaf.output is not None),
        "provenance": node.provenance if node is not None else {},
        "dot": plan_dot(nodes, url_for=url_for, highlight=node.key if node else None)
        if nodes
        else "",
        "consequences": _consequences(leaves, by_key, node, tool_risks),
        "steps": [
            {
                "node": leaf,
                "risk": _risk_of(leaf, tool_risks),
                "inputs": [(str(k), shown_input(v, by_key)) for k, v in _inputs_of(leaf).items()],
            }
            for leaf in (leaves if node is None else [])
        ],
        "leaf_count": len(leaves),
        # A plan's llm steps this installation has no provider for: said before approval.
        "llm_steps": llm_steps((n.key, n.agent) for n in leaves) if node is None else None,
        # A step's reason is its one finding's detail: say it once, in the findings.
        "reason_in_findings": gate.reason
        in {f.get("detail") for f in gate.reasons or () if isinstance(f, dict)},
        "changes": _changes_from_previous(version),
        "edit_reason": _reason_label(version.edit.get("reason_code", ""))
        if isinstance(version.edit, dict)
        else "",
        "decisions": decisions,
        "is_current": is_current,
        "may_decide": may_decide,
        "why_not": why_not if gate.is_open and is_current else "",
        "meaning": signature_meaning(gate, by_key) if gate.needs_signature else "",
        **(_signing_at_provider(request, gate) if gate.needs_signature and may_decide else {}),
        "reject_codes": _reject_codes(),
        "errors": dict(errors or {}),
        "notice": notice,
        "posted": dict(posted or {}),
    }


def _signing_at_provider(request: HtmxHttpRequest, gate: Gate) -> dict[str, object]:
    """Say how a user whose password sign-in is off signs: a fresh sign-in at the provider."""
    user = request.user
    if not isinstance(user, User) or not is_password_sign_in_off(user):
        return {}
    back = reverse("oversight:gate-detail", args=[gate.pk])
    return {
        "sign_at_provider": True,
        "reauthenticated_at": oidc.reauthenticated_at(request, user),
        "reauthenticate_url": f"{reverse('accounts:oidc-sign-in')}?"
        + urlencode({"reauth": "1", "next": back}),
    }


@require_GET
def gate_detail(request: HtmxHttpRequest, gate_id: int) -> HttpResponse:
    """Show a gate: the plan with its step highlighted, why it is gated, what the plan would do,
    its decisions, and the controls to decide it when the user may.

    Raises Http404 when the gate's case is not the user's to read.
    """
    gate = _gate_for(request, gate_id)
    return render(request, "oversight/gate_detail.html", _gate_context(request, gate))


def _int_or_none(raw: str) -> int | None:
    raw = raw.strip()
    return int(raw) if raw.isdigit() and len(raw) < 12 else None


def _again(
    request: HtmxHttpRequest,
    gate_id: int,
    status: int,
    *,
    errors: Mapping[str, str] | None = None,
    notice: str = "",
) -> HttpResponse:
    gate = visible_gate(request.user, gate_id)  # as it is now, after whatever happened
    posted = {k: request.POST.get(k, "") for k in ("decision", "reason_code", "reason")}
    # The detail the officer opened stays open (and approval enabled) on the page they get back.
    posted["detail_opened"] = "1" if "1" in request.POST.getlist("detail_opened") else ""
    context = _gate_context(request, gate, errors=errors, notice=notice, posted=posted)
    return render(request, "oversight/gate_detail.html", context, status=status)


@require_POST
def gate_decide(request: HtmxHttpRequest, gate_id: int) -> HttpResponse:
    """Approve or reject a gate as the signed-in officer, binding what the page showed.

    Raises Http404 for a gate the user may not read and PermissionDenied (audited by
    `decide_gate`) for one they may not decide. A stale decision answers 409, a wrong signature
    password 403, a reason code that does not fit 422, each on the gate page with the reason.
    """
    gate = _gate_for(request, gate_id)
    user: User = request.user  # type: ignore[assignment]
    decision = request.POST.get("decision", "")
    opened = "1" in request.POST.getlist("detail_opened")
    if (
        decision == GateDecision.Decision.APPROVE
        and not opened
        and can_decide(user, gate) is None  # anyone else is refused (and audited) below
    ):
        return _again(
            request,
            gate_id,
            422,
            errors={
                "detail_opened": "Open and read the step detail before approving: "
                "the approval was not recorded."
            },
        )
    password = request.POST.get("password")
    at_provider = is_password_sign_in_off(user)
    data = DecisionInput(
        reauthenticated_at=oidc.reauthenticated_at(request, user) if at_provider else None,
        decision=decision,
        reason_code=request.POST.get("reason_code", ""),
        reason=request.POST.get("reason", "")[:5000],
        password=password if password else None,
        version=_int_or_none(request.POST.get("version", "")),
        content_hash=request.POST.get("content_hash", "").strip() or None,
        meaning=request.POST.get("meaning"),
    )
    try:
        decided = decide_gate(gate_id=gate.pk, user=user, decision=data)
    except Gate.DoesNotExist:
        raise Http404("No such gate") from None
    except SignatureRefused as exc:
        return _again(request, gate_id, 403, errors={"password": str(exc)})
    except DecisionDenied:
        raise
    except GateConflict as exc:
        return _again(
            request,
            gate_id,
            409,
            notice=f"Your decision was not recorded: {exc}. The page now shows the gate as it is.",
        )
    except ReasonInvalid as exc:
        return _again(request, gate_id, 422, errors={exc.field: exc.message})
    if at_provider and data.reauthenticated_at is not None and gate.needs_signature:
        oidc.take_reauthentication(request, user)  # one fresh sign-in, one signature
    verb = "approval" if decision == GateDecision.Decision.APPROVE else "rejection"
    messages.success(request, f"Your {verb} is recorded; the gate is {decided.status}.")
    return redirect("oversight:gate-detail", gate_id=gate.pk)


# A case's gates ----------------------------------------------------------------------------


@require_GET
def case_gates(request: HtmxHttpRequest, case_id: int) -> HttpResponse:
    """List the gates of a case's current plan version with their status, linking their pages.

    The case page loads it with htmx; without JavaScript its link opens it as a page. Raises
    Http404 when the case is not the user's to read.
    """
    try:
        case = case_for(request.user, case_id)
    except Http404:
        raise _not_found(request, "case", case_id) from None
    gates = list(
        Gate.objects.filter(case=case, version_id=case.current_version_id)
        .select_related("node")
        .order_by("kind", "id")
    )
    # Plan gate first, then steps and escalations in the order they opened.
    gates.sort(key=lambda g: (g.kind != GateKind.PLAN, g.pk))
    mine = {g.pk for g in inbox_for(request.user).filter(case=case)}
    context = {"case": case, "gates": gates, "mine": mine}
    return render_partial(request, "oversight/case_gates.html", context, partials={"case-gates"})


# Notifications -----------------------------------------------------------------------------


@require_GET
def notifications(request: HtmxHttpRequest) -> HttpResponse:
    """List the user's notifications, newest first."""
    user = cast(User, request.user)
    rows = Notification.objects.filter(user=user).order_by("-created_at", "-id")
    page = Paginator(rows, NOTIFICATIONS_PAGE_SIZE).get_page(request.GET.get("page"))
    unread = Notification.objects.filter(user=user, read_at__isnull=True).count()
    return render(request, "oversight/notification_list.html", {"page": page, "unread": unread})


@require_POST
def notification_read(request: HtmxHttpRequest, notification_id: int) -> HttpResponse:
    """Mark one of the user's notifications read; `open=1` then follows its link.

    Raises Http404 for a notification that is not the user's.
    """
    user = cast(User, request.user)
    notice = Notification.objects.filter(pk=notification_id, user=user).first()
    if notice is None:
        raise Http404("No such notification")
    mark_notifications_read(user=user, notification_ids=[notice.pk])
    safe = url_has_allowed_host_and_scheme(notice.url, allowed_hosts={request.get_host()})
    if request.POST.get("open") == "1" and notice.url and safe:
        return redirect(notice.url)
    return redirect("oversight:notifications")


@require_POST
def notifications_read_all(request: HtmxHttpRequest) -> HttpResponse:
    """Mark every notification of the user read."""
    count = mark_notifications_read(user=request.user)  # type: ignore[arg-type]
    messages.success(request, f"Marked {count} notification{'s' if count != 1 else ''} read.")
    return redirect("oversight:notifications")
