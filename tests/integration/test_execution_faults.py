"""Execution on real Celery workers under faults (RELIABILITY E1 to E12, O11): nothing is lost, and
nothing acts twice. Effects are counted by idempotency key (tests/fakes/execution_pack.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from audit.models import AuditEvent
from execution.models import LeafAttempt
from planning.models import (
    CaseStatus,
    ErpPaymentHold,
    EstateDatabase,
    EstateFailover,
    EstateHost,
    EstateIsolation,
    EstateNotice,
    FraudAccountFreeze,
    NodeStatus,
    PlanNode,
)
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


def _notified(case: Any) -> Callable[[], bool]:
    return lambda: leaf(case, "notify-stakeholders").status == NodeStatus.SUCCEEDED


@pytest.mark.scenario("E6")
def test_incident_cases_on_real_workers_fail_over_and_notify_once_even_with_messages_repeated(
    harness: Harness, analyst: Any, officer: Any
) -> None:
    from execution import dispatch
    from oversight.actions.gates import DecisionInput, decide_gate
    from oversight.models import Gate, GateKind, GateStatus
    from tests.execution.test_pack_outcomes import NOT_RESTORED, outage_case
    from tests.personas import PASSWORD

    restored = outage_case(analyst, "orders-db")
    refuted = outage_case(analyst, "inventory-db")
    first, second = harness.worker(), harness.worker()
    try:
        for case in (restored, refuted):
            approve_plan(case, officer)
            for gate in Gate.objects.filter(
                case=case, kind=GateKind.STEP, status=GateStatus.PENDING
            ):
                decide_gate(
                    gate_id=gate.pk,
                    user=officer,
                    decision=DecisionInput(decision="approve", password=PASSWORD),
                )
            for key in ("fail-over", "notify-stakeholders"):
                for _ in range(3):  # the message redelivered, and sent again by a second scheduler
                    dispatch.send_leaf(leaf(case, key).pk)
        for case in (restored, refuted):
            wait_until("the case to end", _notified(case), workers=(first, second))
    finally:
        first.stop()
        second.stop()
    restored.refresh_from_db()
    refuted.refresh_from_db()
    assert restored.status == CaseStatus.COMPLETED, restored.verification
    assert refuted.status == CaseStatus.FAILED
    assert refuted.verification["reasons"] == [NOT_RESTORED]
    for case in (restored, refuted):
        assert leaf(case, "fail-over").attempts == leaf(case, "notify-stakeholders").attempts == 1
    assert EstateFailover.objects.filter(service="orders-db").count() == 1
    assert EstateFailover.objects.filter(service="inventory-db").count() == 1
    assert EstateNotice.objects.count() == 2
    assert EstateDatabase.objects.get(service="orders-db").current_primary == "db-orders-2"


@pytest.mark.scenario("E6")
def test_a_breach_case_on_real_workers_isolates_and_announces_once_with_messages_repeated(
    harness: Harness, analyst: Any, officer: Any, settings: Any
) -> None:
    from accounts import roles
    from execution import dispatch
    from execution.models import WorkItem
    from execution.work_items import complete_work_item
    from oversight.actions.gates import DecisionInput, decide_gate
    from oversight.models import Gate, GateKind, GateStatus
    from planning.actions import materialise_plan, submit_case
    from tests import personas
    from tests.personas import PASSWORD

    settings.OPENAI_BASE_URL = settings.OPENAI_API_KEY = ""  # a person reads the logs
    case = submit_case(
        submitter=analyst,
        title="web-2 was broken into",
        goal="Contain the breach on web-2",
        domain="incident",
        strategy="static",
        inputs={"kind": "security-breach", "service": "web", "affected_hosts": ["web-2"]},
    )
    materialise_plan(case.pk)
    reader: Any = personas.make_user("ben", roles.ANALYST)
    first, second = harness.worker(), harness.worker()
    try:
        approve_plan(case, officer)
        for gate in Gate.objects.filter(case=case, kind=GateKind.STEP, status=GateStatus.PENDING):
            decide_gate(
                gate_id=gate.pk,
                user=officer,
                decision=DecisionInput(decision="approve", password=PASSWORD),
            )
        for key in ("isolate-systems", "announce-containment"):
            for _ in range(3):  # the message redelivered, and sent again by a second scheduler
                dispatch.send_leaf(leaf(case, key).pk)
        wait_until("the logs' work item",
                   lambda: WorkItem.objects.filter(case=case, status="open").exists(),
                   workers=(first, second))  # fmt: skip
        complete_work_item(
            item_id=WorkItem.objects.get(case=case, status="open").pk,
            user=reader,
            output={"attack_path": "root over ssh from 203.0.113.9, then 4.2 GB out"},
        )
        wait_until("the announcement",
                   lambda: leaf(case, "announce-containment").status == NodeStatus.SUCCEEDED,
                   workers=(first, second))  # fmt: skip
    finally:
        first.stop()
        second.stop()
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert leaf(case, "isolate-systems").attempts == 1
    assert EstateIsolation.objects.count() == 1
    assert EstateNotice.objects.count() == 1
    assert EstateHost.objects.get(name="web-2").is_isolated


@pytest.mark.scenario("E6")
def test_a_serious_fraud_case_on_real_workers_freezes_the_account_once_with_messages_repeated(
    harness: Harness, analyst: Any, officer: Any, settings: Any
) -> None:
    from accounts import roles
    from execution import dispatch
    from execution.models import WorkItem
    from execution.work_items import complete_work_item
    from oversight.actions.gates import DecisionInput, decide_gate
    from oversight.models import Gate, GateKind, GateStatus
    from planning.actions import materialise_plan, submit_case
    from tests import personas
    from tests.personas import PASSWORD

    settings.OPENAI_BASE_URL = settings.OPENAI_API_KEY = ""  # people write the findings
    case = submit_case(
        submitter=analyst,
        title="ACC-300 paid a sanctioned company",
        goal="Investigate ACC-300",
        domain="fraud",
        strategy="static",
        inputs={"account_id": "ACC-300", "amount": "12500"},
    )
    materialise_plan(case.pk)
    worker_person: Any = personas.make_user("ben", roles.ANALYST)
    first, second = harness.worker(), harness.worker()
    try:
        approve_plan(case, officer)
        for gate in Gate.objects.filter(case=case, kind=GateKind.STEP, status=GateStatus.PENDING):
            decide_gate(
                gate_id=gate.pk,
                user=officer,
                decision=DecisionInput(decision="approve", password=PASSWORD),
            )
        for _ in range(3):  # the message redelivered, and sent again by a second scheduler
            dispatch.send_leaf(leaf(case, "freeze-account").pk)
        while leaf(case, "freeze-account").status != NodeStatus.SUCCEEDED:
            wait_until("a person's step or the freeze",
                       lambda: WorkItem.objects.filter(case=case, status="open").exists()
                       or leaf(case, "freeze-account").status == NodeStatus.SUCCEEDED,
                       workers=(first, second))  # fmt: skip
            for item in WorkItem.objects.filter(case=case, status="open"):
                complete_work_item(
                    item_id=item.pk, user=worker_person, output={"notes": "done as asked"}
                )
    finally:
        first.stop()
        second.stop()
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert "the Fraud investigation rules hold" in case.verification["checks"]
    assert leaf(case, "freeze-account").attempts == 1
    assert FraudAccountFreeze.objects.filter(account_id="ACC-300").count() == 1


@pytest.mark.scenario("S11", "E8")
def test_a_retry_starts_when_its_backoff_message_arrives_not_at_a_reconciler_pass(
    harness: Harness, analyst: Any, officer: Any
) -> None:
    case = harness.case(
        analyst, [{"key": "flaky", "tool": "flaky", "failures": 1, "failure_policy": "retry"}]
    )
    # A real backoff (up to a second), and no reconciler: only the countdown message can start it.
    worker = harness.worker(CASEHUB_LEAF_RETRY_BASE_S=1, CASEHUB_LEAF_RETRY_MAX_S=1)
    try:
        approve_plan(case, officer)
        wait_until("the retry to succeed", lambda: leaf(case, "flaky").status == "succeeded",
                   timeout=30, reconcile=False, workers=(worker,))  # fmt: skip
    finally:
        worker.stop()
    assert leaf(case, "flaky").attempts == 2
    assert harness.effects_of(case, "flaky") == (1, 2)
    retrying = AuditEvent.objects.get(action="execution.leaf.retrying", data__node="flaky")
    claimed = AuditEvent.objects.filter(action="execution.leaf.claimed", data__node="flaky")
    claims = list(claimed.order_by("pk"))
    assert [c.data["before"]["status"] for c in claims] == ["ready", "retrying"]
    waited = (claims[1].time - retrying.time).total_seconds()
    assert waited >= retrying.data["retry_in_s"] - 0.05, (waited, retrying.data)


@pytest.mark.scenario("E6")
def test_the_same_message_delivered_again_and_two_workers_racing_claim_once(
    harness: Harness, analyst: Any, officer: Any
) -> None:
    from execution import dispatch

    case = harness.case(analyst, [{"key": "once", "seconds": 1}])
    approve_plan(case, officer)
    node = leaf(case, "once")
    for _ in range(4):  # the message redelivered, and sent again by a second scheduler
        dispatch.send_leaf(node.pk)
    first, second = harness.worker(), harness.worker()
    try:
        wait_until("the leaf to end", lambda: leaf(case, "once").status == "succeeded",
                   reconcile=False, workers=(first, second))  # fmt: skip
    finally:
        first.stop()
        second.stop()
    assert leaf(case, "once").attempts == 1
    assert harness.effects_of(case, "once") == (1, 1)
    assert AuditEvent.objects.filter(action="execution.leaf.claimed").count() == 1


@pytest.mark.scenario("E8")
def test_transient_failures_back_off_then_succeed_and_a_permanent_one_is_not_retried(
    harness: Harness, analyst: Any, officer: Any
) -> None:
    case = harness.case(
        analyst,
        [
            {"key": "flaky", "tool": "flaky", "failures": 2, "failure_policy": "retry"},
            {"key": "broken", "tool": "fail", "failure_policy": "retry"},
            {"key": "after", "depends_on": ["broken"]},
        ],
    )
    worker = harness.worker()
    try:
        approve_plan(case, officer)

        def settled() -> bool:
            return (leaf(case, "flaky").status, leaf(case, "broken").status) == (
                "succeeded",
                "awaiting_approval",
            )

        wait_until("both to settle", settled, workers=(worker,))
    finally:
        worker.stop()
    flaky = leaf(case, "flaky")
    assert flaky.attempts == 3
    assert harness.effects_of(case, "flaky") == (1, 3)
    outcomes = LeafAttempt.objects.filter(node=flaky).values_list("outcome", "error_class")
    assert list(outcomes) == [("failed", "transient"), ("failed", "transient"), ("succeeded", "")]
    retries = AuditEvent.objects.filter(action="execution.leaf.retrying", data__node="flaky")
    assert retries.count() == 2
    broken = leaf(case, "broken")
    assert broken.attempts == 1  # a permanent failure is not retried: a person decides
    assert broken.error_class == "tool_failure" and "malformed" in broken.error
    from oversight.models import Gate

    escalation = Gate.objects.get(case=case, kind="escalation", status="pending")
    assert escalation.node_id == broken.pk
    assert leaf(case, "after").status == NodeStatus.PENDING


@pytest.mark.scenario("E9")
def test_soft_and_hard_time_limits_time_the_leaf_out_and_it_is_not_run_again(
    harness: Harness, analyst: Any, officer: Any
) -> None:
    case = harness.case(
        analyst,
        [
            {"key": "soft", "seconds": 30, "failure_policy": "continue"},
            {"key": "hard", "tool": "stubborn", "seconds": 40, "failure_policy": "continue"},
        ],
    )
    worker = harness.worker()
    try:
        approve_plan(case, officer)

        def timed_out() -> bool:
            return leaf(case, "soft").status == leaf(case, "hard").status == "failed"

        wait_until("both to time out", timed_out, timeout=60, workers=(worker,))
        for _ in range(10):  # the reconciler keeps running: nothing starts them again
            from execution import actions as execution

            execution.reconcile_execution()
    finally:
        worker.stop()
    soft, hard = leaf(case, "soft"), leaf(case, "hard")
    assert (soft.error_class, soft.attempts) == ("timeout", 1)
    assert "soft time limit" in soft.error
    assert (hard.error_class, hard.attempts) == ("timeout", 1)
    assert "hard time limit" in hard.error
    assert harness.effects_of(case, "soft")[0] == 0 and harness.effects_of(case, "hard")[0] == 0
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED  # both failures were allowed to continue


@pytest.mark.scenario("E10")
def test_a_worker_stopped_past_its_lease_loses_the_leaf_and_acts_nothing_when_it_resumes(
    harness: Harness, analyst: Any, officer: Any
) -> None:
    from tests.integration.execution import stopped

    case = harness.case(analyst, [{"key": "slow", "seconds": 3}])
    first = harness.worker()
    try:
        approve_plan(case, officer)
        wait_until("the first worker to run it", lambda: leaf(case, "slow").status == "running",
                   workers=(first,))  # fmt: skip
        with stopped(first):
            wait_until("the reconciler to take the leaf back",
                       lambda: LeafAttempt.objects.filter(outcome="lost").exists(),
                       workers=(first,))  # fmt: skip
            second = harness.worker()
            try:

                def finished() -> bool:
                    return leaf(case, "slow").status == "succeeded"

                wait_until("the second worker to finish it", finished, workers=(second,))
            finally:
                second.stop()
        # The first worker wakes up, reaches its safe point before the effect, and stops there.
        pk = leaf(case, "slow").pk
        wait_until("the first worker to give up", lambda: f"'{pk} stale" in first.log(),
                   reconcile=False, workers=(first,))  # fmt: skip
    finally:
        first.stop()
    assert harness.effects_of(case, "slow")[0] == 1
    node = leaf(case, "slow")
    assert node.attempts == 2 and node.status == NodeStatus.SUCCEEDED
    assert list(LeafAttempt.objects.filter(node=node).values_list("outcome", flat=True)) == [
        "lost",
        "succeeded",
    ]


@pytest.mark.scenario("E11")
def test_fifty_parents_finishing_together_start_their_child_exactly_once(
    harness: Harness, analyst: Any, officer: Any, settings: Any
) -> None:
    settings.CASEHUB_PLAN_MAX_FANOUT = 60
    parents = [{"key": f"p{i}"} for i in range(50)]
    case = harness.case(
        analyst, [*parents, {"key": "child", "depends_on": [p["key"] for p in parents]}]
    )
    worker = harness.worker(concurrency=4)
    try:
        approve_plan(case, officer)
        wait_until("the child", lambda: leaf(case, "child").status == "succeeded",
                   workers=(worker,))  # fmt: skip
    finally:
        worker.stop()
    child = leaf(case, "child")
    assert child.attempts == 1
    assert harness.effects_of(case, "child") == (1, 1)
    finished = [leaf(case, p["key"]).finished_at for p in parents]
    assert child.started_at is not None and all(f is not None for f in finished)
    assert child.started_at >= max(f for f in finished if f is not None)
    released = [
        event.data["node"]
        for event in AuditEvent.objects.filter(action="execution.leaf.succeeded")
        if "child" in event.data["released"]
    ]
    assert len(released) == 1  # exactly one parent's completion released the child


@pytest.mark.scenario("E12")
def test_a_cancelled_case_skips_queued_leaves_and_stops_running_ones_before_their_effect(
    harness: Harness, analyst: Any, officer: Any
) -> None:
    from execution import actions as execution

    case = harness.case(
        analyst,
        [{"key": "running", "seconds": 3}, {"key": "queued", "depends_on": ["running"]}],
    )
    worker = harness.worker()
    try:
        approve_plan(case, officer)
        wait_until("the first leaf to run", lambda: leaf(case, "running").status == "running",
                   workers=(worker,))  # fmt: skip
        execution.cancel_case(case_id=case.pk, user=analyst, reason_code="other", reason="stop")
        wait_until("the running leaf to stop", lambda: leaf(case, "running").status == "cancelled",
                   workers=(worker,))  # fmt: skip
    finally:
        worker.stop()
    assert leaf(case, "queued").status == NodeStatus.CANCELLED
    assert leaf(case, "queued").attempts == 0
    assert harness.effects_of(case, "running") == (0, 1)
    case.refresh_from_db()
    assert case.status == CaseStatus.CANCELLED


@pytest.mark.scenario("O11")
def test_the_global_stop_holds_everything_and_resume_runs_nothing_twice(
    harness: Harness, analyst: Any, officer: Any, admin_user: Any
) -> None:
    from execution import actions as execution

    case = harness.case(
        analyst,
        [{"key": "long", "seconds": 3}, {"key": "a", "seconds": 0.5}, {"key": "b"}],
    )
    worker = harness.worker(concurrency=1)
    try:
        approve_plan(case, officer)
        wait_until("a leaf to run", lambda: any(leaf(case, k).status == "running"
                   for k in ("long", "a", "b")), workers=(worker,))  # fmt: skip
        execution.set_stopped(stopped=True, user=admin_user, reason="incident")
        wait_until("nothing to run", lambda: not any(leaf(case, k).status == "running"
                   for k in ("long", "a", "b")), workers=(worker,))  # fmt: skip
        claimed = AuditEvent.objects.filter(action="execution.leaf.claimed").count()
        for _ in range(10):
            execution.reconcile_execution()
        assert AuditEvent.objects.filter(action="execution.leaf.claimed").count() == claimed
        assert {leaf(case, k).status for k in ("long", "a", "b")} <= {"ready", "succeeded"}
        execution.set_stopped(stopped=False, user=admin_user)
        wait_until("all to finish", lambda: all(leaf(case, k).status == "succeeded"
                   for k in ("long", "a", "b")), workers=(worker,))  # fmt: skip
    finally:
        worker.stop()
    for key in ("long", "a", "b"):
        assert harness.effects_of(case, key)[0] == 1, key
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED


@pytest.mark.scenario("E2")
def test_a_poison_leaf_is_dead_lettered_with_an_escalation_gate(
    harness: Harness, analyst: Any, officer: Any
) -> None:
    from oversight.models import Gate

    case = harness.case(analyst, [{"key": "poison", "tool": "kill_worker"}])
    worker = harness.worker()
    try:
        approve_plan(case, officer)
        wait_until("the dead letter", lambda: leaf(case, "poison").error_class == "poison",
                   timeout=90, workers=(worker,))  # fmt: skip
        for _ in range(10):
            from execution import actions as execution

            execution.reconcile_execution()
    finally:
        worker.stop()
    node = leaf(case, "poison")
    assert node.attempts == 3
    assert node.status == NodeStatus.AWAITING_APPROVAL
    assert harness.effects_of(case, "poison")[1] == 3
    gate = Gate.objects.get(case=case, kind="escalation", status="pending")
    assert "dead-lettered" in gate.reason


def _rss_kb(worker: Any) -> int:
    """Return the resident memory of a worker's processes (main and pool children), in kB."""
    import subprocess

    pids = subprocess.run(
        ["pgrep", "-g", str(worker.process.pid)], capture_output=True, text=True
    ).stdout.split()
    total = 0
    for pid in pids:
        try:
            status = open(f"/proc/{pid}/status").read()  # noqa: SIM115
        except OSError:
            continue
        total += next(int(line.split()[1]) for line in status.splitlines() if "VmRSS" in line)
    return total


