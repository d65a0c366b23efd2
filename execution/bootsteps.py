"""A Celery worker bootstep that records a heartbeat row, read by GET /health."""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import bootsteps

logger = logging.getLogger(__name__)


class HeartbeatStep(bootsteps.StartStopStep):
    """Write the worker's heartbeat at start and then every CASEHUB_HEARTBEAT_INTERVAL_S."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.tref: Any = None

    def start(self, worker: Any) -> None:
        from django.conf import settings

        self._beat(worker.hostname)
        self.tref = worker.timer.call_repeatedly(
            settings.CASEHUB_HEARTBEAT_INTERVAL_S, self._beat, (worker.hostname,), priority=10
        )

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None
        try:
            # The Celery app loads this step before Django is set up: the models come later.
            from execution.heartbeats import forget_worker

            forget_worker(hostname=worker.hostname)
        except Exception:
            logger.exception("could not remove the heartbeat of %s", worker.hostname)

    def _beat(self, hostname: str) -> None:
        from django.db import close_old_connections

        # The Celery app loads this step before Django is set up: the models come later.
        from execution.heartbeats import record_worker_heartbeat

        try:
            close_old_connections()
            record_worker_heartbeat(hostname=hostname, pid=os.getpid())
        except Exception:
            # A database hiccup must not kill the worker; /health shows the stale heartbeat.
            logger.exception("could not record the heartbeat of %s", hostname)
