"""Execution in the JSON API: the agents with their learned trust, cancel a case, the global stop
switch, and human work items.

Every command goes through `execution.actions`, which checks it again and audits it.
Who sees which work items is decided in the query (`execution.queries.work_items_for`): the
items of the user's groups, and those escalated to them past their deadline, except those of
cases they submitted; any other item is a 404.
"""

# No `from __future__ import annotations`: ninja reads the endpoint annotations at runtime.

from datetime import datetime
from typing import Any, Literal

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.http import Http404, HttpRequest
from ninja import Field, Query, Router, Schema, Status
from ninja.errors import HttpError
from ninja.pagination import paginate
from pydantic import ConfigDict

from accounts.roles import ADMIN
from execution import actions as execution
from execution.common import LeafError
from execution.models import ExecutionControl, WorkItem
from execution.queries import work_items_for
from oversight.queries import upstream_outputs_of
from planning import rules
from planning.api import (
    PAGE_DEFAULT_LIMIT,
    PAGE_MAX_LIMIT,
    PAGE_MAX_OFFSET,
    CaseOut,
    Message,
    Page,
    ValidationMessage,
    request_user,
)
from planning.models import Agent, Case
from planning.queries import case_for

# Ids beyond a signed 64-bit integer cannot name a row; refused before they reach the database.
MAX_ID = 2**63 - 1
REASON_MAX_LENGTH = rules.DESCRIPTION_MAX_LENGTH

router = Router(tags=["execution"])


# Schemas ------------------------------------------------------------------------------------


class AgentOut(Schema):
    slug: str
    name: str
    description: str
    kind: Literal["tool", "llm", "human"]
    capabilities: list[str]
    trust: float = Field(
        description="The trust routing uses now: the starting trust moved by the agent's "
        "outcomes (its own failures lower it, older outcomes count less), the lowest over its "
        "capabilities. Equal to `starting_trust` until the agent has outcomes."
    )
    starting_trust: float = Field(
        description="The trust an admin configured: where the learned trust starts."
    )
    enabled: bool

    @staticmethod
    def resolve_trust(agent: Agent) -> float:
        # The agent's scores come prefetched with the page: no query per agent.
        return execution.effective_trust(agent, list(agent.capabilities), list(agent.scores.all()))

    @staticmethod
    def resolve_starting_trust(agent: Agent) -> float:
        return agent.trust


class CancelIn(Schema):
    model_config = ConfigDict(extra="forbid")

    reason_code: str = Field(max_length=50, description="A reason code that applies to cancel.")
    reason: str = Field("", max_length=REASON_MAX_LENGTH)


class ControlOut(Schema):
    stopped: bool
    reason: str = Field("", description="Why the switch was last turned on or off.")
    changed_by: str | None = Field(None, description="The admin who last turned it.")
    changed_at: datetime | None = None


class StopIn(Schema):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=REASON_MAX_LENGTH, description="Required.")


class ResumeIn(Schema):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field("", max_length=REASON_MAX_LENGTH)


class WorkItemOut(Schema):
    id: int
    case: int
    case_title: str
    node: str = Field(description="The key of the human step.")
    node_id: int
    task: str
    inputs: dict[str, Any]
    upstream_outputs: dict[str, Any] = Field(
        description="The outputs of the succeeded steps upstream of this one, by step key."
    )
    expected_output: str | None = Field(
        None, description="The schema the output must fit; without one, any JSON object."
    )
    group: str = Field(description="The group whose members may complete it.")
    status: WorkItem.Status
    created_at: datetime
    deadline: datetime
    overdue: bool = Field(description="Open past its deadline.")
    reminded_at: datetime | None = Field(
        None, description="When the group was reminded, half-way to the deadline."
    )
    escalated_at: datetime | None = Field(
        None,
        description="When it escalated at its deadline; from then on `escalation_group` may "
        "complete it too.",
    )
    escalation_group: str | None = Field(
        None, description="The group it escalated to (the policy's escalation group), once it did."
    )
    completed_by: str | None = None
    completed_at: datetime | None = None
    output: dict[str, Any] | None = None


