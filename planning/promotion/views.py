"""Promoted-method pages: propose a node as a method, the methods of each pack, one method with
approve, reject and retire. Officers and admins act; auditors read; everyone else is refused.

Everything a method shows came from an LLM or a person (tasks, rationales, descriptions, the
reason of a rejection): templates escape it all and nothing here marks text safe.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from planning.catalogue import registered_packs
from planning.display import pretty_json, provenance_text
from planning.models import Case, PlanNode, PromotedMethod
from planning.models import DomainPack as DomainPackRow
from planning.promotion.actions import (
    NotPromotable,
    PromotionConflict,
    PromotionDenied,
    approve_method,
    can_promote,
    can_view_methods,
    distinguishing_inputs,
    proposal_for,
    propose_method,
    reject_method,
    retire_method,
    suggested_name,
)
from planning.promotion.methods import MethodInvalid, parse_guard, parse_source
from web.http import HtmxHttpRequest

OPS = (
    ("", "not a condition"),
    ("equals", "equals"),
    ("one-of", "is one of"),
    ("present", "is given"),
)


def _require_promoter(request: HtmxHttpRequest) -> None:
    if not can_promote(request.user):
        raise PermissionDenied("Only compliance officers and admins promote methods.")


def _require_reader(request: HtmxHttpRequest) -> None:
    if not can_view_methods(request.user):
        raise PermissionDenied("Only compliance officers, auditors and admins read methods.")


# Proposing ---------------------------------------------------------------------------------


def _plain(value: Any) -> str:
    return value if isinstance(value, str) else pretty_json(value)


def _condition_rows(case: Case, data: Any | None) -> list[dict[str, Any]]:
    """Return one row per case input: its value and the operator chosen (or suggested)."""
    ticked = distinguishing_inputs(case)
    rows = []
    for key, value in case.inputs.items():
        if data is None:
            op = "equals" if key in ticked else ""
            values = ""
        else:
            op = str(data.get(f"op-{key}", ""))
            values = str(data.get(f"values-{key}", ""))
        rows.append(
            {"key": key, "value": _plain(value), "op": op, "values": values, "field": f"op-{key}"}
        )
    return rows


def _guard_from(case: Case, data: Any) -> list[dict[str, Any]]:
    """Return the guard the form asks for: a condition for each input given an operator."""
    guard: list[dict[str, Any]] = []
    for key, value in case.inputs.items():
        op = str(data.get(f"op-{key}", ""))
        if not op:
            continue
        if op == "equals":
            guard.append({"key": key, "op": op, "value": value})
        elif op == "present":
            guard.append({"key": key, "op": op})
        elif op == "one-of":
            values = [v.strip() for v in str(data.get(f"values-{key}", "")).split(",") if v.strip()]
            guard.append({"key": key, "op": op, "value": values})
        else:
            raise MethodInvalid(f"Unknown operator {op!r} for {key}.")
    return guard


@require_http_methods(["GET", "POST"])
def node_promote(request: HtmxHttpRequest, case_id: int, node_id: int) -> HttpResponse:
    """Show the proposal form for a node (its guard, subtasks and agents), and propose it.

    Raises PermissionDenied unless the user is an officer or admin, Http404 for no such node.
    """
    _require_promoter(request)
    try:
        node = PlanNode.objects.select_related("version__case__submitter").get(
            pk=node_id, version__case_id=case_id
        )
    except PlanNode.DoesNotExist:
        raise Http404("No such step in this case") from None
    case = node.version.case
    status = 200
    refusal = ""
    error = ""
    proposal = None
    try:
        proposal = proposal_for(case, node)
    except NotPromotable as exc:
        refusal = str(exc)
        status = 409 if request.method == "POST" else 200
    name = suggested_name(case, node)
    data = request.POST if request.method == "POST" else None
    if request.method == "POST" and proposal is not None:
        name = str(request.POST.get("name", ""))
        try:
            method = propose_method(
                user=request.user,
                case_id=case.pk,
                node_id=node.pk,
                name=name,
                guard=_guard_from(case, request.POST),
            )
        except NotPromotable as exc:
            refusal, status = str(exc), 409
        except PromotionConflict as exc:
            error, status = str(exc), 409
        except MethodInvalid as exc:
            error, status = str(exc), 422
        except PromotionDenied as exc:
            raise PermissionDenied(str(exc)) from exc
        else:
            return redirect("planning:method-detail", method_id=method.pk)
    context = {
        "case": case,
        "node": node,
        "proposal": proposal,
        "subtree": proposal.subtree if proposal else [],
        "refusal": refusal,
        "error": error,
        "name": name,
        "conditions": _condition_rows(case, data),
        "ops": OPS,
    }
    return render(request, "planning/method_promote.html", context, status=status)


# Reading -------------------------------------------------------------------------------------


@require_http_methods(["GET"])
def method_list(request: HtmxHttpRequest) -> HttpResponse:
    """List each enabled pack's methods: its code methods, then the promoted ones, every version.

    Raises PermissionDenied unless the user is an officer, auditor or admin.
    """
    _require_reader(request)
    packs = registered_packs()
    rows = list(DomainPackRow.objects.filter(slug__in=list(packs)).order_by("name"))
    chosen = str(request.GET.get("pack", ""))
    if chosen not in {row.slug for row in rows}:
        chosen = ""
    promoted = PromotedMethod.objects.select_related(
        "proposed_by", "approved_by", "rejected_by", "retired_by"
    ).order_by("pack", "task", "name", "-version")
    if chosen:
        promoted = promoted.filter(pack=chosen)
    by_pack: dict[str, list[PromotedMethod]] = {}
    for method in promoted:
        by_pack.setdefault(method.pack, []).append(method)
    sections = [
        {
            "row": row,
            "code": [
                {"name": m.name, "task": m.task, "description": m.description}
                for m in packs[row.slug].methods
            ],
            "promoted": by_pack.get(row.slug, []),
        }
        for row in rows
        if not chosen or row.slug == chosen
    ]
    context = {"sections": sections, "chosen": chosen, "packs": rows}
    return render(request, "planning/method_list.html", context)


def _method(method_id: int) -> PromotedMethod:
    try:
        return PromotedMethod.objects.select_related(
            "source_case", "source_node", "proposed_by", "approved_by", "rejected_by", "retired_by"
        ).get(pk=method_id)
    except PromotedMethod.DoesNotExist:
        raise Http404("No such method") from None


def _guard_text(method: PromotedMethod) -> list[str]:
    try:
        return [condition.describe() for condition in parse_guard(method.guard)]
    except MethodInvalid as exc:
        return [str(exc)]


def _detail(
    request: HtmxHttpRequest, method: PromotedMethod, *, error: str = "", status: int = 200
) -> HttpResponse:
    user = request.user
    may_act = can_promote(user)
    is_proposed = method.status == PromotedMethod.Status.PROPOSED
    context = {
        "method": method,
        "guard": _guard_text(method),
        "subtree": method.subtree if isinstance(method.subtree, list) else [],
        "error": error,
        "may_approve": may_act
        and is_proposed
        and method.proposed_by_id != user.pk
        and method.source_case.submitter_id != user.pk,
        "own_proposal": is_proposed and method.proposed_by_id == user.pk,
        "may_reject": may_act and is_proposed,
        "may_retire": may_act and method.status == PromotedMethod.Status.ACTIVE,
    }
    return render(request, "planning/method_detail.html", context, status=status)


@require_http_methods(["GET"])
def method_detail(request: HtmxHttpRequest, method_id: int) -> HttpResponse:
    """Show one promoted method: guard, subtree, source case, who proposed and approved it.

    Raises PermissionDenied unless the user is an officer, auditor or admin; Http404.
    """
    _require_reader(request)
    return _detail(request, _method(method_id))


def _act(request: HtmxHttpRequest, method_id: int, step: str) -> HttpResponse:
    _require_promoter(request)
    method = _method(method_id)
    reason = str(request.POST.get("reason", ""))
    try:
        if step == "approve":
            approve_method(user=request.user, method_id=method.pk)
        elif step == "reject":
            reject_method(user=request.user, method_id=method.pk, reason=reason)
        else:
            retire_method(user=request.user, method_id=method.pk, reason=reason)
    except PromotionDenied as exc:
        return _detail(request, method, error=str(exc), status=403)
    except PromotionConflict as exc:
        return _detail(request, method, error=str(exc), status=409)
    except MethodInvalid as exc:
        return _detail(request, method, error=str(exc), status=422)
    return redirect("planning:method-detail", method_id=method.pk)


@require_POST
def method_approve(request: HtmxHttpRequest, method_id: int) -> HttpResponse:
    """Approve a proposed method as a second person. Raises PermissionDenied, Http404."""
    return _act(request, method_id, "approve")


@require_POST
def method_reject(request: HtmxHttpRequest, method_id: int) -> HttpResponse:
    """Reject a proposed method with a reason. Raises PermissionDenied, Http404."""
    return _act(request, method_id, "reject")


@require_POST
def method_retire(request: HtmxHttpRequest, method_id: int) -> HttpResponse:
    """Retire an active method with a reason. Raises PermissionDenied, Http404."""
    return _act(request, method_id, "retire")


# On the case page ----------------------------------------------------------------------------


def promoted_origins(sources: set[str]) -> list[PromotedMethod]:
    """Return the promoted methods named by these provenance sources (one query, none if no
    source is a promoted method's)."""
    wanted = [parsed for source in sorted(sources) if (parsed := parse_source(source))]
    if not wanted:
        return []
    match = Q()
    for name, version in wanted:
        match |= Q(name=name, version=version)
    return list(PromotedMethod.objects.filter(match).order_by("name", "version"))


def node_promotion(user: Any, case: Case, node: PlanNode) -> dict[str, Any]:
    """Return what the step panel adds: the promoted method the node came from, and the link to
    promote the node where the user may and the node is eligible."""
    source = node.provenance.get("source", "") if isinstance(node.provenance, dict) else ""
    origins = promoted_origins({str(source)})
    promote_url = ""
    if not node.is_leaf and can_promote(user):
        try:
            proposal_for(case, node)
        except NotPromotable:
            pass
        else:
            promote_url = reverse(
                "planning:node-promote", kwargs={"case_id": case.pk, "node_id": node.pk}
            )
    return {
        "provenance_text": provenance_text(node.provenance),
        "promoted_origin": origins[0] if origins else None,
        "promote_url": promote_url,
    }
