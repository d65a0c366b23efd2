"""Execution on real Celery workers while the broker fails (RELIABILITY E3, E4, E7).

Each test runs its own `redis-server` on a free loopback port (never the machine's Redis), points
this process's Celery app and the worker at it, and counts effects by idempotency key
(tests/fakes/execution_pack.py). The database, not the broker, is the truth about what must run:
a restart that loses the queue loses nothing, because the reconciler sends the ready leaves again,
and a message delivered twice runs once, because the claim refuses the second one.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from execution.models import LeafAttempt
from planning.models import CaseStatus, NodeStatus
from tests.integration.broker_faults import (
    approved_while_down,
    busy_with_leaves_queued,
    each_ran_and_acted_once,
)
from tests.integration.execution import Harness, approve_plan, leaf, wait_until
from tests.integration.redis_server import RedisServer, celery_broker

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def redis_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisServer]:
    """A private Redis (with an fsynced append-only file when the test asks for `True`)."""
    if not django_settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
        # The test process's Celery app keeps the configured transport and its options; these
        # tests are the Redis deployment's, as RabbitMQ's are its own (test_rabbitmq.py).
        pytest.skip("the Redis broker's fault tests run when the broker is Redis (CI runs them)")
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


@pytest.mark.scenario("E3")
@pytest.mark.parametrize("redis_server", [False, True], ids=["queue-lost", "aof"], indirect=True)
def test_redis_restarted_with_leaves_queued_loses_nothing_and_runs_nothing_twice(
    redis_server: RedisServer, harness: Harness, analyst: Any, officer: Any
) -> None:
    # The queued leaves' messages wait in Redis.
    busy, queued, workers = busy_with_leaves_queued(
        harness, analyst, officer, CELERY_BROKER_URL=redis_server.url
    )
    try:
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
    each_ran_and_acted_once(harness, busy, ["busy"])
    for case in queued:
        each_ran_and_acted_once(harness, case, ["q"])
    # No leaf was lost mid-run (leases held throughout): the waiting ones were only sent again.
    assert not AuditEvent.objects.filter(action="execution.leaf.recovered").exists()


@pytest.mark.scenario("E4")
def test_a_plan_approved_while_redis_is_down_runs_once_redis_is_back(
    redis_server: RedisServer, harness: Harness, analyst: Any, officer: Any
) -> None:
    def queue_lost() -> None:
        assert redis_server.queued() == 0  # nothing was sent while it was down

    approved_while_down(
        redis_server, harness, analyst, officer,
        restarted=queue_lost, CELERY_BROKER_URL=redis_server.url,
    )  # fmt: skip


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
