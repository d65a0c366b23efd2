"""Plan versions on pages: a case's version history, the diff of two versions, the edit form.

Who sees what is the API's rule: history and diffs for whoever may read the case (analysts their
own cases, officers and auditors all; 404 otherwise); the edit form for the officers
`edit_plan` would accept (403 otherwise). The edit itself is `oversight.actions.edits.edit_plan`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_http_methods

from oversight.actions.edits import (
    TASK_MAX_LENGTH,
    EditInvalid,
    EditRefused,
    can_edit,
    edit_plan,
)
from oversight.actions.gates import ReasonInvalid
from oversight.models import Gate, GateKind, ReasonCode
from planning.core.dag import DagPlan
from planning.core.diff import PlanDiff, diff_plans, node_data
from planning.models import Agent, Case, CaseStatus, PlanNode, PlanVersion
from planning.queries import case_for
from planning.versions import load_plan
from web.http import HtmxHttpRequest

MAX_VERSION = 2**31 - 1


# History -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VersionRow:
    version: PlanVersion
    origin: str
    reason_code: str
    reason: str
    gate: Gate | None
    is_current: bool


def _origin(version: PlanVersion) -> str:
    edit = version.edit if isinstance(version.edit, dict) else {}
    if edit.get("kind") == "replan":
        return f"re-plan after step {edit.get('node', '')} failed"
    if version.edited_by_id is None:
        return f"planned ({version.strategy})"
    assert version.edited_by is not None
    return f"edit by {version.edited_by.get_username()}"


def _editable_steps(case: Case) -> list[PlanNode]:
    if case.status != CaseStatus.AWAITING_APPROVAL or case.current_version_id is None:
        return []
    return list(
        PlanNode.objects.filter(
            version_id=case.current_version_id, kind=PlanNode.Kind.LEAF
        ).order_by("position")
    )


@require_GET
def version_history(request: HtmxHttpRequest, case_id: int) -> HttpResponse:
    """List every plan version of a case: who or what made it, why, its size, its plan gate.

    Raises Http404 when the case is not the user's to read.
    """
    case = case_for(request.user, case_id)
    versions = list(case.versions.select_related("edited_by").order_by("-number"))
    plan_gates: dict[int, Gate] = {}
    for gate in Gate.objects.filter(case=case, kind=GateKind.PLAN).order_by("opened_at", "id"):
        plan_gates[gate.version_id] = gate  # the latest of each version
    rows = [
        VersionRow(
            version=version,
            origin=_origin(version),
            reason_code=str((version.edit or {}).get("reason_code", "")),
            reason=str((version.edit or {}).get("reason", "")),
            gate=plan_gates.get(version.pk),
            is_current=version.pk == case.current_version_id,
        )
        for version in versions
    ]
    can_edit_plan = can_edit(request.user, case) is None  # type: ignore[arg-type]
    context = {
        "case": case,
        "rows": rows,
        "steps": _editable_steps(case) if can_edit_plan else [],
        "can_edit": can_edit_plan,
    }
    return render(request, "oversight/version_history.html", context)


# Diff ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldRow:
    field: str
    before: str
    after: str


@dataclass(frozen=True, slots=True)
class NodeRow:
    key: str
    summary: str
    fields: list[FieldRow] = field(default_factory=list)


def _shown(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _summary(plan: DagPlan, key: str) -> str:
    data = node_data(plan.node(key))
    if data["kind"] == "leaf":
        return f"{data['task']} · {data['agent']}" + (f" · {data['tool']}" if data["tool"] else "")
    return f"group: {data['name']}"


def _node_rows(plan: DagPlan, keys: tuple[str, ...]) -> list[NodeRow]:
    rows = []
    for key in keys:
        data = node_data(plan.node(key))
        shown = [FieldRow(name, "", _shown(value)) for name, value in data.items() if name != "key"]
        rows.append(NodeRow(key=key, summary=_summary(plan, key), fields=shown))
    return rows


@dataclass(frozen=True, slots=True)
class DiffView:
    old: PlanVersion
    new: PlanVersion
    diff: PlanDiff
    added: list[NodeRow]
    removed: list[NodeRow]
    changed: list[NodeRow]


def _diff_view(old: PlanVersion, new: PlanVersion) -> DiffView:
    old_plan, new_plan = load_plan(old), load_plan(new)
    diff = diff_plans(old_plan, new_plan)
    changed = [
        NodeRow(
            key=change.key,
            summary=_summary(new_plan, change.key),
            fields=[FieldRow(f.field, _shown(f.before), _shown(f.after)) for f in change.fields],
        )
        for change in diff.changed
    ]
    return DiffView(
        old=old,
        new=new,
        diff=diff,
        added=_node_rows(new_plan, diff.added),
        removed=_node_rows(old_plan, diff.removed),
        changed=changed,
    )


def _number(raw: str | None) -> int | None:
    raw = (raw or "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_VERSION:
        raise Http404("No such plan version")
    return int(raw)


@require_GET
def version_diff(request: HtmxHttpRequest, case_id: int) -> HttpResponse:
    """Show what changed between two plan versions (`from`, `to`; previous and current by default).

    Raises Http404 when the case is not the user's to read or has no such version.
    """
    case = case_for(request.user, case_id)
    versions = {v.number: v for v in case.versions.select_related("edited_by").order_by("number")}
    if not versions:
        raise Http404("The case has no plan yet")
    current = case.current_version.number if case.current_version is not None else max(versions)
    to = _number(request.GET.get("to")) or current
    start = _number(request.GET.get("from"))
    start = start if start is not None else to - 1
    if to not in versions or (start not in versions and start != 0):
        raise Http404("No such plan version")
    context: dict[str, Any] = {
        "case": case,
        "numbers": sorted(versions),
        "from_number": start,
        "to_number": to,
        "view": _diff_view(versions[start], versions[to]) if start in versions else None,
        "to_version": versions[to],
    }
    return render(request, "oversight/version_diff.html", context)


# Editing -------------------------------------------------------------------------------------


class PlanEditForm(forms.Form):
    """The fields of one step an officer may change, the reason, and the version they saw."""

    agent = forms.ChoiceField(label="Agent")
    task = forms.CharField(label="Task", widget=forms.Textarea(attrs={"rows": 3}))
    inputs = forms.CharField(
        label="Inputs (JSON object)",
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
    )
    depends_on = forms.MultipleChoiceField(
        label="Runs after",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="The sibling steps it waits for; with none ticked it starts without waiting.",
    )
    remove = forms.BooleanField(
        label="Remove this step from the plan", required=False, label_suffix=""
    )
    reason_code = forms.ChoiceField(label="Reason code", required=False)
    reason = forms.CharField(
        label="Reason", required=False, widget=forms.Textarea(attrs={"rows": 2})
    )
    base_version = forms.IntegerField(widget=forms.HiddenInput, min_value=1)

    def __init__(
        self,
        *args: Any,
        agents: list[tuple[str, str]],
        siblings: list[str],
        reasons: list[tuple[str, str]],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["agent"].choices = agents  # type: ignore[attr-defined]
        self.fields["depends_on"].choices = [(k, k) for k in siblings]  # type: ignore[attr-defined]
        self.fields["reason_code"].choices = [  # type: ignore[attr-defined]
            ("", "Choose a reason code"),
            *reasons,
        ]
        self.fields["task"].max_length = TASK_MAX_LENGTH  # type: ignore[attr-defined]

    def clean_inputs(self) -> dict[str, Any]:
        raw = (self.cleaned_data.get("inputs") or "").strip() or "{}"
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("Must be a JSON object.")
        return value


@dataclass(frozen=True, slots=True)
class EditTarget:
    case: Case
    version: PlanVersion
    node: PlanNode
    siblings: list[str]
    declared: list[str]


def _target(request: HtmxHttpRequest, case_id: int, node_id: int) -> EditTarget:
    case = case_for(request.user, case_id)
    if (why := can_edit(request.user, case)) is not None:  # type: ignore[arg-type]
        raise PermissionDenied(f"You may not edit this plan: {why}.")
    node = (
        PlanNode.objects.filter(pk=node_id, version__case=case, kind=PlanNode.Kind.LEAF)
        .select_related("version")
        .first()
    )
    if node is None:
        raise Http404("No such step")
    siblings = list(
        PlanNode.objects.filter(version=node.version, parent_id=node.parent_id)
        .exclude(pk=node.pk)
        .order_by("position")
        .values_list("key", "position")
    )
    if node.declared_depends_on is not None:
        declared = list(node.declared_depends_on)
    else:  # "after the previous sibling"
        earlier = [key for key, position in siblings if position < node.position]
        declared = earlier[-1:]
    return EditTarget(
        case=case,
        version=node.version,
        node=node,
        siblings=[key for key, _ in siblings],
        declared=declared,
    )


def _form(target: EditTarget, data: Any = None) -> PlanEditForm:
    agents = [
        (a.slug, f"{a.name} ({a.slug})")
        for a in Agent.objects.filter(enabled=True).order_by("slug")
    ]
    if target.node.agent not in {slug for slug, _ in agents}:
        agents.insert(0, (target.node.agent, f"{target.node.agent} (current; not enabled)"))
    reasons = [
        (r.code, f"{r.label} ({r.code})")
        for r in ReasonCode.objects.filter(active=True).order_by("code")
        if ReasonCode.AppliesTo.EDIT in r.applies_to
    ]
    initial = {
        "agent": target.node.agent,
        "task": target.node.task,
        "inputs": json.dumps(target.node.inputs, indent=2, sort_keys=True, ensure_ascii=False),
        "depends_on": target.declared,
        "base_version": target.version.number,
    }
    return PlanEditForm(
        data,
        initial=initial,
        agents=agents,
        siblings=[k for k in target.siblings if k != target.node.key],
        reasons=reasons,
    )


def _changes(form: PlanEditForm, target: EditTarget) -> dict[str, Any]:
    data = form.cleaned_data
    if data["remove"]:
        return {"remove": True}
    node = target.node
    changes: dict[str, Any] = {}
    if data["agent"] != node.agent:
        changes["agent"] = data["agent"]
    if data["task"].strip() != node.task.strip():
        changes["task"] = data["task"]
    if data["inputs"] != node.inputs:
        changes["inputs"] = data["inputs"]
    chosen = [k for k in target.siblings if k in set(data["depends_on"])]
    if set(chosen) != set(target.declared):
        changes["depends_on"] = chosen
    return changes


_FORM_FIELDS = {"agent", "task", "inputs", "depends_on", "remove", "reason_code", "reason"}


def _form_field(name: str) -> str | None:
    name = name.removeprefix("changes.").split(".", 1)[0]
    return name if name in _FORM_FIELDS else None


@require_http_methods(["GET", "POST"])
def plan_edit(request: HtmxHttpRequest, case_id: int, node_id: int) -> HttpResponse:
    """Show the form to edit one step of the current plan; on POST, apply it as a new version.

    Raises Http404 for a case the user may not read or a step not of it; PermissionDenied unless
    the user may edit the plan. An invalid edit shows the form again with the reason.
    """
    target = _target(request, case_id, node_id)
    is_current = target.version.pk == target.case.current_version_id
    editable = is_current and target.case.status == CaseStatus.AWAITING_APPROVAL
    notice = ""
    status = 200
    if not is_current:
        notice = "This step belongs to an earlier plan version: edit the current one instead."
    elif not editable:
        notice = f"The case is {target.case.get_status_display()}: its plan is no longer edited."
    if request.method == "POST" and editable:
        form = _form(target, request.POST)
        if form.is_valid():
            try:
                result = edit_plan(
                    case_id=target.case.pk,
                    user=request.user,  # type: ignore[arg-type]
                    node_key=target.node.key,
                    changes=_changes(form, target),
                    reason_code=form.cleaned_data["reason_code"],
                    reason=form.cleaned_data["reason"],
                    base_version=form.cleaned_data["base_version"],
                )
            except (EditInvalid, ReasonInvalid) as exc:
                form.add_error(_form_field(exc.field), exc.message)
                status = 422
            except EditRefused as exc:
                notice = str(exc)
                status = 409
            else:
                query = urlencode({"from": target.version.number, "to": result.version.number})
                url = reverse("oversight:version-diff", args=[target.case.pk])
                return redirect(f"{url}?{query}")
        else:
            status = 422
    else:
        form = _form(target)
    context = {
        "case": target.case,
        "version": target.version,
        "node": target.node,
        "form": form,
        "editable": editable,
        "notice": notice,
    }
    return render(request, "oversight/plan_edit.html", context, status=status)
