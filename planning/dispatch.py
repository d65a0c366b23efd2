"""The one module of planning that knows Celery: send tasks by name once the transaction commits.

Actions call these functions; tasks call actions; the reconciler re-enqueues through the same
functions. The database, not the broker, is the truth about what must run, so a message lost here
is found again by `planning.actions.reconcile_planning`.
"""

from __future__ import annotations

import logging
from functools import partial

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)

PLAN_CASE = "planning.plan_case"
RECONCILE_PLANNING = "planning.reconcile_planning"


def _send(task_name: str, *args: object) -> None:
    current_app.send_task(task_name, args=list(args))


def enqueue_planning(case_id: int) -> None:
    """Send the case to a planning worker once the current transaction commits.

    A broker that is down does not undo the commit: the error is logged and the reconciler sends
    the case again later.
    """
    transaction.on_commit(partial(_send, PLAN_CASE, case_id), robust=True)


__all__ = ["PLAN_CASE", "RECONCILE_PLANNING", "enqueue_planning"]
