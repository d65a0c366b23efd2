"""Execution on real Celery workers while the broker fails (RELIABILITY E3, E4, E7).

Each test runs its own `redis-server` on a free loopback port (never the machine's Redis), points
this process's Celery app and the worker at it, and counts effects by idempotency key
(tests/fakes/execution_pack.py). The database, not the broker, is the truth about what must run:
a restart that loses the queue loses nothing, because the reconciler sends the ready leaves again,
and a message delivered twice runs once, because the claim refuses the second one.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from execution import actions as execution
from execution.models import LeafAttempt
from oversight.models import Gate, GateKind, GateStatus
from planning.models import Case, CaseStatus, NodeStatus
from tests.integration.execution import Harness, approve_plan, leaf, wait_until
from tests.integration.redis_server import RedisServer, celery_broker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

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


@pytest.fixture
def redis_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisServer]:
    """A private Redis (with an fsynced append-only file when the test asks for `True`)."""
    server = RedisServer(tmp_path / "redis", aof=getattr(request, "param", False)).start()
    try:
        with celery_broker(server.url, {"visibility_timeout": 3600}):
            yield server
    finally:
        server.stop()


@pytest.fixture
def harness(
    redis_server: RedisServer, transactional_db: None, settings: Any, tmp_path: Path
) -> Harness:
    return Harness(settings, tmp_path / "effects")


def _script() -> list[dict[str, Any]]:
    """Five independent leaves of a second each, then one that waits for all of them."""
    return [
        *({"key": key, "seconds": 1} for key in KEYS),
        {"key": "last", "depends_on": KEYS},
    ]


def _each_ran_and_acted_once(harness: Harness, case: Case, keys: list[str]) -> None:
    for key in keys:
        node = leaf(case, key)
        assert (node.status, node.attempts) == (NodeStatus.SUCCEEDED, 1), key
        assert harness.effects_of(case, key) == (1, 1), key  # invoked once, acted once
        outcomes = LeafAttempt.objects.filter(node=node).values_list("outcome", flat=True)
        assert list(outcomes) == ["succeeded"], key  # claimed once
    assert verify_chain(case_chain(case.pk)) == []
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification


@pytest.mark.scenario("E3")
@pytest.mark.parametrize("redis_server", [False, True], ids=["queue-lost", "aof"], indirect=True)
def test_redis_restarted_with_leaves_queued_loses_nothing_and_runs_nothing_twice(
    redis_server: RedisServer, harness: Harness, analyst: Any, officer: Any
) -> None:
    # One worker process, busy with a case's long leaf while four other cases' leaves are sent:
    # their messages wait in Redis (a worker only ever picks up its own case's next leaf).
    busy = harness.case(analyst, [{"key": "busy", "seconds": 5}])
    queued = [harness.case(analyst, [{"key": "q", "seconds": 0.5}]) for _ in range(4)]
    workers = Supervised(
        harness, concurrency=1, CELERY_BROKER_URL=redis_server.url, CASEHUB_LEAF_SOFT_LIMIT_S=14
    )
    try:
        approve_plan(busy, officer)
        wait_until("the long leaf to run", lambda: leaf(busy, "busy").status == NodeStatus.RUNNING,
                   reconcile=False, workers=tuple(workers.workers))  # fmt: skip
        for case in queued:
            approve_plan(case, officer)
        assert redis_server.queued() == len(queued)
        assert leaf(busy, "busy").status == NodeStatus.RUNNING  # Redis goes while it runs
        redis_server.stop(signal.SIGKILL)
        # The long leaf ends while the broker is away; the reconciler cannot send anything.
        wait_until("the long leaf to end", lambda: leaf(busy, "busy").status != NodeStatus.RUNNING,
                   workers=tuple(workers.workers))  # fmt: skip
        assert {leaf(case, "q").status for case in queued} == {NodeStatus.READY}
        redis_server.start()
        if redis_server.aof:
            # The queue survived: the old messages and the reconciler's new ones both arrive.
            assert redis_server.queued() == len(queued)
        else:
            # The queue is gone with the old server: only the database knows what must run.
            assert redis_server.queued() == 0

        def all_done() -> bool:
            return all(leaf(case, "q").status == NodeStatus.SUCCEEDED for case in queued)

        wait_until("every queued leaf", workers.check(all_done), workers=tuple(workers.workers))
    finally:
        workers.stop()
    _each_ran_and_acted_once(harness, busy, ["busy"])
    for case in queued:
        _each_ran_and_acted_once(harness, case, ["q"])
    # No leaf was lost mid-run (leases held throughout): the waiting ones were only sent again.
    assert not AuditEvent.objects.filter(action="execution.leaf.recovered").exists()


@pytest.mark.scenario("E4")
def test_a_plan_approved_while_redis_is_down_runs_once_redis_is_back(
    redis_server: RedisServer, harness: Harness, analyst: Any, officer: Any
) -> None:
    case = harness.case(analyst, _script())
    workers = Supervised(harness, concurrency=2, CELERY_BROKER_URL=redis_server.url)
    try:
        # The worker is idle (its start-up pings answered and acknowledged) when Redis goes.
        wait_until("the worker to be idle", lambda: redis_server.queued()
                   + redis_server.unacknowledged() == 0, reconcile=False)  # fmt: skip
        redis_server.stop(signal.SIGKILL)
        approve_plan(case, officer)  # the approval commits; its messages are not sent
        gate = Gate.objects.get(case=case, kind=GateKind.PLAN)
        assert gate.status == GateStatus.APPROVED
        assert {leaf(case, key).status for key in KEYS} == {NodeStatus.READY}
        case.refresh_from_db()
        assert case.status in {CaseStatus.APPROVED, CaseStatus.EXECUTING}
        for _ in range(3):  # the reconciler runs while the broker is away: no error, no claim
            execution.reconcile_execution()
        assert {leaf(case, key).status for key in KEYS} == {NodeStatus.READY}
        redis_server.start()
        assert redis_server.queued() == 0

        def all_done() -> bool:
            return leaf(case, "last").status == NodeStatus.SUCCEEDED

        wait_until("every leaf", workers.check(all_done), workers=tuple(workers.workers))
    finally:
        workers.stop()
    _each_ran_and_acted_once(harness, case, [*KEYS, "last"])


@pytest.mark.scenario("E7")
def test_a_leaf_longer_than_the_visibility_timeout_is_delivered_again_and_runs_once(
    redis_server: RedisServer, harness: Harness, analyst: Any, officer: Any, settings: Any
) -> None:
    # Redis hands the message out again 2 s after it was taken; the leaf runs 7 s (its soft
    # limit raised above that, its hard limit of 16 s unchanged).
    settings.CASEHUB_LEAF_SOFT_LIMIT_S = 14
    case = harness.case(analyst, [{"key": "long", "seconds": 7}])
    worker = harness.worker(
        concurrency=2,
        CELERY_BROKER_URL=redis_server.url,
        CASEHUB_BROKER_VISIBILITY_TIMEOUT_S=2,
        CASEHUB_LEAF_SOFT_LIMIT_S=14,
    )
    try:
        approve_plan(case, officer)
        node = leaf(case, "long")
        refused = f"'{node.pk} refused: the leaf is running'"

        def delivered_again() -> bool:
            return refused in worker.log()

        # No reconciler here: a second delivery can only come from the broker itself.
        wait_until("Redis to deliver the running leaf again", delivered_again, timeout=30,
                   reconcile=False, workers=(worker,))  # fmt: skip
        assert leaf(case, "long").status == NodeStatus.RUNNING  # refused while it still runs
        wait_until("the leaf to end", lambda: leaf(case, "long").status == NodeStatus.SUCCEEDED,
                   workers=(worker,))  # fmt: skip
    finally:
        worker.stop()
    node = leaf(case, "long")
    assert node.attempts == 1
    assert harness.effects_of(case, "long") == (1, 1)
    assert list(LeafAttempt.objects.filter(node=node).values_list("outcome", flat=True)) == [
        "succeeded"
    ]
    assert verify_chain(case_chain(case.pk)) == []
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
