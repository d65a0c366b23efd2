"""Plan versions on pages: a case's version history, the diff of two versions, the edit form.

Who sees what is the API's rule: history and diffs for whoever may read the case (analysts their
own cases, officers and auditors all; 404 otherwise); the edit form for the officers
`edit_plan` would accept (403 otherwise). The edit itself is `oversight.actions.edits.edit_plan`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_http_methods

from oversight.actions.edit_words import sentence
from oversight.actions.edits import (
    KEY,
    TASK_MAX_LENGTH,
    EditInvalid,
    EditRefused,
    can_edit,
    edit_plan,
)
from oversight.actions.gates import ReasonInvalid
from oversight.models import Gate, GateKind, ReasonCode
from planning.catalogue import all_tool_specs
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


class StepForm(forms.Form):
    """What every step form asks: the task, the inputs, what it waits for, the reason, and the
    version the officer saw."""

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
    reason_code = forms.ChoiceField(label="Reason code", required=False)
    reason = forms.CharField(
        label="Reason", required=False, widget=forms.Textarea(attrs={"rows": 2})
    )
    base_version = forms.IntegerField(widget=forms.HiddenInput, min_value=1)

    def __init__(
        self,
        *args: Any,
        siblings: list[str],
        reasons: list[tuple[str, str]],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["depends_on"].choices = [(k, k) for k in siblings]  # type: ignore[attr-defined]
        self.fields["reason_code"].choices = [  # type: ignore[attr-defined]
            ("", "Choose a reason code"),
            *reasons,
        ]
        self.fields["task"].max_length = TASK_MAX_LENGTH  # type: ignore[attr-defined]

    def clean_inputs(self) -> dict[str, Any]:
        return _json_object(self.cleaned_data.get("inputs"))


class PlanEditForm(StepForm):
    """The fields of one step an officer may change, the reason, and the version they saw."""

    field_order = ("agent", "task", "inputs", "depends_on", "remove", "reason_code", "reason")

    agent = forms.ChoiceField(label="Agent")
    remove = forms.BooleanField(
        label="Remove this step from the plan", required=False, label_suffix=""
    )

    def __init__(self, *args: Any, agents: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["agent"].choices = agents  # type: ignore[attr-defined]


def _json_object(raw: str | None) -> dict[str, Any]:
    """Return the JSON object typed in a form; raise ValidationError saying where it breaks."""
    try:
        value = json.loads((raw or "").strip() or "{}")
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(
            f"Not valid JSON: {exc.msg[:1].lower()}{exc.msg[1:]} at line {exc.lineno}, "
            f"column {exc.colno}."
        ) from None
    if not isinstance(value, dict):
        raise forms.ValidationError('Must be a JSON object, in braces: {"name": value}.')
    return value


@dataclass(frozen=True, slots=True)
class EditTarget:
    case: Case
    version: PlanVersion
    node: PlanNode
    siblings: list[str]
    declared: list[str]
    group: list[str]  # the step and its siblings, in plan order


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
        group=[
            key for key, _ in sorted([*siblings, (node.key, node.position)], key=lambda r: r[1])
        ],
    )


def can_run(agent: Agent, tool: str | None) -> bool:
    """Tell whether an agent can run a step with this tool (None: a step with no tool).

    A tool step needs an agent allowed its tool; a step without one is an LLM's or a person's
    task (a tool agent only runs tools) — as the plan's validation has it.
    """
    if tool:
        return tool in (agent.tools or [])
    return agent.kind != Agent.Kind.TOOL


def _edit_reasons() -> list[tuple[str, str]]:
    return [
        (r.code, f"{r.label} ({r.code})")
        for r in ReasonCode.objects.filter(active=True).order_by("code")
        if ReasonCode.AppliesTo.EDIT in r.applies_to
    ]


def _form(target: EditTarget, data: Any = None) -> PlanEditForm:
    # Only the agents that can run this step: one that cannot would only be refused.
    agents = [
        (a.slug, f"{a.name} ({a.slug})")
        for a in Agent.objects.filter(enabled=True).order_by("slug")
        if can_run(a, target.node.tool or None)
    ]
    if target.node.agent not in {slug for slug, _ in agents}:
        enabled = Agent.objects.filter(slug=target.node.agent, enabled=True).exists()
        why = "cannot run this step" if enabled else "not enabled"
        agents.insert(0, (target.node.agent, f"{target.node.agent} (current; {why})"))
    reasons = _edit_reasons()
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


def _editable(target: EditTarget) -> tuple[bool, str]:
    """Tell whether the step's plan is edited now, and if not, why (a notice for the page)."""
    if target.version.pk != target.case.current_version_id:
        return False, "This step belongs to an earlier plan version: edit the current one instead."
    if target.case.status != CaseStatus.AWAITING_APPROVAL:
        return (
            False,
            f"The case is {target.case.get_status_display()}: its plan is no longer edited.",
        )
    return True, ""


def _apply(
    request: HtmxHttpRequest,
    target: EditTarget,
    form: StepForm,
    changes: dict[str, Any],
    field_of: Callable[[str], str | None],
) -> tuple[HttpResponse | None, str, int]:
    """Apply a valid step form as an edit: return the redirect to the diff, or no response, the
    notice and the status of a refusal (the reason put on the form's field)."""
    try:
        result = edit_plan(
            case_id=target.case.pk,
            user=request.user,  # type: ignore[arg-type]
            node_key=target.node.key,
            changes=changes,
            reason_code=form.cleaned_data["reason_code"],
            reason=form.cleaned_data["reason"],
            base_version=form.cleaned_data["base_version"],
        )
    except (EditInvalid, ReasonInvalid) as exc:
        form.add_error(field_of(exc.field), sentence(exc.message))
        return None, "", 422
    except EditRefused as exc:
        return None, sentence(str(exc)), 409
    query = urlencode({"from": target.version.number, "to": result.version.number})
    url = reverse("oversight:version-diff", args=[target.case.pk])
    return redirect(f"{url}?{query}"), "", 302


