"""Gates in the JSON API: list and read them, decide them, and the list of reason codes.

Who sees which gates is decided in the query: officers the gates of their groups except those
of cases they submitted, auditors every gate (read only), analysts the gates of their own cases.
Deciding goes through `oversight.actions.gates.decide_gate`, which checks everything again.
"""

# No `from __future__ import annotations`: ninja reads the endpoint annotations at runtime.

from datetime import datetime
from typing import Literal

from django.contrib.auth.models import User
from django.db.models import Prefetch, Q, QuerySet
from django.http import Http404, HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.pagination import paginate
from pydantic import ConfigDict

from oversight.actions import gates as gate_actions
from oversight.models import (
    OPEN_GATE_STATUSES,
    Gate,
    GateDecision,
    GateKind,
    GateRisk,
    GateStatus,
    ReasonCode,
)
from planning import rules
from planning.api import Message, Page, ValidationMessage, request_user
from planning.queries import visible_cases

# Ids beyond a signed 64-bit integer cannot name a row; refused before they reach the database.
MAX_ID = 2**63 - 1
DECIDE_GATE = "oversight.decide_gate"

router = Router(tags=["gates"])


class SignatureOut(Schema):
    meaning: str
    hash: str = Field(description="The content hash of what was approved.")


class DecisionOut(Schema):
    by: str = Field(description="The decider's username.")
    full_name: str
    decision: Literal["approve", "reject"]
    reason_code: str
    reason: str
    version: int
    content_hash: str
    time: datetime
    signature: SignatureOut | None = Field(
        None, description="Set when the decision was an electronic signature."
    )

    @staticmethod
    def resolve_by(decision: GateDecision) -> str:
        return decision.decider.get_username()

    @staticmethod
    def resolve_version(decision: GateDecision) -> int:
        return decision.version_number

    @staticmethod
    def resolve_signature(decision: GateDecision) -> dict[str, str] | None:
        if not decision.is_signed:
            return None
        return {"meaning": decision.signature_meaning, "hash": decision.signature_hash}


class GateOut(Schema):
    id: int
    kind: GateKind
    case: int
    node: int | None = Field(None, description="The gated plan node; null for a plan gate.")
    node_key: str | None = None
    version: int = Field(description="The number of the plan version the gate binds to.")
    content_hash: str = Field(description="The version's or the node's content hash.")
    status: GateStatus
    reason: str = Field(description="Why it is gated, in words.")
    approver_group: str
    quorum: int
    approvals: int = Field(description="Approvals so far.")
    deadline: datetime
    escalated: bool
    risk: GateRisk
    needs_signature: bool
    signature_meaning: str | None = Field(
        None,
        description="For an open gate that needs a signature: what approving it means now, as the "
        "signature records it, naming the outputs the step acts on as they are; send it back as "
        "`meaning` to sign exactly that. Null otherwise.",
    )
    approval_expires_at: datetime | None
    decisions: list[DecisionOut]

    @staticmethod
    def resolve_case(gate: Gate) -> int:
        return gate.case_id

    @staticmethod
    def resolve_node(gate: Gate) -> int | None:
        return gate.node_id

    @staticmethod
    def resolve_node_key(gate: Gate) -> str | None:
        return gate.node.key if gate.node is not None else None

    @staticmethod
    def resolve_version(gate: Gate) -> int:
        return gate.version.number

    @staticmethod
    def resolve_approver_group(gate: Gate) -> str:
        return gate.approver_group.name

    @staticmethod
    def resolve_escalated(gate: Gate) -> bool:
        return gate.escalated_at is not None

    @staticmethod
    def resolve_signature_meaning(gate: Gate) -> str | None:
        if not gate.needs_signature or gate.status not in OPEN_GATE_STATUSES:
            return None
        return gate_actions.signature_meaning(gate)

    @staticmethod
    def resolve_decisions(gate: Gate) -> list[GateDecision]:
        return list(gate.decisions.all())


class GateFilters(Schema):
    status: GateStatus | None = Field(None, description="Without it, every status is listed.")
    case: int | None = Field(None, ge=1, le=MAX_ID)
    kind: GateKind | None = None


