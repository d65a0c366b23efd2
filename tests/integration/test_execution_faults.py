"""Execution on real Celery workers under faults (RELIABILITY E1 to E12, O11): nothing is lost, and
nothing acts twice. Effects are counted by idempotency key (tests/fakes/execution_pack.py)."""

from __future__ import annotations

from typing import Any

import pytest

from oversight.models import AuditEvent, LeafAttempt
from planning.models import CaseStatus, ErpPaymentHold, NodeStatus
from tests.integration.execution import Harness, approve_plan, kill, leaf, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def harness(transactional_db: None, settings: Any, tmp_path: Any) -> Harness:
    return Harness(settings, tmp_path / "effects")


@pytest.mark.scenario("E1")
def test_a_worker_killed_mid_leaf_is_replaced_and_the_effect_happens_once(
    harness: Harness, analyst: Any, officer: Any
) -> None:
    case = harness.case(analyst, [{"key": "pay", "seconds": 4, "act_first": True}])
    worker = harness.worker()
    try:
        approve_plan(case, officer)
        wait_until("the leaf to run and act", lambda: harness.effects_of(case, "pay")[0] == 1,
                   workers=(worker,))  # fmt: skip
        kill(worker)
    finally:
        worker.stop()
    replacement = harness.worker()
    try:
        wait_until("the case to complete", lambda: leaf(case, "pay").status == "succeeded",
                   workers=(replacement,))  # fmt: skip
    finally:
        replacement.stop()
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert harness.effects_of(case, "pay") == (1, 2)  # ran twice, acted once
    node = leaf(case, "pay")
    assert node.attempts == 2
    assert list(LeafAttempt.objects.filter(node=node).values_list("outcome", flat=True)) == [
        "lost",
        "succeeded",
    ]
    actions = list(AuditEvent.objects.filter(data__node="pay").values_list("action", flat=True))
    assert actions.count("execution.leaf.claimed") == 2
    assert "execution.leaf.recovered" in actions


def test_the_invoice_case_runs_on_a_real_worker_and_holds_the_payment_once(
    harness: Harness, analyst: Any, officer: Any
) -> None:
    from oversight.actions.gates import DecisionInput, decide_gate
    from oversight.models import Gate, GateKind, GateStatus
    from tests.cases import planned_invoice_case
    from tests.personas import PASSWORD

    case = planned_invoice_case(analyst)
    worker = harness.worker()
    try:
        approve_plan(case, officer)
        wait_until("the report", lambda: leaf(case, "audit-report").status == "succeeded",
                   workers=(worker,))  # fmt: skip
        assert leaf(case, "place-hold").status == NodeStatus.AWAITING_APPROVAL
        step = Gate.objects.get(case=case, kind=GateKind.STEP, status=GateStatus.PENDING)
        decide_gate(
            gate_id=step.pk,
            user=officer,
            decision=DecisionInput(decision="approve", password=PASSWORD),
        )
        wait_until("the case to end", lambda: leaf(case, "place-hold").status == "succeeded",
                   workers=(worker,))  # fmt: skip
    finally:
        worker.stop()
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    report = leaf(case, "audit-report").output
    assert any("duplicate payment" in finding for finding in report["findings"])
    assert ErpPaymentHold.objects.filter(invoice_id="INV-1042").count() == 1
