"""The Celery application; tasks live in the apps' tasks.py and use shared_task."""

import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "casehub.settings")

app = Celery("casehub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.steps["worker"].add("oversight.worker.HeartbeatStep")


@worker_init.connect
def _configure_tracing(**kwargs: object) -> None:
    # A worker exports the spans of its planning runs and leaves when OTEL_* turn tracing on.
    from casehub.env import ConfigError
    from casehub.observability.tracing import configure_tracing

    try:
        configure_tracing()
    except ConfigError as exc:
        # Celery logs and ignores a handler's exception: a misconfiguration must stop the worker.
        raise SystemExit(f"tracing: {exc}") from exc
