"""The module of execution that sends Celery tasks: leaves sent to the workers once the
transaction commits, and verifying cases sent to the goal judge.

Actions call these functions; tasks call actions; the reconciler re-sends through them. The
database, not the broker, is the truth about what must run: a message lost here (a broker that is
down at approval time, a restarted Redis) is found again by the execution reconciler.
"""

from __future__ import annotations

import logging
import math
from functools import partial
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)

# The registered task names keep their "oversight." prefix: beat schedules and messages in flight
# name them.
RUN_LEAF = "oversight.run_leaf"
RECONCILE_EXECUTION = "oversight.reconcile_execution"
JUDGE_GOAL = "oversight.judge_goal"
# A broker that does not answer must not hold up the transaction's caller for long.
_PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}
# How both tasks are sent. Neither stores a result (`ignore_result` on the task): a send says so
# too, or Celery subscribes the sending process to the result's channel on a Redis result
# backend (a round trip at each send, and another to unsubscribe).
_SEND_OPTIONS: dict[str, Any] = {
    "retry": True,
    "retry_policy": _PUBLISH_RETRY,
    "ignore_result": True,
}


def task_time_limit_s() -> float:
    """Return the hard time limit of one run_leaf task (it may run a few leaves in a row)."""
    return 2 * float(settings.CASEHUB_LEAF_HARD_LIMIT_S) + 30


def send_leaf(node_id: int, *, countdown: float | None = None) -> None:
    """Send a leaf to the workers now (ids only); a broker error is logged, not raised.

    A countdown is rounded up to whole seconds, on every broker: RabbitMQ's delayed delivery (its
    quorum queues) counts whole seconds and drops the fraction, so a retry's message would come
    early and its claim refuse it, and kombu refuses one under a second outright.
    """
    if countdown is not None and countdown > 0:
        countdown = math.ceil(countdown)
    try:
        current_app.send_task(
            RUN_LEAF,
            args=[node_id],
            countdown=countdown,
            time_limit=task_time_limit_s(),
            **_SEND_OPTIONS,
        )
    except Exception:
        logger.warning("leaf %s not sent (the reconciler sends it again)", node_id, exc_info=True)


def enqueue_leaf(node_id: int, *, countdown: float | None = None) -> None:
    """Send a leaf to the workers once the current transaction commits."""
    transaction.on_commit(partial(send_leaf, node_id, countdown=countdown), robust=True)


def send_goal_judge(case_id: int, *, time_limit_s: float) -> None:
    """Send a verifying case to the LLM goal judge now; a broker error is logged, not raised."""
    try:
        current_app.send_task(
            JUDGE_GOAL,
            args=[case_id],
            time_limit=time_limit_s,
            **_SEND_OPTIONS,
        )
    except Exception:
        logger.warning(
            "case %s not sent to the goal judge (the reconciler sends it again)",
            case_id,
            exc_info=True,
        )


def enqueue_goal_judge(case_id: int, *, time_limit_s: float) -> None:
    """Send a verifying case to the LLM goal judge once the current transaction commits."""
    transaction.on_commit(partial(send_goal_judge, case_id, time_limit_s=time_limit_s), robust=True)