@pytest.mark.scenario("P2")
def test_a_thousand_leaves_on_two_workers_all_complete_once_and_memory_stays_flat(
    harness: Harness, analyst: Any, officer: Any, settings: Any
) -> None:
    settings.CASEHUB_PLAN_MAX_LEAVES = 1001
    settings.CASEHUB_PLAN_MAX_FANOUT = 1001
    case = harness.case(analyst, [{"key": f"n{i}"} for i in range(1000)])
    worker = harness.worker(concurrency=2)
    try:
        approve_plan(case, officer)

        def warm() -> bool:
            return (
                PlanNode.objects.filter(version=case.current_version, status="succeeded").count()
                >= 100
            )

        wait_until("the first hundred", warm, timeout=300, workers=(worker,))
        start = _rss_kb(worker)

        def drained() -> bool:
            return (
                not PlanNode.objects.filter(version=case.current_version, kind="leaf")
                .exclude(status="succeeded")
                .exists()
            )

        wait_until("all thousand", drained, timeout=900, workers=(worker,))
        end = _rss_kb(worker)
    finally:
        worker.stop()
    nodes = PlanNode.objects.filter(version=case.current_version, kind="leaf")
    assert set(nodes.values_list("attempts", flat=True)) == {1}
    assert AuditEvent.objects.filter(action="execution.leaf.succeeded").count() == 1000
    assert all(harness.effects_of(case, f"n{i}") == (1, 1) for i in range(0, 1000, 37))
    assert end - start < 50 * 1024, f"worker memory grew from {start} kB to {end} kB"
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED


