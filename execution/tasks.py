"""Execution's Celery tasks. Their registered names keep the "oversight." prefix (beat schedules
and messages in flight name them)."""

from __future__ import annotations

import os
import socket
from typing import Any

from celery import shared_task

from execution import actions, dispatch, judging, work_items


@shared_task(name="oversight.sweep_work_items")
def sweep_work_items() -> dict[str, int]:
    """Remind and escalate the open work items by their deadlines (never complete one)."""
    return work_items.sweep_work_items()


@shared_task(
    name=dispatch.RUN_LEAF,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def run_leaf(self: Any, node_id: int) -> list[str]:
    """Claim and run one leaf (and, time allowing, one leaf it made ready) on this worker."""
    worker = f"{self.request.hostname or socket.gethostname()} pid {os.getpid()}"
    return actions.execute_leaf(node_id, worker=worker)


@shared_task(name=dispatch.RECONCILE_EXECUTION)
def reconcile_execution() -> dict[str, list[int]]:
    """Re-send lost leaves, recover leaves of dead workers, time out and dead-letter (beat)."""
    return actions.reconcile_execution().as_data()


@shared_task(
    name=dispatch.JUDGE_GOAL,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def judge_goal(case_id: int) -> str:
    """Ask the LLM goal judge about a verifying case, outside any transaction, and end the case."""
    return judging.judge_case_goal(case_id)
