"""System checks of oversight's settings (`manage.py check --deploy`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register

from execution.dispatch import task_time_limit_s


@register(Tags.compatibility, deploy=True)
def check_visibility_timeout(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn when Redis would redeliver a leaf's message while the leaf may still run.

    The claim refuses such a second delivery (the leaf runs under a live lease: E7), so nothing
    runs twice; but every long leaf then costs a wasted delivery, and a deployment that set the
    timeout that short most likely meant something else. A warning, so tests and development may
    use a short one; `check --deploy --fail-level WARNING` (W1) refuses it in production.
    """
    broker = str(getattr(settings, "CELERY_BROKER_URL", ""))
    if not broker.startswith(("redis://", "rediss://")):
        return []
    timeout = int(getattr(settings, "CASEHUB_BROKER_VISIBILITY_TIMEOUT_S", 3600))
    limit = task_time_limit_s()
    if timeout >= limit:
        return []
    return [
        Warning(
            f"CASEHUB_BROKER_VISIBILITY_TIMEOUT_S is {timeout} s, shorter than a run_leaf task may "
            f"run ({limit:g} s: twice CASEHUB_LEAF_HARD_LIMIT_S plus 30 s).",
            hint="Redis then delivers the message of a leaf that is still running again; the "
            "claim refuses it, but unset the variable (the default is at least an hour) or raise "
            "it above the task's time limit.",
            id="oversight.W001",
        )
    ]
