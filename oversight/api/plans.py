"""Plans in the JSON API: read any version of a case's plan, edit it, and diff two versions.

The plan lives here rather than in planning's router because each node carries its gate, which
is oversight's. Edits go through `oversight.actions.edits.edit_plan`, which checks everything.
"""

# No `from __future__ import annotations`: ninja reads the endpoint annotations at runtime.

from datetime import datetime
from typing import Annotated, Any, Literal

from django.http import Http404, HttpRequest
from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict, Strict

from oversight.actions.edits import edit_plan
from oversight.models import Gate, GateKind, GateStatus
from planning.api import Message, ValidationMessage, request_user
from planning.core.diff import diff_plans
from planning.models import Case, PlanNode, PlanVersion, Strategy
from planning.queries import case_for
from planning.versions import load_plan

# Version numbers beyond a signed 32-bit integer name no row; refused before the database.
MAX_VERSION = 2**31 - 1

router = Router(tags=["plans"])


# Schemas ------------------------------------------------------------------------------------


class GateRef(Schema):
    id: int
    kind: GateKind
    status: GateStatus


class NodeOut(Schema):
    id: str
    parent: str | None
    kind: Literal["compound", "leaf"]
    name: str
    description: str
    task: str
    agent: str | None
    rationale: str
    tool: str | None
    inputs: dict[str, Any]
    depends_on: list[str]
    status: str
    risk: str | None
    gate: GateRef | None = Field(
        None, description="The node's latest gate (id, kind, status); null when it has none."
    )
    provenance: dict[str, Any]
    attempts: int = Field(0, description="How many times a worker claimed the step.")
    started_at: datetime | None = Field(None, description="When its latest attempt started.")
    finished_at: datetime | None = None
    output: dict[str, Any] | None = Field(None, description="Set once the step succeeded.")
    error: str | None = Field(None, description="Why its latest attempt failed.")
    error_class: str | None = Field(
        None,
        description="transient, invalid_input, tool_failure, policy_denial, timeout, poison, "
        "output_invalid or configuration (the installation cannot run it as configured).",
    )
    finished_after_cancel: bool = Field(
        False, description="Its effect happened before the case's cancel stopped it."
    )
    routing: dict[str, Any] | None = Field(
        None, description="Who was chosen to run it, by trust and load, and why."
    )


class PlanOut(Schema):
    case: int
    version: int
    content_hash: str
    strategy: Strategy
    warnings: list[str]
    llm_calls: int
    created_at: datetime
    edited_by: str | None = Field(None, description="Who made this version by an edit.")
    edit: dict[str, Any] | None = Field(
        None, description="The edit: node, changes, reason_code, reason, from_version."
    )
    gate: GateRef | None = Field(None, description="The version's plan gate; null when none.")
    nodes: list[NodeOut]


class PlanQuery(Schema):
    version: int | None = Field(
        None, ge=1, le=MAX_VERSION, description="A version number; the current one by default."
    )


class ChangesIn(Schema):
    model_config = ConfigDict(extra="forbid")

    agent: str | None = Field(None, description="Slug of the agent to run the step.")
    task: str | None = None
    inputs: dict[str, Any] | None = Field(None, description="The tool's inputs, checked by it.")
    depends_on: list[str] | None = Field(
        None, description="Keys of the nodes the step waits for; null: after the previous one."
    )
    remove: Annotated[bool, Strict()] | None = Field(None, description="true removes the step.")


class EditIn(Schema):
    model_config = ConfigDict(extra="forbid")

    node: str = Field(min_length=1, max_length=200, description="Key of the step to edit.")
    changes: ChangesIn
    reason_code: str = Field("", max_length=50, description="A code that applies to edit.")
    reason: str = Field("", max_length=10_000)
    base_version: int | None = Field(
        None, ge=1, le=MAX_VERSION, description="The version you edited; a stale one is a 409."
    )


class FieldChangeOut(Schema):
    field: str
    before: Any
    after: Any


class NodeChangeOut(Schema):
    node: str
    fields: list[FieldChangeOut]


class DependencyChangeOut(Schema):
    node: str
    before: list[str] = Field(description="The leaves it waited for.")
    after: list[str] = Field(description="The leaves it waits for now.")
    gained: list[str]
    lost: list[str]


class DiffBody(Schema):
    added: list[str]
    removed: list[str]
    changed: list[NodeChangeOut]
    dependencies: list[DependencyChangeOut]


class DiffOut(DiffBody):
    case: int
    from_version: int
    to_version: int
    from_content_hash: str
    to_content_hash: str


class EditOut(Schema):
    case: int
    version: int
    content_hash: str
    diff: DiffBody


class DiffQuery(Schema):
    from_: int | None = Field(
        None, alias="from", ge=1, le=MAX_VERSION, description="The previous version by default."
    )
    to: int | None = Field(
        None, ge=1, le=MAX_VERSION, description="The current version by default."
    )


# Reading ------------------------------------------------------------------------------------


def _version(case: Case, number: int | None) -> PlanVersion:
    if number is None:
        if case.current_version is None:
            raise Http404(f"Case {case.pk} has no plan yet (status: {case.status}).")
        return case.current_version
    version = PlanVersion.objects.filter(case=case, number=number).first()
    if version is None:
        raise Http404(f"Case {case.pk} has no plan version {number}.")
    return version


