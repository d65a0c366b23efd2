"""What a claim accepts and refuses: an expired plan approval (S4), an approved escalation of a
rejected step (S6), a retry's backoff message (S11), and an agent with no history yet.

Task bodies are called directly (STYLE: unit tests may); the integration suite runs the retry on
a real Celery worker (tests/integration/test_execution_faults.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts import roles
from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from execution import actions as execution
from oversight.actions.gates import DecisionInput, SignatureRefused, decide_gate
from oversight.actions.policies import propose_policy
from oversight.models import Gate, GateKind, GateStatus
from planning.models import Agent, CaseStatus, ErpPaymentHold, NodeStatus, PlanNode
from tests import personas
from tests.cases import planned_invoice_case
from tests.execution.test_execution import _gate, approve, leaves, run_ready
from tests.personas import PASSWORD

pytestmark = pytest.mark.django_db


# S4: a plan approval past its expiry -----------------------------------------------------------


@pytest.mark.scenario("S4", "R4")
def test_an_expired_plan_approval_runs_no_step_and_a_new_plan_approval_is_asked_for(
    analyst, officer, second_officer
):
    case = planned_invoice_case(analyst)
    plan = _gate(case, GateKind.PLAN)
    approve(plan, officer)
    Gate.objects.filter(pk=plan.pk).update(
        approval_expires_at=timezone.now() - timedelta(minutes=1)
    )
    expired_at = Gate.objects.get(pk=plan.pk).approval_expires_at.isoformat()
    first = leaves(case)["extract-fields"]
    assert run_ready(case) == [f"{first.pk} refused: the plan's approval expired at {expired_at}"]
    nodes = leaves(case)
    assert all(n.attempts == 0 for n in nodes.values())
    # The step waits for the plan (not for a gate of its own) and the case still runs.
    assert nodes["extract-fields"].status == NodeStatus.PENDING
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING
    plan.refresh_from_db()
    assert plan.status == GateStatus.VOID
    refusal = AuditEvent.objects.get(action="execution.leaf.claim_refused")
    assert "plan's approval expired" in refusal.data["why"]
    assert AuditEvent.objects.filter(action="oversight.gate.expired", data__gate=plan.pk).exists()
    fresh = _gate(case, GateKind.PLAN)
    assert fresh.pk != plan.pk and "re-approval needed" in fresh.reason
    # A second refusal (another step, another worker) does not open a third plan gate.
    lookup = nodes["lookup-supplier"]
    PlanNode.objects.filter(pk=lookup.pk).update(status=NodeStatus.READY)
    with pytest.raises(execution.ClaimRefused, match="plan gate is pending"):
        execution.claim_leaf(lookup.pk, worker="w")
    assert Gate.objects.filter(case=case, kind=GateKind.PLAN).count() == 2
    PlanNode.objects.filter(pk=lookup.pk).update(status=NodeStatus.PENDING)
    # The new approval lets the case go on where it stopped.
    approve(fresh, second_officer)
    assert leaves(case)["extract-fields"].status == NodeStatus.READY
    run_ready(case)
    approve(_gate(case, GateKind.STEP, "place-hold"), officer, password=PASSWORD)
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert verify_chain(case_chain(case.pk)) == []


# S6: an escalation of a rejected step, approved -------------------------------------------------


def _reject_the_hold_and_escalate(case: Any, officer: Any) -> Gate:
    approve(_gate(case, GateKind.PLAN), officer)
    run_ready(case)
    decide_gate(
        gate_id=_gate(case, GateKind.STEP, "place-hold").pk,
        user=officer,
        decision=DecisionInput(decision="reject", reason_code="incorrect", reason="check again"),
    )
    return _gate(case, GateKind.ESCALATION, "place-hold")


@pytest.mark.scenario("S6")
def test_an_approved_escalation_of_a_rejected_step_runs_it_and_the_case_completes(analyst, officer):
    case = planned_invoice_case(analyst)
    escalation = _reject_the_hold_and_escalate(case, officer)
    supervisor = personas.make_user("sam", roles.SUPERVISOR)
    approve(escalation, supervisor, password=PASSWORD)
    assert leaves(case)["place-hold"].status == NodeStatus.READY
    outcomes = run_ready(case)
    assert not any("refused" in o for o in outcomes), outcomes
    hold = leaves(case)["place-hold"]
    assert hold.status == NodeStatus.SUCCEEDED and hold.attempts == 1
    assert ErpPaymentHold.objects.filter(invoice_id="INV-1042").count() == 1
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification


@pytest.mark.scenario("S6", "R7")
def test_approving_the_escalation_of_a_signed_step_is_a_signature(analyst, officer):
    case = planned_invoice_case(analyst)
    escalation = _reject_the_hold_and_escalate(case, officer)
    assert escalation.needs_signature
    supervisor = personas.make_user("sam", roles.SUPERVISOR)
    with pytest.raises(SignatureRefused):
        approve(escalation, supervisor)
    with pytest.raises(SignatureRefused):
        approve(escalation, supervisor, password="wrong")
    escalation.refresh_from_db()
    assert escalation.status == GateStatus.PENDING
    assert leaves(case)["place-hold"].status == NodeStatus.AWAITING_APPROVAL
    approve(escalation, supervisor, password=PASSWORD)
    decided = AuditEvent.objects.get(action="oversight.gate.decided", data__gate=escalation.pk)
    assert decided.data["signature"]["meaning"].startswith("approval of step place-hold")


# S11: a retry's backoff message -----------------------------------------------------------------


@pytest.mark.scenario("S11")
def test_a_retrys_backoff_message_starts_the_retry_and_an_early_one_is_refused(
    analyst, officer, settings
):
    settings.CASEHUB_LEAF_INLINE_S = 0  # each message runs its own leaf only
    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    while (check := leaves(case)["check-duplicate"]).status != NodeStatus.READY:
        ready = [n for n in leaves(case).values() if n.status == NodeStatus.READY]
        execution.execute_leaf(ready[0].pk, worker="w")
    assert check.failure_policy == "retry" and check.status == NodeStatus.READY
    claim = execution.claim_leaf(check.pk, worker="w")
    execution.fail_leaf(check.pk, claim.attempt, error_class="transient", error="upstream busy")
    assert leaves(case)["check-duplicate"].status == NodeStatus.RETRYING
    # The message came early (a clock ahead, a redelivery): refused, the leaf keeps waiting.
    PlanNode.objects.filter(pk=check.pk).update(next_attempt_at=timezone.now() + timedelta(hours=1))
    (early,) = execution.execute_leaf(check.pk, worker="w")
    assert early.startswith(f"{check.pk} refused: the leaf is retrying"), early
    assert leaves(case)["check-duplicate"].status == NodeStatus.RETRYING
    # Its backoff is over: the message starts the retry, no reconciler pass needed.
    PlanNode.objects.filter(pk=check.pk).update(next_attempt_at=timezone.now())
    assert execution.execute_leaf(check.pk, worker="w") == [f"{check.pk} succeeded"]
    node = leaves(case)["check-duplicate"]
    assert (node.status, node.attempts, node.next_attempt_at) == (NodeStatus.SUCCEEDED, 2, None)
    claimed = AuditEvent.objects.filter(action="execution.leaf.claimed", data__node=check.key)
    assert [e.data["before"]["status"] for e in claimed.order_by("pk")] == ["ready", "retrying"]


# Cold start: an agent with no outcomes yet ------------------------------------------------------


def _new_agent_case(analyst: Any, officer: Any) -> PlanNode:
    """A case whose first step's agent is new (trust 0.50 under the 0.60 threshold), its plan
    and that step approved by an officer."""
    Agent.objects.filter(slug="invoice-extractor").update(trust=0.5)
    case = planned_invoice_case(analyst)
    step = _gate(case, GateKind.STEP, "extract-fields")
    assert "trusted 0.50, under 0.60" in step.reason
    approve(_gate(case, GateKind.PLAN), officer)
    approve(step, officer)
    return leaves(case)["extract-fields"]


def test_a_new_agent_runs_a_step_an_officer_approved_no_history_yet(analyst, officer):
    node = _new_agent_case(analyst, officer)
    assert node.agent == "invoice-extractor" and node.status == NodeStatus.READY
    assert execution.execute_leaf(node.pk, worker="w")[0] == f"{node.pk} succeeded"
    node.refresh_from_db()
    assert "no history yet" in node.routing["rationale"]
    assert node.routing["agent"] == "invoice-extractor" and not node.routing["escalate"]
    assert not Gate.objects.filter(kind=GateKind.ESCALATION).exists()


def test_a_policy_may_escalate_a_new_agents_approved_steps(analyst, officer, admin_user):
    propose_policy(admin_user, {"cold_start": "escalate"}, "threshold-review", "new agents")
    node = _new_agent_case(analyst, officer)
    assert execution.execute_leaf(node.pk, worker="w") == [
        f"{node.pk} refused: invoice-extractor is trusted 0.50 < 0.60; "
        "no candidate is trusted 0.60 or more"
    ]
    node.refresh_from_db()
    assert node.status == NodeStatus.AWAITING_APPROVAL and node.attempts == 0
    escalation = Gate.objects.get(kind=GateKind.ESCALATION, node=node)
    assert "routing of step extract-fields" in escalation.reason


@pytest.mark.scenario("S6", "R7")
def test_every_escalation_of_a_step_signed_for_asks_for_the_signature(analyst, officer):
    """Not only a rejection's: a failed payment hold escalated by its failure policy is signed for
    when its escalation is approved, as its own gate was."""
    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    run_ready(case)
    hold = _gate(case, GateKind.STEP, "place-hold")
    assert hold.needs_signature
    approve(hold, officer, password=PASSWORD)
    node = leaves(case)["place-hold"]
    PlanNode.objects.filter(pk=node.pk).update(failure_policy="escalate")
    claim = execution.claim_leaf(node.pk, worker="w")
    execution.fail_leaf(node.pk, claim.attempt, error_class="tool_failure", error="ERP refused")
    escalation = _gate(case, GateKind.ESCALATION, "place-hold")
    assert escalation.needs_signature
    supervisor = personas.make_user("sam", roles.SUPERVISOR)
    with pytest.raises(SignatureRefused):
        approve(escalation, supervisor)
    approve(escalation, supervisor, password=PASSWORD)
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
