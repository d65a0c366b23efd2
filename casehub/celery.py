"""The Celery application; tasks live in the apps' tasks.py and use shared_task."""

import os
from typing import Any

from celery import Celery
from celery.signals import (
    before_task_publish,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
)

from observability.tracing import attach_context, configure_tracing, detach_context, inject_context
from web.env import ConfigError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "casehub.settings")

app = Celery("casehub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.steps["worker"].add("execution.bootsteps.HeartbeatStep")


@worker_init.connect
def _configure_tracing(**kwargs: object) -> None:
    # A worker exports the spans of its planning runs and leaves when OTEL_* turn tracing on.
    try:
        configure_tracing()
    except ConfigError as exc:
        # Celery logs and ignores a handler's exception: a misconfiguration must stop the worker.
        raise SystemExit(f"tracing: {exc}") from exc


@worker_init.connect
@worker_process_init.connect
def _keep_connections(**kwargs: object) -> None:
    # A worker's processes keep their database connections from task to task (web/db.py): the
    # main one (the solo and thread pools run tasks there) and each prefork child.
    from django.conf import settings

    # Imported once the worker starts: this module loads with the project, before Django is set up.
    from web.db import keep_connections

    keep_connections(settings.CASEHUB_WORKER_CONN_MAX_AGE)


@task_prerun.connect
def _check_connections(**kwargs: object) -> None:
    # Celery's Django fixup leaves connections open (CELERY_DB_REUSE_MAX); as Django does at the
    # start of a request, one that saw an error and no longer works, or outlived its age, closes.
    from django.db import connections

    for wrapper in connections.all(initialized_only=True):
        wrapper.close_if_unusable_or_obsolete()


# A task continues the trace of whoever sent it (tracing on only; OTel's W3C headers).
TRACE_HEADERS = ("traceparent", "tracestate")


@before_task_publish.connect
def _send_trace_context(headers: dict[str, Any] | None = None, **kwargs: object) -> None:
    if headers is not None:
        inject_context(headers)


@task_prerun.connect
def _continue_trace(task: Any = None, **kwargs: object) -> None:
    if task is not None:
        request = task.request
        carrier = {key: getattr(request, key, None) for key in TRACE_HEADERS}
        carried = {key: value for key, value in carrier.items() if isinstance(value, str)}
        request.casehub_trace_token = attach_context(carried) if carried else None


@task_postrun.connect
def _end_trace(task: Any = None, **kwargs: object) -> None:
    if task is not None:
        detach_context(getattr(task.request, "casehub_trace_token", None))