def _latest_gates(version: PlanVersion) -> tuple[dict[int, GateRef], GateRef | None]:
    """Return each node's latest gate by node id, and the version's plan gate (one query)."""
    by_node: dict[int, GateRef] = {}
    plan_gate: GateRef | None = None
    rows = (
        Gate.objects.filter(version=version)
        .order_by("opened_at", "id")
        .values_list("id", "kind", "status", "node_id")
    )
    for gate_id, kind, status, node_id in rows:
        ref = GateRef(id=gate_id, kind=GateKind(kind), status=GateStatus(status))
        if node_id is not None:
            by_node[node_id] = ref
        elif kind == GateKind.PLAN:
            plan_gate = ref
    return by_node, plan_gate


def _node_out(node: PlanNode, keys: dict[int, str], gate: GateRef | None) -> NodeOut:
    return NodeOut(
        id=node.key,
        parent=keys.get(node.parent_id) if node.parent_id is not None else None,
        kind=node.kind,  # type: ignore[arg-type]
        name=node.name,
        description=node.description,
        task=node.task,
        agent=node.agent or None,
        rationale=node.rationale,
        tool=node.tool or None,
        inputs=node.inputs,
        depends_on=list(node.depends_on),
        status=node.status,
        risk=node.risk or None,
        gate=gate,
        provenance=node.provenance,
        attempts=node.attempts,
        started_at=node.started_at,
        finished_at=node.finished_at,
        output=node.output if isinstance(node.output, dict) else None,
        error=node.error or None,
        error_class=node.error_class or None,
        finished_after_cancel=node.finished_after_cancel,
        routing=node.routing or None,
    )


@router.get(
    "/cases/{int:case_id}/plan",
    response={200: PlanOut, 404: Message},
    tags=["cases"],
    summary="Read a plan version of a case (the current one by default): its tree and DAG",
)
def get_plan(request: HttpRequest, case_id: int, query: Query[PlanQuery]) -> Any:
    """Return a plan version with its nodes in tree order, each with its latest gate.

    404 for a case you may not read, one that has no plan yet, or an unknown version.
    """
    case = case_for(request_user(request), case_id)
    version = _version(case, query.version)
    nodes = list(PlanNode.objects.filter(version=version).order_by("position"))
    keys = {node.pk: node.key for node in nodes}
    gates, plan_gate = _latest_gates(version)
    # One more query for an edited version only: the count never grows with the plan.
    editor = version.edited_by.get_username() if version.edited_by is not None else None
    return PlanOut(
        case=case.pk,
        version=version.number,
        content_hash=version.content_hash,
        strategy=version.strategy,  # type: ignore[arg-type]
        warnings=list(version.warnings),
        llm_calls=version.llm_calls,
        created_at=version.created_at,
        edited_by=editor,
        edit=version.edit,
        gate=plan_gate,
        nodes=[_node_out(node, keys, gates.get(node.pk)) for node in nodes],
    )


@router.get(
    "/cases/{int:case_id}/plan/diff",
    response={200: DiffOut, 404: Message},
    summary="Compare two plan versions of a case: nodes added, removed, changed, moved",
)
def get_plan_diff(request: HttpRequest, case_id: int, query: Query[DiffQuery]) -> Any:
    """Return what changed from version `from` to version `to`.

    By default `to` is the current version and `from` the one before it. 404 for a case you may
    not read or a version it does not have.
    """
    case = case_for(request_user(request), case_id)
    to = _version(case, query.to)
    number = query.from_ if query.from_ is not None else to.number - 1
    if number < 1:
        raise Http404(f"Plan version {to.number} is the first: there is no version before it.")
    old = _version(case, number)
    diff = diff_plans(load_plan(old), load_plan(to))
    return DiffOut(
        case=case.pk,
        from_version=old.number,
        to_version=to.number,
        from_content_hash=old.content_hash,
        to_content_hash=to.content_hash,
        **diff.as_data(),
    )


# Editing ------------------------------------------------------------------------------------


@router.post(
    "/cases/{int:case_id}/plan/edits",
    response={201: EditOut, 403: Message, 404: Message, 409: Message, 422: ValidationMessage},
    summary="Edit one step of a plan awaiting approval; the result is a new plan version",
)
def create_plan_edit(request: HttpRequest, case_id: int, payload: EditIn) -> Any:
    """Change a step's agent, task, inputs or dependencies, or remove it, giving a reason code.

    The edited plan is validated in full and stored as the next version; the old version's open
    gates become void and the new version's gates open (approvals of unchanged steps carry).
    403 unless you are a compliance officer who did not submit the case (the editor cannot then
    approve the version); 404 for a case you may not read; 409 when the case is not awaiting
    approval or `base_version` is not the current version; 422 naming the field for an invalid
    edit or reason code, and nothing changes.
    """
    user = request_user(request)
    case = case_for(user, case_id)
    result = edit_plan(
        case_id=case.pk,
        user=user,
        node_key=payload.node,
        changes=payload.changes.model_dump(exclude_unset=True),
        reason_code=payload.reason_code,
        reason=payload.reason,
        base_version=payload.base_version,
    )
    return Status(
        201,
        EditOut(
            case=case.pk,
            version=result.version.number,
            content_hash=result.version.content_hash,
            diff=DiffBody(**result.diff.as_data()),
        ),
    )
