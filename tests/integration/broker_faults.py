"""What the broker fault tests share, on Redis (test_execution_broker_faults.py) and on RabbitMQ
(rabbitmq_broker_faults.py): a supervised worker, a scripted case, and the scenarios whose steps
are the same on both brokers (a `Broker` is stopped and started by each its own way)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from audit.chain import case_chain, verify_chain
from execution import actions as execution
from execution.models import LeafAttempt
from oversight.models import Gate, GateKind, GateStatus
from planning.models import Case, CaseStatus, NodeStatus
from tests.integration.execution import Harness, approve_plan, leaf, wait_until


class Broker(Protocol):
    def stop(self) -> None: ...
    def start(self) -> Any: ...
    def queued(self) -> int: ...
    def unacknowledged(self) -> int: ...


KEYS = ["q1", "q2", "q3", "q4", "q5"]


class Supervised:
    """A worker kept running as `make run` and systemd keep theirs: one that exits is replaced.

    Kombu's Redis transport may end the worker ("Unrecoverable error: AttributeError") when the
    broker vanishes while the worker holds an unacknowledged message; a deployment's supervisor
    starts it again, and so does this.
    """

    def __init__(self, harness: Harness, **env: object) -> None:
        self.harness = harness
        self.env = env
        self.workers = [harness.worker(**env)]

    @property
    def replaced(self) -> int:
        return len(self.workers) - 1

    def check(self, condition: Callable[[], bool]) -> Callable[[], bool]:
        def supervised() -> bool:
            current = self.workers[-1]
            if current.process is not None and current.process.poll() is not None:
                self.workers.append(self.harness.worker(**self.env))
            return condition()

        return supervised

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


def script() -> list[dict[str, Any]]:
    """Five independent leaves of a second each, then one that waits for all of them."""
    return [
        *({"key": key, "seconds": 1} for key in KEYS),
        {"key": "last", "depends_on": KEYS},
    ]


def each_ran_and_acted_once(harness: Harness, case: Case, keys: list[str]) -> None:
    for key in keys:
        node = leaf(case, key)
        assert (node.status, node.attempts) == (NodeStatus.SUCCEEDED, 1), key
        assert harness.effects_of(case, key) == (1, 1), key  # invoked once, acted once
        outcomes = LeafAttempt.objects.filter(node=node).values_list("outcome", flat=True)
        assert list(outcomes) == ["succeeded"], key  # claimed once
    assert verify_chain(case_chain(case.pk)) == []
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification


def busy_with_leaves_queued(
    harness: Harness, analyst: Any, officer: Any, **worker_env: object
) -> tuple[Case, list[Case], Supervised]:
    """E3's start: one worker process busy with a case's long leaf ("busy", 5 s) while four other
    cases' leaves ("q") are sent, so that their messages wait in the broker (a worker only ever
    picks up its own case's next leaf). Returns the busy case, the queued ones and the workers,
    which the caller stops."""
    busy = harness.case(analyst, [{"key": "busy", "seconds": 5}])
    queued = [harness.case(analyst, [{"key": "q", "seconds": 0.5}]) for _ in range(4)]
    workers = Supervised(harness, concurrency=1, CASEHUB_LEAF_SOFT_LIMIT_S=14, **worker_env)
    try:
        approve_plan(busy, officer)
        wait_until("the long leaf to run", lambda: leaf(busy, "busy").status == NodeStatus.RUNNING,
                   reconcile=False, workers=tuple(workers.workers))  # fmt: skip
        for case in queued:
            approve_plan(case, officer)
    except BaseException:
        workers.stop()
        raise
    return busy, queued, workers


def approved_while_down(
    broker: Broker,
    harness: Harness,
    analyst: Any,
    officer: Any,
    *,
    restarted: Callable[[], None] = lambda: None,
    **worker_env: object,
) -> None:
    """E4: a plan approved while the broker is down runs once the broker is back (`restarted`
    checks the broker right after its start)."""
    case = harness.case(analyst, script())
    workers = Supervised(harness, concurrency=2, **worker_env)
    try:
        # The worker is idle (its start-up pings answered and acknowledged) when the broker goes.
        wait_until("the worker to be idle", lambda: broker.queued()
                   + broker.unacknowledged() == 0, reconcile=False)  # fmt: skip
        broker.stop()
        approve_plan(case, officer)  # the approval commits; its messages are not sent
        gate = Gate.objects.get(case=case, kind=GateKind.PLAN)
        assert gate.status == GateStatus.APPROVED
        assert {leaf(case, key).status for key in KEYS} == {NodeStatus.READY}
        case.refresh_from_db()
        assert case.status in {CaseStatus.APPROVED, CaseStatus.EXECUTING}
        for _ in range(3):  # the reconciler runs while the broker is away: no error, no claim
            execution.reconcile_execution()
        assert {leaf(case, key).status for key in KEYS} == {NodeStatus.READY}
        broker.start()
        restarted()

        def all_done() -> bool:
            return leaf(case, "last").status == NodeStatus.SUCCEEDED

        wait_until("every leaf", workers.check(all_done), workers=tuple(workers.workers))
    finally:
        workers.stop()
    each_ran_and_acted_once(harness, case, [*KEYS, "last"])