def _step_page(
    request: HtmxHttpRequest,
    template: str,
    target: EditTarget,
    form: StepForm,
    notice: str,
    status: int,
) -> HttpResponse:
    editable, why_not = _editable(target)
    context = {
        "case": target.case,
        "version": target.version,
        "node": target.node,
        "form": form,
        "editable": editable,
        "notice": notice or why_not,
    }
    return render(request, template, context, status=status)


@require_http_methods(["GET", "POST"])
def plan_edit(request: HtmxHttpRequest, case_id: int, node_id: int) -> HttpResponse:
    """Show the form to edit one step of the current plan; on POST, apply it as a new version.

    Raises Http404 for a case the user may not read or a step not of it; PermissionDenied unless
    the user may edit the plan. An invalid edit shows the form again with the reason.
    """
    target = _target(request, case_id, node_id)
    editable, notice = _editable(target)[0], ""
    status = 200
    if request.method == "POST" and editable:
        form = _form(target, request.POST)
        status = 422
        if form.is_valid():
            done, notice, status = _apply(
                request, target, form, _changes(form, target), _form_field
            )
            if done is not None:
                return done
    else:
        form = _form(target)
    return _step_page(request, "oversight/plan_edit.html", target, form, notice, status)


# Adding a step -------------------------------------------------------------------------------


class AddStepForm(StepForm):
    """A new step after the one the officer picked: its key, who runs it with what, its task and
    inputs, what it waits for, and the reason."""

    field_order = ("key", "runner", "task", "inputs", "depends_on", "reason_code", "reason")

    key = forms.CharField(
        label="Key",
        max_length=100,
        help_text="A name for the step, unique in the plan: lower-case letters, digits, hyphens.",
    )
    runner = forms.ChoiceField(
        label="Agent and tool",
        help_text="Only the agents that can run a step: each with a tool it is allowed, or an "
        "LLM or a person acting on the task.",
    )

    def __init__(self, *args: Any, runners: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["runner"].choices = [("", "Choose who runs it"), *runners]  # type: ignore[attr-defined]
        self.fields[
            "inputs"
        ].help_text = (
            'The tool\'s inputs; {"$ref": "step-key"} takes the output of an earlier step.'
        )

    def clean_key(self) -> str:
        key = self.cleaned_data["key"].strip()
        if not KEY.match(key):
            raise forms.ValidationError(
                "Use lower-case letters, digits and hyphens, starting with a letter or digit."
            )
        return key

    def step(self) -> dict[str, Any]:
        """Return the new step as `edit_plan` takes it (call after is_valid)."""
        data = self.cleaned_data
        agent, _, tool = data["runner"].partition(":")
        return {
            "key": data["key"],
            "agent": agent,
            "tool": tool or None,
            "task": data["task"],
            "inputs": data["inputs"],
            "depends_on": list(data["depends_on"]),
        }


def _runners(case: Case) -> list[tuple[str, str]]:
    """Return who can run a new step of the case, as `agent:tool` choices (`agent:` without
    one): each enabled agent of the case's pack (or of none) with each tool it is allowed."""
    tools = all_tool_specs()
    choices = []
    agents = Agent.objects.filter(enabled=True).select_related("pack").order_by("slug")
    for agent in agents:
        if agent.pack is not None and agent.pack.slug != case.domain:
            continue
        for tool in sorted(t for t in agent.tools or [] if t in tools):
            choices.append((f"{agent.slug}:{tool}", f"{agent.name} ({agent.slug}) with {tool}"))
        if can_run(agent, None):
            kind = "an LLM" if agent.kind == Agent.Kind.LLM else "a person"
            choices.append((f"{agent.slug}:", f"{agent.name} ({agent.slug}), {kind}, no tool"))
    return choices


_ADD_FIELDS = {"key", "agent", "tool", "task", "inputs", "depends_on"}


def _add_form_field(name: str) -> str | None:
    """Return the add form's field an action's error names (`changes.add.agent` → runner)."""
    if name in ("reason_code", "reason"):
        return name
    field = name.removeprefix("changes.add.").split(".", 1)[0]
    if field not in _ADD_FIELDS:
        return None
    return "runner" if field in ("agent", "tool") else field


@require_http_methods(["GET", "POST"])
def plan_add_step(request: HtmxHttpRequest, case_id: int, node_id: int) -> HttpResponse:
    """Show the form to add a step after one step of the current plan; on POST, add it as a
    new version.

    Raises Http404 for a case the user may not read or a step not of it; PermissionDenied unless
    the user may edit the plan. An invalid step shows the form again with the reasons.
    """
    target = _target(request, case_id, node_id)
    editable, notice = _editable(target)[0], ""
    status = 200
    form = AddStepForm(
        request.POST if request.method == "POST" and editable else None,
        initial={"depends_on": [target.node.key], "base_version": target.version.number},
        runners=_runners(target.case),
        siblings=target.group,
        reasons=_edit_reasons(),
    )
    if request.method == "POST" and editable:
        status = 422
        if form.is_valid():
            changes = {"add": form.step()}
            done, notice, status = _apply(request, target, form, changes, _add_form_field)
            if done is not None:
                return done
    return _step_page(request, "oversight/plan_add_step.html", target, form, notice, status)