class DecisionIn(Schema):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"]
    reason_code: str = Field("", max_length=50, description="Required to reject.")
    reason: str = Field("", max_length=rules.DESCRIPTION_MAX_LENGTH)
    password: str | None = Field(
        None, max_length=4096, description="Required when the gate needs a signature."
    )
    version: int | None = Field(
        None, ge=1, description="The plan version you reviewed; a different one is 409."
    )
    content_hash: str | None = Field(
        None, max_length=64, description="The content hash you reviewed; a different one is 409."
    )
    meaning: str | None = Field(
        None,
        max_length=20_000,
        description="For a signature: the gate's `signature_meaning` you read; when what the step "
        "acts on changed since (a step upstream ran), 409 and nothing is signed.",
    )


class ReasonCodeOut(Schema):
    code: str
    label: str
    applies_to: list[str]


def gates_for(user: User) -> QuerySet[Gate]:
    """Return the gates the user may read, separation of duties inside the query.

    Officers: the gates of their groups (or escalated to them) except those of cases they
    submitted. Auditors and others who read every case: all gates. Analysts: their own cases'.
    """
    gates = Gate.objects.select_related("case", "version", "node", "approver_group")
    if user.has_perm(DECIDE_GATE) and not user.has_perm(rules.CONFIGURE):
        groups = list(user.groups.values_list("pk", flat=True))
        mine = Q(approver_group__in=groups) | Q(
            escalated_at__isnull=False, escalation_group__in=groups
        )
        return gates.filter(mine).exclude(case__submitter=user)
    if rules.can_view_all_cases(user):
        return gates
    if rules.can_submit_cases(user):
        return gates.filter(case__submitter=user)
    return gates.none()


def _with_decisions(gates: QuerySet[Gate]) -> QuerySet[Gate]:
    return gates.prefetch_related(
        Prefetch("decisions", queryset=GateDecision.objects.select_related("decider"))
    )


@router.get(
    "/gates",
    response={200: list[GateOut]},
    summary="List gates",
    description="Paginated; by deadline. Officers see the gates of their groups except those "
    "of cases they submitted.",
)
@paginate(Page)
def list_gates(request: HttpRequest, filters: Query[GateFilters]) -> QuerySet[Gate]:
    gates = gates_for(request_user(request))
    if filters.status is not None:
        gates = gates.filter(status=filters.status)
    if filters.case is not None:
        gates = gates.filter(case_id=filters.case)
    if filters.kind is not None:
        gates = gates.filter(kind=filters.kind)
    return _with_decisions(gates.order_by("deadline", "id"))


def _gate(user: User, gate_id: int) -> Gate:
    if gate_id > MAX_ID:
        raise Http404("No such gate")
    try:
        return _with_decisions(gates_for(user)).get(pk=gate_id)
    except Gate.DoesNotExist:
        raise Http404("No such gate") from None


@router.get("/gates/{int:gate_id}", response={200: GateOut, 404: Message}, summary="Read a gate")
def get_gate(request: HttpRequest, gate_id: int) -> Gate:
    return _gate(request_user(request), gate_id)


@router.post(
    "/gates/{int:gate_id}/decision",
    response={200: GateOut, 403: Message, 404: Message, 409: Message, 422: ValidationMessage},
    summary="Approve or reject a gate",
    description="403 for separation of duties or a wrong signature password; 409 when the gate "
    "is already decided, void or stale; 422 for a missing or unknown reason code on reject.",
)
def decide(request: HttpRequest, gate_id: int, payload: DecisionIn) -> Gate:
    user = request_user(request)
    if gate_id > MAX_ID:
        raise Http404("No such gate")
    # A gate the user cannot read is 404, not a hint that it exists.
    visible = Gate.objects.filter(pk=gate_id).filter(
        Q(pk__in=gates_for(user).values("pk")) | Q(case__in=visible_cases(user).values("pk"))
    )
    if not visible.exists():
        raise Http404("No such gate")
    gate_actions.decide_gate(
        gate_id=gate_id,
        user=user,
        decision=gate_actions.DecisionInput(
            decision=payload.decision,
            reason_code=payload.reason_code,
            reason=payload.reason,
            password=payload.password,
            version=payload.version,
            content_hash=payload.content_hash,
            meaning=payload.meaning,
        ),
    )
    return _with_decisions(
        Gate.objects.select_related("case", "version", "node", "approver_group")
    ).get(pk=gate_id)


@router.get("/reason-codes", response={200: list[ReasonCodeOut]}, summary="List reason codes")
def list_reason_codes(request: HttpRequest) -> QuerySet[ReasonCode]:
    return ReasonCode.objects.filter(active=True).order_by("code")


__all__ = ["gates_for", "router"]
