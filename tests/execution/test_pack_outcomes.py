"""Goal-level verification checks the outcome in the pack's systems, not only that the steps
ended: an outage whose fail-over restores the service is reached, one whose fail-over promotes a
replica that is also down is not — with the finding, on the case page and on /quality/."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from oversight.models import Gate, GateKind, GateStatus
from planning.actions import materialise_plan, submit_case
from planning.models import (
    Case,
    CaseStatus,
    EstateDatabase,
    EstateFailover,
    EstateNotice,
    NodeStatus,
)
from quality import queries
from tests.execution.test_execution import approve, leaves, run_ready
from tests.personas import PASSWORD

pytestmark = pytest.mark.django_db

NOT_RESTORED = (
    "inventory-db does not answer after the fail-over: its primary db-inventory-2 is unreachable"
)


def outage_case(analyst: Any, service: str) -> Case:
    """Submit and plan a static database-outage case on `service` (its plan gate pending)."""
    case = submit_case(
        submitter=analyst,
        title=f"{service} is down",
        goal=f"Bring {service} back",
        domain="incident",
        strategy="static",
        inputs={"kind": "database-outage", "service": service},
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    return case


def run_to_the_end(case: Case, officer: Any) -> Case:
    """Approve the plan, then run every step, signing each step gate once its step waits."""
    approve(Gate.objects.get(case=case, kind=GateKind.PLAN), officer)
    while True:
        run_ready(case)
        waiting = Gate.objects.filter(
            case=case,
            kind=GateKind.STEP,
            status=GateStatus.PENDING,
            node__status=NodeStatus.AWAITING_APPROVAL,
        )
        if not waiting:
            break
        for gate in waiting:
            approve(gate, officer, password=PASSWORD)
    case.refresh_from_db()
    return case


def test_an_outage_whose_fail_over_restores_orders_db_completes_with_the_goal_reached(
    analyst: Any, officer: Any
) -> None:
    case = run_to_the_end(outage_case(analyst, "orders-db"), officer)
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert case.verification["passed"] is True
    assert "the Incident response rules hold" in case.verification["checks"]
    # The result says what the rules saw hold in the estate, not only that they held.
    assert (
        "orders-db answers on its primary db-orders-2 after the fail-over"
        in (case.verification["checks"])
    )
    nodes = leaves(case)
    # The step after the fail-over saw it: the estate is in the database, not rebuilt per call.
    assert nodes["verify-connectivity"].output == {
        "service": "orders-db",
        "primary": "db-orders-2",
        "reachable": True,
    }
    assert EstateDatabase.objects.get(service="orders-db").current_primary == "db-orders-2"
    assert EstateFailover.objects.filter(service="orders-db").count() == 1
    notice = EstateNotice.objects.get()
    assert notice.message == (
        "Outage of orders-db: orders-db answers on its primary db-orders-2; it is back in service"
    )
    assert (nodes["notify-stakeholders"].output or {})["message"] == notice.message


def test_an_outage_whose_fail_over_does_not_restore_inventory_db_ends_goal_not_reached(
    analyst: Any, officer: Any
) -> None:
    case = run_to_the_end(outage_case(analyst, "inventory-db"), officer)
    # Every step succeeded; the estate says the service is still down.
    assert {n.status for n in leaves(case).values()} == {"succeeded"}
    assert case.status == CaseStatus.FAILED
    assert case.verification["passed"] is False
    assert case.verification["reasons"] == [NOT_RESTORED]
    # The stakeholders were told what is true.
    assert EstateNotice.objects.get().message == (
        "Outage of inventory-db: inventory-db does not answer on its primary db-inventory-2; "
        "it is still down"
    )
    client = Client()
    client.force_login(analyst)
    page = client.get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    result = page.split('id="case-result"', 1)[1].split("</section>", 1)[0]
    assert 'data-passed="false"' in page
    assert "The goal is not reached." in result and "The goal is reached" not in result
    assert f"<li>{NOT_RESTORED}</li>" in result


def test_quality_counts_a_refuted_outcome_as_a_goal_not_verified(
    analyst: Any, officer: Any
) -> None:
    reached = run_to_the_end(outage_case(analyst, "orders-db"), officer)
    refuted = run_to_the_end(outage_case(analyst, "inventory-db"), officer)
    report = queries.quality_report(queries.parse_filter({}))
    rows = {r.case_id: r for r in report.cases}
    assert rows[reached.pk].verified is True
    assert rows[refuted.pk].verified is False
    (pack,) = [g for g in report.packs if g.key == "incident"]
    assert (pack.verified, pack.verification_runs) == (1, 2)
    client = Client()
    client.force_login(officer)
    page = client.get(reverse("quality:quality")).content.decode()
    assert '<dd data-figure="verified">1 of 2</dd>' in page
    case_page = client.get(reverse("quality:case-quality", args=[refuted.pk])).content.decode()
    assert '<dd data-figure="verified">failed</dd>' in case_page


def test_a_fraud_case_reaches_its_goal_only_with_its_freeze_on_the_account(analyst: Any) -> None:
    from execution.verdicts import verify_goal
    from planning.catalogue import DatabaseFraudData
    from planning.core.catalogue import ToolCall
    from planning.models import FraudAccountFreeze, PlanNode

    case = submit_case(
        submitter=analyst,
        title="ACC-300 paid a sanctioned company",
        goal="Investigate ACC-300",
        domain="fraud",
        strategy="static",
        inputs={"account_id": "ACC-300", "amount": "12500"},
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    steps = PlanNode.objects.filter(version_id=case.current_version_id, kind="leaf")
    assert steps.filter(key="freeze-account").exists()  # a serious case decides to freeze
    acting = DatabaseFraudData().with_call(ToolCall(idempotency_key="leaf-freeze-account"))
    freeze_id = acting.freeze("ACC-300", "serious fraud investigation findings")
    steps.update(status=NodeStatus.SUCCEEDED, output={"done": True})
    steps.filter(key="freeze-account").update(
        output={"account_id": "ACC-300", "freeze_id": freeze_id}
    )
    verdict = verify_goal(case)
    assert verdict.passed, verdict.reasons
    assert "the Fraud investigation rules hold" in verdict.checks
    assert f"ACC-300 is frozen: freeze {freeze_id} is on the account" in verdict.checks
    FraudAccountFreeze.objects.all().delete()  # the freeze did not last in the account data
    verdict = verify_goal(case)
    assert not verdict.passed
    assert verdict.reasons == (f"ACC-300 is not frozen: freeze {freeze_id} is not on the account",)


def test_a_breach_case_completes_without_an_llm_provider_its_logs_read_by_a_person(
    analyst: Any, officer: Any, settings: Any
) -> None:
    from accounts import roles
    from execution import actions as execution
    from execution.models import WorkItem
    from planning.models import EstateHost
    from tests import personas

    settings.OPENAI_BASE_URL = settings.OPENAI_API_KEY = ""
    case = submit_case(
        submitter=analyst,
        title="web-2 was broken into",
        goal="Contain the breach on web-2",
        domain="incident",
        strategy="static",
        inputs={"kind": "security-breach", "service": "web", "affected_hosts": ["web-2"]},
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    assert leaves(case)["review-logs-by-hand"].agent == "incident-commander"
    second_analyst: Any = personas.make_user("ben", roles.ANALYST)
    approve(Gate.objects.get(case=case, kind=GateKind.PLAN), officer)
    for _ in range(6):
        run_ready(case)
        for item in WorkItem.objects.filter(case=case, status=WorkItem.Status.OPEN):
            execution.complete_work_item(
                item_id=item.pk,
                user=second_analyst,
                output={"attack_path": "root over ssh from 203.0.113.9, then 4.2 GB out"},
            )
        for gate in Gate.objects.filter(
            case=case,
            kind=GateKind.STEP,
            status=GateStatus.PENDING,
            node__status=NodeStatus.AWAITING_APPROVAL,
        ):
            approve(gate, officer, password=PASSWORD)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, (case.verification, case.error)
    assert "the Incident response rules hold" in case.verification["checks"]
    assert EstateHost.objects.get(name="web-2").is_isolated