@pytest.mark.scenario("E5")
def test_database_connections_killed_during_claims_and_completions_leave_no_half_state(
    harness: Harness, analyst: Any, officer: Any, settings: Any
) -> None:
    import threading
    import time

    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("killing a backend's connection needs PostgreSQL (CI runs it)")
    settings.CASEHUB_PLAN_MAX_FANOUT = 20
    # Connections die every 150 ms here: a step may lose its database more often than the
    # dead-letter limit allows in production. Each loss hands the step back; none fails it.
    settings.CASEHUB_LEAF_MAX_DELIVERIES = 1000
    keys = [f"k{i}" for i in range(20)]
    case = harness.case(analyst, [{"key": k, "seconds": 0.2} for k in keys])
    worker = harness.worker(concurrency=2, CASEHUB_LEAF_MAX_DELIVERIES=1000)
    stop = threading.Event()
    killed: list[int] = []

    def killer() -> None:
        from django.db import connections

        conn = connections.create_connection("default")
        try:
            while not stop.wait(0.15):
                with conn.cursor() as cursor:
                    cursor.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                        "AND application_name <> 'casehub-test-main'"
                    )
                    killed.extend(1 for row in cursor.fetchall() if row[0])
        finally:
            conn.close()

    with connection.cursor() as cursor:
        cursor.execute("SET application_name = 'casehub-test-main'")
    thread = threading.Thread(target=killer, daemon=True)
    try:
        approve_plan(case, officer)
        thread.start()
        time.sleep(4)
        stop.set()
        thread.join()

        def done() -> bool:
            return all(leaf(case, k).status == "succeeded" for k in keys)

        wait_until("every leaf", done, timeout=180, workers=(worker,))
    finally:
        stop.set()
        worker.stop()
    assert killed, "no connection was killed: the test proved nothing"
    for key in keys:
        node = leaf(case, key)
        outcomes = list(LeafAttempt.objects.filter(node=node).values_list("outcome", flat=True))
        assert outcomes.count("succeeded") == 1, (key, outcomes)
        assert harness.effects_of(case, key)[0] == 1, key
        events = AuditEvent.objects.filter(action="execution.leaf.succeeded", data__node=key)
        assert events.count() == 1, key
    from audit.chain import case_chain, verify_chain

    assert verify_chain(case_chain(case.pk)) == []
