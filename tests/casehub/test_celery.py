from __future__ import annotations

from django.conf import settings
from django.utils.module_loading import autodiscover_modules

from casehub.celery import app


def test_every_beat_entry_names_a_registered_task() -> None:
    autodiscover_modules("tasks")  # what the worker's autodiscovery imports
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert "planning.reconcile_planning" in scheduled
    assert scheduled - set(app.tasks) == set()


def test_workers_get_the_heartbeat_step() -> None:
    assert "execution.bootsteps.HeartbeatStep" in {str(step) for step in app.steps["worker"]}
