"""Oversight Celery tasks."""

from __future__ import annotations

import os
import socket
from typing import Any

from celery import shared_task
from django.contrib.auth import get_user_model
from django.db import connection

from accounts import users
from accounts.denials import flush_denials
from audit.checkpoints import write_checkpoints
from oversight import dispatch
from oversight.actions import execution, gates
from oversight.actions.execution import judging, work_items


@shared_task(name="oversight.ping")
def ping(username: str) -> dict[str, object]:
    """Answer with the worker's host, its database vendor and whether it sees the user."""
    exists = get_user_model().objects.filter(username=username).exists()
    return {"host": socket.gethostname(), "database": connection.vendor, "user_exists": exists}


@shared_task(name="oversight.write_audit_checkpoints")
def write_audit_checkpoints() -> dict[str, object]:
    """Verify every audit chain and checkpoint the intact ones; broken ones raise an alert event."""
    run = write_checkpoints()
    return {"written": len(run.written), "broken": sorted(run.broken)}


@shared_task(name="oversight.sweep_gates")
def sweep_gates() -> dict[str, int]:
    """Remind, escalate and hold the gates past their deadlines (never approve by time)."""
    return gates.sweep_gates()


@shared_task(name="oversight.sweep_work_items")
def sweep_work_items() -> dict[str, int]:
    """Remind and escalate the open work items by their deadlines (never complete one)."""
    return work_items.sweep_work_items()


@shared_task(name="oversight.flush_access_denials")
def flush_access_denials() -> dict[str, int]:
    """Summarise the access denials of every finished minute in the system audit chain."""
    return flush_denials()


@shared_task(name="oversight.expire_admin_requests")
def expire_admin_requests() -> dict[str, int]:
    """Expire pending password resets and role grants that were not approved in time."""
    return users.expire_old_requests()


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
    return execution.execute_leaf(node_id, worker=worker)


@shared_task(name=dispatch.RECONCILE_EXECUTION)
def reconcile_execution() -> dict[str, list[int]]:
    """Re-send lost leaves, recover leaves of dead workers, time out and dead-letter (beat)."""
    return execution.reconcile_execution().as_data()


@shared_task(
    name=dispatch.JUDGE_GOAL,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def judge_goal(case_id: int) -> str:
    """Ask the LLM goal judge about a verifying case, outside any transaction, and end the case."""
    return judging.judge_case_goal(case_id)
