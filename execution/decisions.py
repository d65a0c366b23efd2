"""What execution does once a gate is decided: `on_gate_decided` is oversight's
`CASEHUB_GATE_DECIDED_HOOKS` entry, called in the deciding transaction."""

from __future__ import annotations

from execution.cases import cancel_open_leaves, finish_if_done
from execution.claiming import release_ready, start_execution
from execution.common import RUNNING_CASE_STATUSES
from execution.ending import on_escalation_rejected, on_step_approved
from execution.replanning import before_start
from oversight.actions.gates import rejection_reason
from oversight.models import Gate, GateDecision, GateKind, GateStatus
from planning.models import CaseStatus
from planning.versions import descends_from_replan


def on_gate_decided(gate: Gate, decision: GateDecision) -> None:
    """Start, resume or end steps as the decision of `gate` lets them.

    An approved plan gate that approved its case starts execution (carrying over, for a
    version descended from a re-plan, what the re-planned version's steps did meanwhile); one
    that renewed the approval of a running case's plan (the earlier one expired: S4) releases the
    steps that waited for it; an approved step or escalation gate lets its step run (an
    escalation of a rejected step in the rejection's place: S6); a rejected escalation fails its
    step for good.
    """
    case = gate.case
    actor = decision.decider
    if gate.status == GateStatus.REJECTED:
        if case.status == CaseStatus.REJECTED:
            # The rejection ended the case (its plan, or a step that aborts): no approval will
            # come, so its steps end cancelled, not waiting.
            cancel_open_leaves(
                gate.version_id, case_id=case.pk, why="the plan was rejected", actor=actor
            )
            return
        if (
            gate.kind == GateKind.ESCALATION
            and gate.node is not None
            and case.status in RUNNING_CASE_STATUSES
        ):
            why = f"escalation {rejection_reason(decision)}"
            on_escalation_rejected(gate, actor=actor, why=why)
        return
    if gate.status != GateStatus.APPROVED:
        return
    if gate.kind == GateKind.PLAN:
        if case.status == CaseStatus.APPROVED:
            before_start(gate.version)
            start_execution(case, actor=actor)
            if descends_from_replan(gate.version):
                # Every step may have ended already (kept from the earlier version).
                finish_if_done(case)
        elif case.status in RUNNING_CASE_STATUSES:
            release_ready(gate.version, case=case)
    elif gate.node is not None:
        on_step_approved(gate, actor=actor)
    elif gate.kind == GateKind.ESCALATION and case.status in RUNNING_CASE_STATUSES:
        finish_if_done(case)
