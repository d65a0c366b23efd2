"""Execution in one process: claims, completion, fencing, failure policies, cancel and stop.

Task bodies are called directly here (STYLE: unit tests may); the integration suite runs the
same actions on real Celery workers (tests/integration/test_execution_faults.py).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery.signals import before_task_publish
from django.db import connection

from audit.models import AuditEvent
from execution import actions as execution
from execution import dispatch
from execution.models import LeafAttempt, WorkItem
from oversight.actions.gates import DecisionInput, decide_gate
from oversight.models import Gate, GateKind, GateStatus
from planning.models import Case, CaseStatus, ErpPaymentHold, NodeStatus, PlanNode
from tests.cases import planned_invoice_case
from tests.personas import PASSWORD

pytestmark = pytest.mark.django_db


def _gate(case: Case, kind: str, key: str | None = None) -> Gate:
    gates = Gate.objects.filter(case=case, kind=kind, status=GateStatus.PENDING)
    if key is not None:
        gates = gates.filter(node__key=key)
    return gates.get()


def approve(gate: Gate, user: Any, *, password: str | None = None) -> None:
    decide_gate(
        gate_id=gate.pk,
        user=user,
        decision=DecisionInput(decision="approve", password=password),
    )


def leaves(case: Case) -> dict[str, PlanNode]:
    return {n.key: n for n in PlanNode.objects.filter(version=case.current_version, kind="leaf")}


def run_ready(case: Case) -> list[str]:
    """Run every ready leaf of the case like a worker would, until none is ready."""
    outcomes: list[str] = []
    while True:
        ready = [n for n in leaves(case).values() if n.status == NodeStatus.READY]
        if not ready:
            return outcomes
        for node in ready:
            outcomes += execution.execute_leaf(node.pk, worker="test")


def test_approving_the_plan_starts_the_case_and_readies_only_the_first_leaf(analyst, officer):
    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING
    status = {k: n.status for k, n in leaves(case).items()}
    assert status["extract-fields"] == NodeStatus.READY
    assert status["lookup-supplier"] == NodeStatus.PENDING
    assert status["place-hold"] == NodeStatus.AWAITING_APPROVAL


def test_the_invoice_case_runs_finds_the_duplicate_waits_at_the_hold_and_completes(
    analyst, officer
):
    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    run_ready(case)
    nodes = leaves(case)
    assert nodes["audit-report"].status == NodeStatus.SUCCEEDED, {
        k: (n.status, n.error) for k, n in nodes.items()
    }
    report = nodes["audit-report"].output
    assert report["recommendation"] == "hold"
    assert any("duplicate payment" in f for f in report["findings"])
    assert nodes["place-hold"].status == NodeStatus.AWAITING_APPROVAL
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING
    approve(_gate(case, GateKind.STEP, "place-hold"), officer, password=PASSWORD)
    run_ready(case)
    nodes = leaves(case)
    assert nodes["place-hold"].status == NodeStatus.SUCCEEDED
    assert nodes["place-hold"].output["placed"] is True
    assert ErpPaymentHold.objects.filter(invoice_id="INV-1042").count() == 1
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert case.verification["passed"] is True
    assert "the Invoice verification rules hold" in case.verification["checks"]


def test_a_duplicate_message_is_refused_and_a_stale_result_is_fenced_off(analyst, officer):
    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    first = leaves(case)["extract-fields"]
    claim = execution.claim_leaf(first.pk, worker="a")
    with pytest.raises(execution.ClaimRefused):
        execution.claim_leaf(first.pk, worker="b")
    # The lease runs out; the reconciler hands the leaf to a new attempt.
    PlanNode.objects.filter(pk=first.pk).update(lease_until="2000-01-01T00:00:00Z")
    assert execution.reconcile_execution().recovered == (first.pk,)
    second = execution.claim_leaf(first.pk, worker="b")
    assert second.attempt == claim.attempt + 1
    assert second.idempotency_key == claim.idempotency_key
    with pytest.raises(execution.StaleResult):
        execution.complete_leaf(first.pk, claim.attempt, {"anything": 1})
    outcomes = LeafAttempt.objects.filter(node=first).values_list("number", "outcome")
    assert dict(outcomes) == {1: "lost", 2: "running"}
    refused = AuditEvent.objects.filter(action="execution.leaf.result_refused").get()
    assert refused.data["attempt"] == claim.attempt and refused.data["holder"] == second.attempt


def test_cancel_skips_queued_leaves_and_nothing_new_is_claimed(analyst, officer):
    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    first = leaves(case)["extract-fields"]
    execution.cancel_case(case_id=case.pk, user=analyst, reason_code="other", reason="wrong one")
    with pytest.raises(execution.ClaimRefused):
        execution.claim_leaf(first.pk, worker="a")
    assert {n.status for n in leaves(case).values()} == {NodeStatus.CANCELLED}
    with pytest.raises(execution.CaseNotRunning):
        execution.cancel_case(
            case_id=case.pk, user=analyst, reason_code="other", reason="not needed"
        )


def test_the_global_stop_holds_ready_leaves_and_resume_runs_them_once(analyst, officer, admin_user):
    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    execution.set_stopped(stopped=True, user=admin_user, reason="maintenance")
    first = leaves(case)["extract-fields"]
    assert execution.execute_leaf(first.pk, worker="a") == [
        f"{first.pk} refused: execution is stopped"
    ]
    assert leaves(case)["extract-fields"].status == NodeStatus.READY
    execution.set_stopped(stopped=False, user=admin_user)
    execution.execute_leaf(first.pk, worker="a")
    assert leaves(case)["extract-fields"].attempts == 1
    assert WorkItem.objects.count() == 0


@pytest.mark.scenario("O4", "R4", "R3")
def test_an_approval_that_expired_before_execution_never_runs_and_a_new_one_is_asked_for(
    analyst, officer, second_officer
):
    from django.utils import timezone

    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    hold = _gate(case, GateKind.STEP, "place-hold")
    approve(hold, officer, password=PASSWORD)
    Gate.objects.filter(pk=hold.pk).update(
        approval_expires_at=timezone.now() - timezone.timedelta(minutes=1)
    )
    run_ready(case)
    nodes = leaves(case)
    assert nodes["place-hold"].status == NodeStatus.AWAITING_APPROVAL
    assert nodes["place-hold"].attempts == 0
    assert ErpPaymentHold.objects.filter(invoice_id="INV-1042").count() == 0
    hold.refresh_from_db()
    assert hold.status == GateStatus.VOID  # closed: an `expired` gate is one held, still open
    refusal = AuditEvent.objects.get(action="execution.leaf.claim_refused")
    assert "approval expired" in refusal.data["why"]
    fresh = _gate(case, GateKind.STEP, "place-hold")
    assert fresh.pk != hold.pk and "re-approval needed" in fresh.reason
    approve(fresh, second_officer, password=PASSWORD)
    run_ready(case)
    assert leaves(case)["place-hold"].status == NodeStatus.SUCCEEDED
    assert ErpPaymentHold.objects.filter(invoice_id="INV-1042").count() == 1
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification


@pytest.mark.scenario("O5")
def test_a_step_changed_after_its_approval_is_not_run(analyst, officer):
    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    hold = _gate(case, GateKind.STEP, "place-hold")
    approve(hold, officer, password=PASSWORD)
    # Whatever changed the row behind the approval's back, the hash no longer matches.
    PlanNode.objects.filter(pk=hold.node_id).update(content_hash="0" * 64)
    run_ready(case)
    assert leaves(case)["place-hold"].status == NodeStatus.AWAITING_APPROVAL
    refusal = AuditEvent.objects.get(action="execution.leaf.claim_refused")
    assert "content hash differs" in refusal.data["why"]
    assert ErpPaymentHold.objects.count() == 0


@pytest.mark.scenario("L3")
@pytest.mark.parametrize(
    "invoice_id",
    [
        "../../etc/passwd",
        "file:///etc/passwd",
        "http://169.254.169.254/latest/meta-data/",
        "INV-1042'; DROP TABLE planning_case; --",
        10**400,
        {"$gt": ""},
    ],
)
def test_hostile_tool_arguments_are_refused_by_the_tools_schema_before_the_tool_runs(
    analyst, officer, invoice_id, monkeypatch
):
    import socket

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a tool tried to open a connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    case = planned_invoice_case(analyst)
    first = leaves(case)["extract-fields"]
    PlanNode.objects.filter(pk=first.pk).update(inputs={"invoice_id": invoice_id})
    PlanNode.objects.filter(pk=first.pk).update(
        content_hash=PlanNode.objects.get(pk=first.pk).content_hash
    )
    approve(_gate(case, GateKind.PLAN), officer)
    execution.execute_leaf(first.pk, worker="test")
    node = leaves(case)["extract-fields"]
    assert node.status == NodeStatus.FAILED
    assert node.error_class == "invalid_input"
    assert "extract_invoice_fields refused its inputs" in node.error


@pytest.mark.scenario("E12", "R8")
def test_cancelling_a_case_whose_human_step_waits_ends_the_step_and_its_work_item(analyst, officer):
    from planning.models import Agent

    case = planned_invoice_case(analyst)
    first = leaves(case)["extract-fields"]
    Agent.objects.filter(slug=first.agent).update(kind="human")
    approve(_gate(case, GateKind.PLAN), officer)
    assert execution.execute_leaf(first.pk, worker="test") == [f"{first.pk} waits for a person"]
    item = WorkItem.objects.get(node=first)
    execution.cancel_case(case_id=case.pk, user=officer, reason_code="other", reason="not needed")
    item.refresh_from_db()
    assert item.status == WorkItem.Status.CANCELLED
    assert leaves(case)["extract-fields"].status == NodeStatus.CANCELLED
    assert {n.status for n in leaves(case).values()} == {NodeStatus.CANCELLED}


def _leaf_events(case: Case, action: str, key: str) -> list[AuditEvent]:
    return [
        e
        for e in AuditEvent.objects.filter(chain=f"case:{case.pk}", action=action).order_by("seq")
        if e.data.get("node") == key
    ]


@pytest.mark.scenario("S8")
def test_the_reconciler_records_a_retrying_step_made_ready_once(analyst, officer):
    from datetime import timedelta

    from django.utils import timezone

    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    first = leaves(case)["extract-fields"]
    PlanNode.objects.filter(pk=first.pk).update(failure_policy="retry")
    claim = execution.claim_leaf(first.pk, worker="a")
    execution.fail_leaf(first.pk, claim.attempt, error_class="transient", error="upstream busy")
    assert leaves(case)["extract-fields"].status == NodeStatus.RETRYING
    later = timezone.now() + timedelta(minutes=5)
    assert execution.reconcile_execution(later).retried == (first.pk,)
    assert execution.reconcile_execution(later).retried == ()
    assert leaves(case)["extract-fields"].status == NodeStatus.READY
    (event,) = _leaf_events(case, "execution.leaf.retry_ready", "extract-fields")
    assert event.data["attempt"] == claim.attempt
    assert (event.data["before"], event.data["after"]) == (
        {"status": "retrying"},
        {"status": "ready"},
    )


@pytest.mark.scenario("S8")
def test_the_reconciler_records_a_lost_step_of_a_cancelled_case_it_cancels(analyst, officer):
    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    first = leaves(case)["extract-fields"]
    claim = execution.claim_leaf(first.pk, worker="a")
    execution.cancel_case(case_id=case.pk, user=officer, reason_code="duplicate", reason="twice")
    # The worker died before its safe point: its lease runs out on a case that no longer runs.
    PlanNode.objects.filter(pk=first.pk).update(lease_until="2000-01-01T00:00:00Z")
    execution.reconcile_execution()
    node = leaves(case)["extract-fields"]
    assert (node.status, node.lease_until) == (NodeStatus.CANCELLED, None)
    (event,) = _leaf_events(case, "execution.leaf.cancelled", "extract-fields")
    assert event.data["attempt"] == claim.attempt
    assert event.data["why"] == "its lease expired and the case is cancelled"
    assert (event.data["before"], event.data["after"]) == (
        {"status": "running"},
        {"status": "cancelled"},
    )
    execution.reconcile_execution()
    assert len(_leaf_events(case, "execution.leaf.cancelled", "extract-fields")) == 1


@pytest.mark.scenario("S7", "E12", "O11")
@pytest.mark.parametrize("how", ["cancel", "stop"])
def test_a_cancel_or_stop_between_a_human_steps_claim_and_its_work_item_opens_no_item(
    analyst, officer, admin_user, how
):
    from datetime import timedelta

    from django.utils import timezone

    from execution.work_items import sweep_work_items
    from execution.worker import _run_claimed  # what a worker does with a claim it holds
    from planning.models import Agent

    case = planned_invoice_case(analyst)
    first = leaves(case)["extract-fields"]
    Agent.objects.filter(slug=first.agent).update(kind="human")
    approve(_gate(case, GateKind.PLAN), officer)
    claim = execution.claim_leaf(first.pk, worker="a")
    if how == "cancel":
        execution.cancel_case(case_id=case.pk, user=officer, reason_code="duplicate", reason="x")
    else:
        execution.set_stopped(stopped=True, user=admin_user, reason="maintenance")
    # The worker goes on to its runner, which would open the step's work item.
    ended = _run_claimed(claim, worker="a")
    assert ended is not None, "the step waits for a person on a cancelled or stopped case"
    assert not WorkItem.objects.filter(status=WorkItem.Status.OPEN).exists()
    node = leaves(case)["extract-fields"]
    after = NodeStatus.CANCELLED if how == "cancel" else NodeStatus.READY
    assert (node.status, node.lease_until) == (after, None)
    (stopped,) = _leaf_events(case, "execution.leaf.stopped", "extract-fields")
    assert (stopped.data["attempt"], stopped.data["after"]) == (claim.attempt, after)
    assert sweep_work_items(timezone.now() + timedelta(days=3)) == {"reminded": 0, "escalated": 0}
    if how == "stop":
        # Resumed, the step runs again and waits for a person with one work item.
        execution.set_stopped(stopped=False, user=admin_user)
        assert execution.execute_leaf(first.pk, worker="b") == [f"{first.pk} waits for a person"]
        item = WorkItem.objects.get(status=WorkItem.Status.OPEN)
        assert (item.node_id, item.attempt) == (first.pk, claim.attempt + 1)


def test_a_cancelled_cases_result_says_who_cancelled_it_and_why(analyst: Any, officer: Any) -> None:
    from django.test import Client
    from django.urls import reverse

    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    execution.cancel_case(
        case_id=case.pk, user=officer, reason_code="duplicate", reason="paid last week"
    )
    client = Client()
    client.force_login(analyst)
    page = client.get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    result = page.split('id="case-result"', 1)[1].split("</section>", 1)[0]
    assert f"The case was cancelled by {officer.username}</strong>" in result, result
    assert "Why: Duplicate of other work — paid last week" in result, result


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements")
def test_a_leafs_hot_statements_are_prepared_once_per_connection(analyst, officer):
    """The claim with its facts, the completion's read, the lock and release of dependents, the
    attempt's end, the check for open work and the audit append are bound on the server and
    prepared by the first leaf; the leaves after it reuse them."""

    def prepared() -> dict[str, int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            texts = [row[0] for row in cursor.fetchall()]
        marks = {
            "claim facts": "json_agg(json_build_object('id', g.id",
            "release": "jsonb_array_elements_text(n.depends_on)",
            "attempt ended": '"ended" AS (UPDATE',
            "audit append": "prev_hash = head_hash, head_hash = encode(sha256(",
            "leaf claimed": "FOR UPDATE OF n SKIP LOCKED",
            "leaf completed": "FOR UPDATE OF n FOR SHARE OF c",
            "dependents locked": "WHERE n.id = p.id AND",
            "open work": "WHERE g.version_id = $4 AND g.status = ANY($5)",
        }
        return {name: sum(mark in text for text in texts) for name, mark in marks.items()}

    case = planned_invoice_case(analyst)
    approve(_gate(case, GateKind.PLAN), officer)
    run_ready(case)
    after_the_run = prepared()
    assert all(after_the_run.values()), after_the_run
    assert leaves(case)["audit-report"].status == NodeStatus.SUCCEEDED


def test_a_leaf_and_a_goal_judgement_are_sent_as_storing_no_result() -> None:
    """Both tasks store no result; their messages say so, or Celery would subscribe the sender
    to each result's channel on a Redis result backend (a round trip each send)."""
    seen: dict[str, Any] = {}

    def record(sender: str | None = None, headers: Any = None, **kwargs: Any) -> None:
        seen[str(sender)] = dict(headers or {})

    before_task_publish.connect(record, weak=False)
    try:
        dispatch.send_leaf(0)
        dispatch.send_goal_judge(0, time_limit_s=5)
    finally:
        before_task_publish.disconnect(record)
    assert seen[dispatch.RUN_LEAF]["ignore_result"] is True
    assert seen[dispatch.JUDGE_GOAL]["ignore_result"] is True


@pytest.mark.parametrize(("countdown", "whole"), [(0.3, 1), (1.2, 2), (3.0, 3)])
def test_a_leaf_sent_with_a_countdown_waits_whole_seconds_never_less(
    countdown: float, whole: int
) -> None:
    """RabbitMQ's delayed delivery counts whole seconds and drops the fraction (kombu refuses a
    countdown under one): a retry's message would come early, or not at all."""
    seen: dict[str, Any] = {}

    def record(sender: str | None = None, headers: Any = None, **kwargs: Any) -> None:
        seen[str(sender)] = dict(headers or {})

    before_task_publish.connect(record, weak=False)
    try:
        sent = datetime.now(UTC)
        dispatch.send_leaf(0, countdown=countdown)
        done = datetime.now(UTC)
    finally:
        before_task_publish.disconnect(record)
    eta = datetime.fromisoformat(seen[dispatch.RUN_LEAF]["eta"])
    assert sent + timedelta(seconds=whole) <= eta <= done + timedelta(seconds=whole)
