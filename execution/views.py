"""Execution pages: a case's work items and its cancel form, the work item list and form, and the
admins' global stop switch.

The state changes are `execution.actions`'s (each audits itself); these views check who
may see what, read the form and show the outcome.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST
from pydantic import BaseModel

from accounts.roles import ADMIN, OFFICER, SUPERVISOR
from execution import actions as execution
from execution.common import LeafError
from execution.models import ExecutionControl, WorkItem
from execution.queries import work_items_for
from oversight.actions.gates import ReasonInvalid
from oversight.models import ReasonCode
from oversight.queries import upstream_outputs_of
from planning.budgets import LedgerBudgets, case_limits
from planning.catalogue import registered_packs
from planning.display import pretty_json, value_rows
from planning.models import Case, CaseStatus, PlanNode
from planning.queries import case_for, visible_cases
from web.http import HtmxHttpRequest, render_partial

WORK_ITEMS_PAGE_SIZE = 25
# Where the output of a step that takes plain text keeps it.
TEXT_OUTPUT = "text"
ENDED = (
    CaseStatus.COMPLETED,
    CaseStatus.FAILED,
    CaseStatus.CANCELLED,
    CaseStatus.REJECTED,
    CaseStatus.PLAN_FAILED,
)
# What an empty output form starts with, by JSON schema type (a person fills in the values).
BLANKS: dict[str, Any] = {
    "string": "",
    "integer": 0,
    "number": 0,
    "boolean": False,
    "array": [],
    "object": {},
}


def _user(request: HtmxHttpRequest) -> User:
    return cast(User, request.user)


def _in_groups(user: User, *names: str) -> bool:
    return user.groups.filter(name__in=names).exists()


# A case's execution --------------------------------------------------------------------------


def _may_cancel(user: User, case: Case) -> bool:
    """Tell whether the form to cancel shows (the action checks again and decides)."""
    if case.status in ENDED:
        return False
    return case.submitter_id == user.pk or _in_groups(user, OFFICER, SUPERVISOR, ADMIN)


def _cancel_codes() -> list[ReasonCode]:
    # JSON containment is not portable to SQLite: the list is short, filter it here.
    return [c for c in ReasonCode.objects.filter(active=True) if "cancel" in (c.applies_to or [])]


def _execution_context(
    request: HtmxHttpRequest,
    case: Case,
    *,
    errors: Mapping[str, str] | None = None,
    posted: Mapping[str, str] | None = None,
    notice: str = "",
) -> dict[str, object]:
    user = _user(request)
    items = list(
        WorkItem.objects.filter(case=case, node__version_id=case.current_version_id)
        .select_related("node", "group", "completed_by")
        .order_by("status", "deadline", "id")
    )
    mine = set(work_items_for(user).filter(case=case).values_list("pk", flat=True))
    may_cancel = _may_cancel(user, case)
    # The case's LLM use against its budget, only where a per-case budget is set (two queries).
    llm_budget = LedgerBudgets().case_status(case.pk) if case_limits().is_set else None
    return {
        "case": case,
        "llm_budget": llm_budget,
        "items": items,
        "open_items": [item for item in items if item.status == WorkItem.Status.OPEN],
        "mine": mine,
        "may_cancel": may_cancel,
        "cancel_codes": _cancel_codes() if may_cancel else [],
        "errors": dict(errors or {}),
        "posted": dict(posted or {}),
        "notice": notice,
    }


@require_GET
def case_execution(request: HtmxHttpRequest, case_id: int) -> HttpResponse:
    """Show a case's work items and, for those who may, the form to cancel it.

    The case page loads it with htmx; without JavaScript its link opens it as a page. Raises
    Http404 when the case is not the user's to read.
    """
    case = case_for(request.user, case_id)
    return render_partial(
        request,
        "execution/case_execution.html",
        _execution_context(request, case),
        partials={"case-execution"},
    )


@require_POST
def case_cancel(request: HtmxHttpRequest, case_id: int) -> HttpResponse:
    """Cancel a case with a reason code; back to the case page, which shows it cancelled.

    Raises Http404 for a case the user may not read and PermissionDenied for one they may not
    cancel. A missing reason code answers 422 and a case that already ended 409, each on the
    case's execution page with the reason.
    """
    case = case_for(request.user, case_id)
    posted = {k: request.POST.get(k, "")[:5000] for k in ("reason_code", "reason")}
    try:
        execution.cancel_case(
            case_id=case.pk,
            user=_user(request),
            reason_code=posted["reason_code"],
            reason=posted["reason"],
        )
    except ReasonInvalid as exc:
        context = _execution_context(request, case, errors={exc.field: exc.message}, posted=posted)
        return render(request, "execution/case_execution.html", context, status=422)
    except execution.CaseNotRunning as exc:
        case.refresh_from_db()
        context = _execution_context(
            request, case, notice=f"The case was not cancelled: {exc}.", posted=posted
        )
        return render(request, "execution/case_execution.html", context, status=409)
    messages.success(
        request,
        "The case is cancelled: nothing new starts, and running steps stop at their next safe "
        "point.",
    )
    return redirect("planning:case-detail", case_id=case.pk)


# Work items ---------------------------------------------------------------------------------


@require_GET
def work_item_list(request: HtmxHttpRequest) -> HttpResponse:
    """List the open work items of the user's groups (and those escalated to them), soonest
    deadline first: the overdue ones lead."""
    items = (
        work_items_for(request.user)
        .filter(status=WorkItem.Status.OPEN)
        .select_related("case", "node", "group", "escalation_group")
        .order_by("deadline", "id")
    )
    page = Paginator(items, WORK_ITEMS_PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "execution/work_item_list.html", {"page": page})


def _item_for(request: HtmxHttpRequest, item_id: int) -> WorkItem:
    item = (
        work_items_for(request.user)
        .select_related("case", "node", "group", "escalation_group", "completed_by")
        .filter(pk=item_id)
        .first()
    )
    if item is None:
        raise Http404("No such work item")
    return item


def _output_model(name: str) -> type[BaseModel] | None:
    """Return the pydantic model a step's expected output names (as the runner checks it)."""
    for pack in registered_packs().values():
        for tool in pack.tools:
            for model in (tool.output_model, tool.input_model):
                if model.__name__ == name:
                    return model
    return None


