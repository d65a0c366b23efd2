"""Planning Celery tasks: they take ids and call one action."""

from __future__ import annotations

from celery import shared_task

from planning.actions import materialise_plan


@shared_task(name="planning.plan_case", acks_late=True)
def plan_case(case_id: int) -> int | None:
    """Materialise the plan of a case; return the new version's number (None if none)."""
    version = materialise_plan(case_id)
    return version.number if version is not None else None
