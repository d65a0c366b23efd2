"""Cases planned through the real actions, for tests of what follows planning (gates, edits)."""

from __future__ import annotations

from typing import Any

from planning.actions import materialise_plan, submit_case
from planning.models import Case


def planned_invoice_case(submitter: Any, *, goal: str = "Verify invoice INV-1042") -> Case:
    """Submit and plan the static INV-1042 invoice case: a plan gate and a signed step gate for
    the payment hold open with its version."""
    case = submit_case(
        submitter=submitter,
        title="Verify INV-1042",
        goal=goal,
        domain="invoice",
        strategy="static",
        inputs={"invoice_id": "INV-1042"},
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    return case


def scripted_case(submitter: Any, officer: Any, leaves: list[dict[str, Any]]) -> Case:
    """A case of the execution test pack (`tests.fakes.execution_pack`, registered by the
    caller) whose inputs script its leaves, planned, its plan gate approved by `officer`."""
    from oversight.models import Gate, GateKind
    from tests.execution.test_execution import approve
    from tests.fakes import execution_pack

    case = submit_case(
        submitter=submitter,
        title="Wide",
        goal="Run a wide plan",
        domain=execution_pack.SLUG,
        strategy="static",
        inputs={"leaves": leaves},
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.status == "awaiting_approval", (case.status, case.error)
    approve(Gate.objects.get(case=case, kind=GateKind.PLAN), officer)
    return case


def planned_case(
    submitter: Any, *, domain: str, inputs: dict[str, Any], strategy: str = "static"
) -> Case:
    """Submit and plan a case of `domain` through the real actions; its plan gate is pending."""
    case = submit_case(
        submitter=submitter,
        title=f"A {domain} case",
        goal=f"Handle the {domain} case",
        domain=domain,
        strategy=strategy,
        inputs=inputs,
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.status == "awaiting_approval", case.error
    return case