def _expected(name: str) -> tuple[list[dict[str, str]], str]:
    """Return the expected output's fields (name, type, required, help) and a blank to fill in."""
    model = _output_model(name) if name else None
    if model is None:
        return [], "{\n  \n}"
    schema = model.model_json_schema()
    required = set(schema.get("required", []))
    fields = []
    blank: dict[str, Any] = {}
    for field, spec in schema.get("properties", {}).items():
        if "enum" in spec:
            kind = "one of " + ", ".join(map(str, spec["enum"]))
        elif "anyOf" in spec:
            kind = " or ".join(str(option.get("type", "object")) for option in spec["anyOf"])
        else:
            kind = str(spec.get("type", "object"))
        fields.append(
            {
                "name": field,
                "type": kind,
                "required": "required" if field in required else "optional",
                "help": str(spec.get("description") or spec.get("title") or ""),
            }
        )
        blank[field] = "" if "enum" in spec else BLANKS.get(str(spec.get("type")), {})
    return fields, pretty_json(blank)


def _takes_text(node: PlanNode) -> bool:
    """Return True when the step names no output schema: a person writes plain text then."""
    return not node.expected_output


def _item_context(
    request: HtmxHttpRequest,
    item: WorkItem,
    *,
    output_text: str | None = None,
    errors: Mapping[str, str] | None = None,
    notice: str = "",
) -> dict[str, object]:
    node = item.node
    upstream = upstream_outputs_of([node])[node.pk]
    takes_text = _takes_text(node)
    fields, blank = ([], "") if takes_text else _expected(node.expected_output)
    inputs = node.inputs if isinstance(node.inputs, dict) else {}
    return {
        "item": item,
        "case": item.case,
        "node": node,
        "case_visible": visible_cases(request.user).filter(pk=item.case_id).exists(),
        "input_rows": value_rows(inputs) if inputs else [],
        "upstream": [(key, value_rows(output)) for key, output in upstream.items()],
        "expected_fields": fields,
        "takes_text": takes_text,
        "output_text": blank if output_text is None else output_text,
        "output_rows": value_rows(item.output) if item.output is not None else [],
        "is_open": item.status == WorkItem.Status.OPEN,
        "errors": dict(errors or {}),
        "notice": notice,
    }


