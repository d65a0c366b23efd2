"""The lock order (docs/architecture.md, "Lock order"): a gate decision against a case's end.

A case ends (a step failed under `abort`) while an officer decides one of its gates. The end
takes the case's row, then voids the open gates; the decision takes the case's row first, then
its gate. Forced into the interleaving that deadlocked on the old order (gate, then case), the
end completes and the decision is refused cleanly. PostgreSQL only: row locks.
"""

from __future__ import annotations

import pytest
from django.db import connection

from audit.chain import case_chain, verify_chain
from execution import actions as execution
from oversight.actions import gates
from oversight.actions.gates import DecisionInput
from oversight.models import Gate, GateDecision, GateKind, GateStatus
from planning.models import CaseStatus, NodeStatus, PlanNode
from tests import personas
from tests.cases import planned_invoice_case
from tests.execution.test_execution import approve, leaves
from tests.lock_order import race_behind_the_case_row


@pytest.mark.scenario("S9")
@pytest.mark.django_db(transaction=True)
def test_a_gate_decision_racing_the_cases_end_never_deadlocks() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (CI runs it)")
    officer, second = personas.officer(), personas.second_officer()
    case = planned_invoice_case(personas.analyst())
    approve(Gate.objects.get(case=case, kind=GateKind.PLAN), officer)
    hold = Gate.objects.get(case=case, kind=GateKind.STEP, node__key="place-hold")
    first = leaves(case)["extract-fields"]
    PlanNode.objects.filter(pk=first.pk).update(failure_policy="abort")
    claim = execution.claim_leaf(first.pk, worker="w")

    def end_the_case() -> object:
        return execution.fail_leaf(
            first.pk, claim.attempt, error_class="tool_failure", error="the scan is unreadable"
        )

    decided, ended = race_behind_the_case_row(
        case.pk,
        lambda: gates.decide_gate(
            gate_id=hold.pk,
            user=second,
            decision=DecisionInput(decision="approve", password=personas.PASSWORD),
        ),
        end_the_case,
    )
    assert not isinstance(ended, BaseException), ended
    assert isinstance(decided, gates.GateConflict), decided
    case.refresh_from_db()
    assert case.status == CaseStatus.FAILED
    assert leaves(case)["extract-fields"].status == NodeStatus.FAILED
    hold.refresh_from_db()
    assert hold.status == GateStatus.VOID
    assert not GateDecision.objects.filter(gate=hold).exists()
    assert verify_chain(case_chain(case.pk)) == []
