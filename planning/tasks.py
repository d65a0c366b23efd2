"""Planning Celery tasks: they take ids and call one action."""

from __future__ import annotations

from celery import shared_task

from observability.runs import planning_run
from planning import actions
from planning.dispatch import PLAN_CASE, RECONCILE_PLANNING


@shared_task(name=PLAN_CASE, acks_late=True)
def plan_case(case_id: int) -> str:
    """Materialise the plan of a case; return the outcome (materialised, failed or skipped)."""
    with planning_run(case_id) as run:
        run.outcome = actions.materialise_plan(case_id).outcome
    return run.outcome


@shared_task(name=RECONCILE_PLANNING)
def reconcile_planning() -> list[int]:
    """Re-enqueue cases whose planning message was lost or whose worker died; return their ids."""
    return actions.reconcile_planning()