@require_GET
def work_item_detail(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    """Show a work item: the task, its inputs, the outputs upstream, and the form for its output.

    Raises Http404 for an item that is not for the user's groups (or of a case they submitted).
    """
    item = _item_for(request, item_id)
    return render(request, "execution/work_item_detail.html", _item_context(request, item))


def _parse_output(text: str, *, takes_text: bool) -> tuple[dict[str, Any] | None, str]:
    """Return the posted output as a JSON object, or None and what is wrong with it.

    A step that takes text keeps it, as it was typed, under `text`.
    """
    if takes_text:
        if not text.strip():
            return None, "Write your output: the step is done once it is recorded."
        return {TEXT_OUTPUT: text}, ""
    if not text.strip():
        return None, 'Enter the output as a JSON object, e.g. {"decision": "hold"}.'
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"This is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})."
    if not isinstance(value, dict):
        return None, "The output must be a JSON object ({…}), not a list or a single value."
    return value, ""


@require_POST
def work_item_complete(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    """Complete a work item with the posted output; its step succeeds and the case goes on.

    Raises Http404 for an item that is not for the user's groups. A step that names no output
    schema takes plain text; for one that does, output that is not a JSON object, or does not
    fit the expected output, answers 422 with the text kept and the problem next to the field.
    An item that is no longer open answers 409.
    """
    item = _item_for(request, item_id)
    text = request.POST.get("output", "")[:100_000]
    output, problem = _parse_output(text, takes_text=_takes_text(item.node))
    if output is None:
        context = _item_context(request, item, output_text=text, errors={"output": problem})
        return render(request, "execution/work_item_detail.html", context, status=422)
    try:
        execution.complete_work_item(item_id=item.pk, user=_user(request), output=output)
    except LeafError as exc:
        if exc.error_class != execution.ErrorClass.OUTPUT_INVALID:
            raise
        context = _item_context(request, item, output_text=text, errors={"output": str(exc)})
        return render(request, "execution/work_item_detail.html", context, status=422)
    except (execution.WorkItemConflict, execution.StaleResult) as exc:
        item = _item_for(request, item_id)
        context = _item_context(
            request,
            item,
            output_text=text,
            notice=f"Your output was not recorded: {exc}. The page now shows the item as it is.",
        )
        return render(request, "execution/work_item_detail.html", context, status=409)
    messages.success(request, f"Step {item.node.key} is done: your output is recorded.")
    return redirect("execution:work-item-list")


# The stop switch ------------------------------------------------------------------------------


def _require_admin(request: HtmxHttpRequest) -> None:
    if not _in_groups(_user(request), ADMIN):
        raise PermissionDenied("Only admins stop and resume execution.")


def _control_context(
    *, errors: Mapping[str, str] | None = None, reason: str = ""
) -> dict[str, object]:
    control = ExecutionControl.objects.select_related("changed_by").filter(pk=1).first()
    return {
        "control": control,
        "errors": dict(errors or {}),
        "reason": reason,
        "llm_today": LedgerBudgets().day_status(),
        "llm_case_limits": case_limits(),
        # The page states the switch itself: the site-wide banner would say it again.
        "is_control_page": True,
    }


@require_GET
def execution_control(request: HtmxHttpRequest) -> HttpResponse:
    """Show the global stop switch and the form to turn it (admins).

    Raises PermissionDenied for anyone but an admin.
    """
    _require_admin(request)
    return render(request, "execution/execution_control.html", _control_context())


@require_POST
def execution_control_set(request: HtmxHttpRequest) -> HttpResponse:
    """Stop or resume execution everywhere with a reason (admins; stopping needs a reason).

    Raises PermissionDenied for anyone but an admin; a stop without a reason answers 422.
    """
    _require_admin(request)
    action = request.POST.get("action", "")
    reason = request.POST.get("reason", "")[:5000].strip()
    if action not in {"stop", "resume"}:
        context = _control_context(errors={"action": "Choose stop or resume."}, reason=reason)
        return render(request, "execution/execution_control.html", context, status=422)
    if action == "stop" and not reason:
        context = _control_context(errors={"reason": "Say why execution stops."}, reason=reason)
        return render(request, "execution/execution_control.html", context, status=422)
    execution.set_stopped(stopped=action == "stop", user=_user(request), reason=reason)
    if action == "stop":
        messages.success(request, "Stop switch turned on.")
    else:
        messages.success(request, "Stop switch turned off.")
    return redirect("execution:execution-control")