class WorkItemPage(Schema):
    items: list[WorkItemOut]
    count: int


class WorkItemFilters(Schema):
    status: WorkItem.Status | None = Field(None, description="Without it, every status is listed.")
    limit: int = Field(PAGE_DEFAULT_LIMIT, ge=1, le=PAGE_MAX_LIMIT)
    offset: int = Field(0, ge=0, le=PAGE_MAX_OFFSET)


class CompleteIn(Schema):
    model_config = ConfigDict(extra="forbid")

    output: dict[str, Any] = Field(description="Checked against the step's expected output.")


# Helpers ------------------------------------------------------------------------------------


def is_admin(user: User) -> bool:
    """Tell whether the user is in the admin role group (the stop switch is theirs)."""
    return user.groups.filter(name=ADMIN).exists()


def _require_admin(user: User) -> None:
    if not is_admin(user):
        raise HttpError(403, "Only admins may stop or resume execution.")


def _control() -> ControlOut:
    control = ExecutionControl.objects.select_related("changed_by").filter(pk=1).first()
    if control is None:
        return ControlOut(stopped=False, reason="", changed_by=None, changed_at=None)
    return ControlOut(
        stopped=control.stopped,
        reason=control.reason,
        changed_by=control.changed_by.get_username() if control.changed_by else None,
        changed_at=control.changed_at,
    )


def _items(user: User) -> QuerySet[WorkItem]:
    return work_items_for(user).select_related(
        "case", "node", "group", "escalation_group", "completed_by"
    )


def _item_out(item: WorkItem, upstream: dict[str, Any]) -> WorkItemOut:
    node = item.node
    return WorkItemOut(
        id=item.pk,
        case=item.case_id,
        case_title=item.case.title,
        node=node.key,
        node_id=node.pk,
        task=node.task,
        inputs=node.inputs if isinstance(node.inputs, dict) else {},
        upstream_outputs=upstream,
        expected_output=node.expected_output or None,
        group=item.group.name,
        status=WorkItem.Status(item.status),
        created_at=item.created_at,
        deadline=item.deadline,
        overdue=item.is_overdue,
        reminded_at=item.reminded_at,
        escalated_at=item.escalated_at,
        escalation_group=item.escalation_group.name
        if item.escalated_at and item.escalation_group
        else None,
        completed_by=item.completed_by.get_username() if item.completed_by else None,
        completed_at=item.completed_at,
        output=item.output,
    )


def _one_item(user: User, item_id: int) -> WorkItemOut:
    if item_id > MAX_ID:
        raise Http404("No such work item")
    item = _items(user).filter(pk=item_id).first()
    if item is None:
        raise Http404("No such work item")
    return _item_out(item, upstream_outputs_of([item.node])[item.node_id])


# Agents ---------------------------------------------------------------------------------------


@router.get(
    "/agents",
    response={200: list[AgentOut], 403: Message},
    tags=["agents"],
    summary="List the agents plans may assign steps to, with their learned trust",
)
@paginate(Page)
def list_agents(request: HttpRequest) -> Any:
    """List the agents, paginated, each with the trust routing uses now.

    403 for an account without a CaseHub role.
    """
    rules.require_role(request_user(request))
    return Agent.objects.order_by("slug").prefetch_related("scores")


# Cancel ---------------------------------------------------------------------------------------


@router.post(
    "/cases/{int:case_id}/cancel",
    response={200: CaseOut, 403: Message, 404: Message, 409: Message, 422: ValidationMessage},
    tags=["cases"],
    summary="Cancel a case: nothing new starts, running steps stop at their next safe point",
)
def cancel(request: HttpRequest, case_id: int, payload: CancelIn) -> Any:
    """Cancel a case with a `cancel` reason code (audited).

    The submitter, compliance officers and admins may cancel. 403 for anyone else who reads the
    case; 404 for a case you may not read; 409 for a case that already ended; 422 for a missing
    or unknown reason code.
    """
    user = request_user(request)
    admin = is_admin(user)
    if case_id > MAX_ID or (admin and not Case.objects.filter(pk=case_id).exists()):
        raise Http404("No such case")
    if not admin:
        case_for(user, case_id)
    try:
        execution.cancel_case(
            case_id=case_id, user=user, reason_code=payload.reason_code, reason=payload.reason
        )
    except execution.CaseNotRunning as exc:
        raise HttpError(409, str(exc)) from exc
    return Case.objects.select_related("submitter", "current_version").get(pk=case_id)


