"""Execution while RabbitMQ itself goes away (E3 and E4 on RabbitMQ; run by test_rabbitmq.py).

Not collected by the suite (no `test_` prefix): `tests/integration/test_rabbitmq.py` runs it in a
pytest of its own whose environment names a RabbitMQ virtual host as the broker, so that this
process and its workers configure Celery as a deployment on RabbitMQ does (quorum queues, publisher
confirms). The broker is stopped and started with `rabbitmqctl stop_app` / `start_app`: the node's
RabbitMQ application goes and comes back, as after a crash or a restart, every client cut off.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from django.conf import settings as django_settings

from planning.models import NodeStatus
from tests.integration.broker_faults import (
    approved_while_down,
    busy_with_leaves_queued,
    each_ran_and_acted_once,
)
from tests.integration.execution import Harness, leaf, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class RabbitMQ:
    """The configured RabbitMQ node and this run's virtual host on it."""

    def __init__(self, url: str) -> None:
        if not url.startswith("amqp://"):
            pytest.fail(f"these tests run on RabbitMQ (through test_rabbitmq.py), not on {url}")
        self.url = url
        self.vhost = unquote(urlsplit(url).path.lstrip("/")) or "/"

    def _ctl(self, *args: str) -> str:
        done = subprocess.run(
            ["rabbitmqctl", "--quiet", *args],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.fail(f"rabbitmqctl {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def stop(self) -> None:
        self._ctl("stop_app")

    def start(self) -> None:
        self._ctl("start_app")
        self._ctl("await_startup")

    def _counts(self) -> tuple[int, int]:
        out = self._ctl(
            "list_queues", "-p", self.vhost, "--no-table-headers",
            "name", "messages_ready", "messages_unacknowledged",
        )  # fmt: skip
        for line in out.splitlines():
            name, ready, unacked = line.split("\t")[:3]
            if name == "celery":
                return int(ready), int(unacked)
        return 0, 0

    def queued(self) -> int:
        """Return the messages waiting in Celery's queue."""
        return self._counts()[0]

    def unacknowledged(self) -> int:
        """Return the messages a worker took and has not acknowledged yet."""
        return self._counts()[1]


@pytest.fixture
def rabbitmq() -> Iterator[RabbitMQ]:
    broker = RabbitMQ(django_settings.CELERY_BROKER_URL)
    try:
        yield broker
    finally:
        broker.start()  # whatever happened, the machine's broker is left running


@pytest.fixture
def harness(transactional_db: None, settings: Any, tmp_path: Path) -> Harness:
    return Harness(settings, tmp_path / "effects")


def test_rabbitmq_stopped_and_started_with_leaves_queued_loses_nothing_and_runs_nothing_twice(
    rabbitmq: RabbitMQ, harness: Harness, analyst: Any, officer: Any
) -> None:
    # The queued leaves' messages wait in the quorum queue, which outlives the broker's restart.
    busy, queued, workers = busy_with_leaves_queued(harness, analyst, officer)
    try:
        # Their messages are in the broker: the one worker process is busy, and takes one at a time.
        # (Not counted here: `rabbitmqctl`'s message counts are statistics that lag by seconds.)
        assert leaf(busy, "busy").status == NodeStatus.RUNNING  # the broker goes while it runs
        rabbitmq.stop()
        # The long leaf ends while the broker is away; the reconciler cannot send anything.
        wait_until("the long leaf to end", lambda: leaf(busy, "busy").status != NodeStatus.RUNNING,
                   workers=tuple(workers.workers))  # fmt: skip
        assert {leaf(case, "q").status for case in queued} == {NodeStatus.READY}
        rabbitmq.start()

        def all_done() -> bool:
            return all(leaf(case, "q").status == NodeStatus.SUCCEEDED for case in queued)

        # No reconciler: only the messages that outlived the restart in the quorum queue can run
        # them (on a Redis without persistence they are lost, and the reconciler sends them again).
        wait_until("every queued leaf from its own message", workers.check(all_done),
                   reconcile=False, workers=tuple(workers.workers))  # fmt: skip
    finally:
        workers.stop()
    each_ran_and_acted_once(harness, busy, ["busy"])
    for case in queued:
        each_ran_and_acted_once(harness, case, ["q"])


def test_a_plan_approved_while_rabbitmq_is_down_runs_once_it_is_back(
    rabbitmq: RabbitMQ, harness: Harness, analyst: Any, officer: Any
) -> None:
    approved_while_down(rabbitmq, harness, analyst, officer)
