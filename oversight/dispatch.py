"""The module of oversight that talks to the broker: its health, and the what-if task sent once
the transaction that queued its report commits (execution's tasks are sent by
execution.dispatch)."""

from __future__ import annotations

import logging
from functools import partial

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)

RUN_WHATIF = "oversight.run_policy_whatif"
# A what-if of 10,000 plan versions takes well under a minute; a hung one is stopped.
WHATIF_TIME_LIMIT_S = 600
_PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def broker_status() -> dict[str, object]:
    """Return whether the broker accepts a connection within a few seconds, and its transport."""
    try:
        with current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
            # kombu's name of the kind of broker ("redis", "amqp", "filesystem"), not the class:
            # the embedded one is a class of CaseHub's own (casehub/broker.py)
            transport = conn.transport.driver_type
    except Exception as exc:
        return {"ok": False, "error": type(exc).__name__}
    return {"ok": True, "transport": str(transport)}


def send_whatif(whatif_id: int) -> None:
    """Send a queued what-if to the workers now (its id only); a broker error is logged: the
    report stays queued and its page offers to run it again."""
    try:
        current_app.send_task(
            RUN_WHATIF,
            args=[whatif_id],
            time_limit=WHATIF_TIME_LIMIT_S,
            retry=True,
            retry_policy=_PUBLISH_RETRY,
        )
    except Exception:
        logger.warning("what-if %s not sent", whatif_id, exc_info=True)


def enqueue_whatif(whatif_id: int) -> None:
    """Send a what-if to the workers once the current transaction commits."""
    transaction.on_commit(partial(send_whatif, whatif_id), robust=True)