# The stop switch --------------------------------------------------------------------------


@router.get(
    "/control",
    response={200: ControlOut, 403: Message},
    summary="Read the global stop switch",
)
def get_control(request: HttpRequest) -> Any:
    """Return whether execution is stopped, why, and who turned the switch last.

    403 for an account without a CaseHub role.
    """
    rules.require_role(request_user(request))
    return _control()


@router.post(
    "/control/stop",
    response={200: ControlOut, 403: Message},
    summary="Stop execution everywhere: no step is claimed until resumed (admins)",
)
def stop(request: HttpRequest, payload: StopIn) -> Any:
    """Turn the global stop switch on, with a reason (audited); running steps stop at their
    next safe point and wait, ready, for the resume.

    403 unless you are an admin.
    """
    user = request_user(request)
    _require_admin(user)
    execution.set_stopped(stopped=True, user=user, reason=payload.reason)
    return _control()


@router.post(
    "/control/resume",
    response={200: ControlOut, 403: Message},
    summary="Resume execution: ready steps are sent to the workers again (admins)",
)
def resume(request: HttpRequest, payload: ResumeIn) -> Any:
    """Turn the global stop switch off (audited).

    403 unless you are an admin.
    """
    user = request_user(request)
    _require_admin(user)
    execution.set_stopped(stopped=False, user=user, reason=payload.reason)
    return _control()


# Work items -------------------------------------------------------------------------------


@router.get(
    "/work-items",
    response={200: WorkItemPage},
    tags=["work items"],
    summary="List the human steps waiting for your groups (soonest deadline first)",
)
def list_work_items(request: HttpRequest, filters: Query[WorkItemFilters]) -> Any:
    """List the work items of your groups and those escalated to them, except those of cases
    you submitted, paginated."""
    items = _items(request_user(request))
    if filters.status is not None:
        items = items.filter(status=filters.status)
    count = items.count()
    page = list(items.order_by("deadline", "id")[filters.offset : filters.offset + filters.limit])
    upstream = upstream_outputs_of([item.node for item in page])
    return WorkItemPage(
        items=[_item_out(item, upstream[item.node_id]) for item in page], count=count
    )


@router.get(
    "/work-items/{int:item_id}",
    response={200: WorkItemOut, 404: Message},
    tags=["work items"],
    summary="Read a work item: its task, inputs and the outputs upstream of it",
)
def get_work_item(request: HttpRequest, item_id: int) -> Any:
    """Return one work item of your groups; 404 for any other."""
    return _one_item(request_user(request), item_id)


@router.post(
    "/work-items/{int:item_id}/complete",
    response={200: WorkItemOut, 404: Message, 409: Message, 422: ValidationMessage},
    tags=["work items"],
    summary="Complete a work item with its output: the human step succeeds",
)
def complete(request: HttpRequest, item_id: int, payload: CompleteIn) -> Any:
    """Complete an open work item of your groups (audited); its step succeeds with the output.

    404 for an item not of your groups; 409 when it is not open any more (completed, or
    cancelled with its case); 422 naming the problem when the output does not fit the step's
    expected output, and nothing changes.
    """
    user = request_user(request)
    _one_item(user, item_id)
    try:
        execution.complete_work_item(item_id=item_id, user=user, output=payload.output)
    except execution.WorkItemConflict as exc:
        raise HttpError(409, str(exc)) from exc
    except execution.StaleResult as exc:
        raise HttpError(409, f"the step no longer waits for this work item ({exc})") from exc
    except LeafError as exc:
        if exc.error_class != execution.ErrorClass.OUTPUT_INVALID:
            raise
        return Status(422, ValidationMessage(message=str(exc), fields={"output": [str(exc)]}))
    return _one_item(user, item_id)


__all__ = ["is_admin", "router"]
