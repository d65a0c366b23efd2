"""Liveness (RELIABILITY S12): a running case that nothing can move is found and repaired.

Each test makes a case stuck on purpose (a row changed underneath, as a lost message or a bug
would leave it), checks that `why_stuck` and `stuck_cases` see it, and that one reconciler pass
moves it again, audited as `execution.case.stuck`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from accounts.roles import SUPERVISOR
from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from execution import actions as execution
from execution.liveness import STUCK, stuck_cases, why_stuck
from oversight.actions.gates import DecisionInput, decide_gate
from oversight.models import Gate, GateKind, GateStatus
from planning.actions import materialise_plan, submit_case
from planning.catalogue import sync_packs
from planning.models import Case, CaseStatus, NodeStatus, PlanNode
from tests.fakes.execution_pack import SLUG

pytestmark = pytest.mark.django_db


@pytest.fixture
def scripted(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CASEHUB_TEST_EFFECTS_DIR", str(tmp_path))
    settings.CASEHUB_EXTRA_PACKS = ["tests.fakes.execution_pack.PACK"]
    sync_packs()
    return tmp_path


def started(analyst: Any, officer: Any, script: list[dict[str, Any]]) -> Case:
    case = submit_case(
        submitter=analyst,
        title="Scripted",
        goal="Run the script",
        domain=SLUG,
        strategy="static",
        inputs={"leaves": script},
    )
    materialise_plan(case.pk)
    gate = Gate.objects.get(case=case, kind=GateKind.PLAN, status=GateStatus.PENDING)
    decide_gate(gate_id=gate.pk, user=officer, decision=DecisionInput(decision="approve"))
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING
    return case


def node(case: Case, key: str) -> PlanNode:
    return PlanNode.objects.get(version=case.current_version, key=key)


def stuck_events(case: Case) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain=case_chain(case.pk), action=STUCK))


def assert_stuck(case: Case) -> str:
    case.refresh_from_db()
    why = why_stuck(case)
    assert why is not None
    assert stuck_cases() == {case.pk: why}
    return why


TWO = [{"key": "a"}, {"key": "b", "depends_on": ["a"]}]


@pytest.mark.scenario("S12")
def test_a_lost_release_is_found_and_the_reconciler_releases_the_step(scripted, analyst, officer):
    case = started(analyst, officer, TWO)
    assert why_stuck(case) is None and stuck_cases() == {}
    a = node(case, "a")
    execution.complete_leaf(a.pk, execution.claim_leaf(a.pk).attempt, {"label": "a"})
    # The completion's release of b was lost: b stays pending though a succeeded.
    PlanNode.objects.filter(pk=node(case, "b").pk).update(status=NodeStatus.PENDING)
    why = assert_stuck(case)
    assert "b (pending)" in why
    execution.reconcile_execution()
    assert node(case, "b").status == NodeStatus.READY
    (event,) = stuck_events(case)
    assert event.data["action"].startswith("released") and event.data["why"] == why
    assert why_stuck(case) is None
    execution.execute_leaf(node(case, "b").pk, worker="w")
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED
    assert verify_chain(case_chain(case.pk)) == []


@pytest.mark.scenario("S12")
def test_a_running_step_that_nothing_holds_is_made_ready_again(scripted, analyst, officer):
    case = started(analyst, officer, TWO)
    a = node(case, "a")
    claim = execution.claim_leaf(a.pk)
    # A running step with no lease and no work item: the lease reconciler never sees it.
    PlanNode.objects.filter(pk=a.pk).update(lease_until=None)
    assert_stuck(case)
    execution.reconcile_execution()
    a = node(case, "a")
    assert (a.status, a.attempts) == (NodeStatus.READY, claim.attempt)
    recovered = AuditEvent.objects.get(chain=case_chain(case.pk), action="execution.leaf.recovered")
    assert recovered.data["after"] == {"status": "ready"}
    # The old worker's result is refused; the new attempt acts with the same key.
    with pytest.raises(execution.StaleResult):
        execution.complete_leaf(a.pk, claim.attempt + 1, {"label": "a"})
    assert why_stuck(case) is None


@pytest.mark.scenario("S12")
def test_a_step_awaiting_an_approval_no_gate_asks_for_gets_an_escalation(
    scripted, analyst, officer, second_officer
):
    from tests.personas import make_user

    case = started(analyst, officer, TWO)
    PlanNode.objects.filter(pk=node(case, "a").pk).update(status=NodeStatus.AWAITING_APPROVAL)
    assert_stuck(case)
    execution.reconcile_execution()
    gate = Gate.objects.get(case=case, kind=GateKind.ESCALATION, status=GateStatus.PENDING)
    assert gate.node_id == node(case, "a").pk
    assert why_stuck(case) is None
    supervisor = make_user("sue", SUPERVISOR)
    decide_gate(gate_id=gate.pk, user=supervisor, decision=DecisionInput(decision="approve"))
    assert node(case, "a").status == NodeStatus.READY


@pytest.mark.scenario("S12")
@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_a_case_with_no_way_forward_is_escalated_then_ended_as_decided(
    scripted, analyst, officer, decision
):
    from tests.personas import make_user

    case = started(analyst, officer, TWO)
    # a failed, but b was not blocked: b waits for a step that can never succeed.
    PlanNode.objects.filter(pk=node(case, "a").pk).update(status=NodeStatus.FAILED)
    why = assert_stuck(case)
    execution.reconcile_execution()
    gate = Gate.objects.get(case=case, kind=GateKind.ESCALATION, status=GateStatus.PENDING)
    assert gate.node_id is None and why in gate.reason
    assert why_stuck(case) is None
    execution.reconcile_execution()
    assert Gate.objects.filter(case=case, kind=GateKind.ESCALATION).count() == 1
    supervisor = make_user("sue", SUPERVISOR)
    decide_gate(
        gate_id=gate.pk,
        user=supervisor,
        decision=DecisionInput(decision=decision, reason_code="other", reason="no way on"),
    )
    execution.reconcile_execution()
    case.refresh_from_db()
    assert case.status == CaseStatus.FAILED  # the goal needs both steps; reject fails it too
    assert node(case, "b").status == NodeStatus.CANCELLED
    actions = [e.data["action"].split(":")[0] for e in stuck_events(case)]
    assert actions == ["escalated", "ended" if decision == "approve" else "failed"]
    assert stuck_cases() == {}
    assert verify_chain(case_chain(case.pk)) == []


@pytest.mark.scenario("S12")
def test_every_step_ended_but_the_case_did_not(scripted, analyst, officer):
    case = started(analyst, officer, [{"key": "a"}])
    # The plan was approved but the case never started (as if the start was lost halfway).
    Case.objects.filter(pk=case.pk).update(status=CaseStatus.APPROVED)
    PlanNode.objects.filter(pk=node(case, "a").pk).update(status=NodeStatus.SKIPPED)
    why = assert_stuck(case)
    assert "every step of plan version 1 ended" in why
    execution.reconcile_execution()
    case.refresh_from_db()
    assert case.status in (CaseStatus.COMPLETED, CaseStatus.FAILED)
    assert stuck_events(case)[0].data["action"].startswith("verified")


# Found by the stateful test (tests/execution/test_stateful.py) --------------------------------


@pytest.mark.scenario("S8")
def test_a_replan_names_the_steps_of_the_old_version_it_cancels(settings, tmp_path, monkeypatch):
    """A re-plan cancelled the replaced version's ready steps with no event naming them.

    The sequence the state machine found: a re-plan case whose steps run side by side (`parallel`),
    its plan approved, one delivery running `fetch-index` and then `fetch-primary` (claimed by the
    completion), which fails into a re-plan while `prepare` is still ready.
    """
    from tests import personas
    from tests.fakes.replan_pack import PATH, SLUG

    monkeypatch.setenv("CASEHUB_TEST_EFFECTS_DIR", str(tmp_path))
    settings.CASEHUB_EXTRA_PACKS = [PATH]
    sync_packs()
    analyst, officer = personas.analyst(), personas.officer()
    case = submit_case(
        submitter=analyst,
        title="Fetch and report",
        goal="Fetch the data and report",
        domain=SLUG,
        strategy="static",
        inputs={"sources": ["primary", "mirror"], "failing": ["primary"], "parallel": True},
    )
    materialise_plan(case.pk)
    gate = Gate.objects.get(case=case, kind=GateKind.PLAN, status=GateStatus.PENDING)
    decide_gate(gate_id=gate.pk, user=officer, decision=DecisionInput(decision="approve"))
    case.refresh_from_db()
    first = case.current_version
    assert node(case, "prepare").status == NodeStatus.READY
    execution.execute_leaf(node(case, "fetch-index").pk, worker="w")
    assert PlanNode.objects.get(version=first, key="prepare").status == NodeStatus.CANCELLED
    replanned = AuditEvent.objects.get(chain=case_chain(case.pk), action="planning.plan.replanned")
    assert "prepare" in replanned.data["cancelled"]
    assert verify_chain(case_chain(case.pk)) == []
