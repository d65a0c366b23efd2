"""Execution in the JSON API: cancel, the global stop switch, work items, and what plans and cases
say about their run. Who may do what is checked for every role."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from accounts import tokens as api_tokens
from audit.models import AuditEvent
from execution import actions as execution
from execution.models import WorkItem
from planning.catalogue import sync_packs
from planning.models import Agent, CaseStatus, NodeStatus, PlanNode
from tests import personas
from tests.cases import planned_invoice_case
from tests.execution.work_items import INVOICE_FIELDS, approve_plan, waiting_work_item

pytestmark = pytest.mark.django_db


def api(user: Any) -> Client:
    return Client(headers={"Authorization": f"Bearer {api_tokens.issue_api_token(user)}"})


def post(client: Client, url: str, body: dict[str, Any]) -> Any:
    return client.post(url, body, content_type="application/json")


# Cancel ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["submitter", "officer", "admin"])
def test_the_submitter_an_officer_and_an_admin_may_cancel_a_running_case(
    who: str, analyst: Any, officer: Any, admin_user: Any
) -> None:
    case = planned_invoice_case(analyst)
    approve_plan(case, officer)
    user = {"submitter": analyst, "officer": officer, "admin": admin_user}[who]
    response = post(
        api(user),
        f"/api/cases/{case.pk}/cancel",
        {"reason_code": "no-longer-needed", "reason": "paid by other means"},
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "cancelled" and body["finished_at"] is not None
    event = AuditEvent.objects.get(action="planning.case.cancelled")
    assert event.data["reason_code"] == "no-longer-needed"
    assert event.actor_label == user.get_username()


def test_an_auditor_may_not_cancel_and_an_outsider_or_other_analyst_finds_no_case(
    analyst: Any, officer: Any, auditor: Any, outsider: Any
) -> None:
    case = planned_invoice_case(analyst)
    approve_plan(case, officer)
    body = {"reason_code": "other", "reason": "no"}
    url = f"/api/cases/{case.pk}/cancel"
    assert post(api(auditor), url, body).status_code == 403
    assert post(api(outsider), url, body).status_code == 404
    assert post(api(personas.analyst("ben")), url, body).status_code == 404
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING


@pytest.mark.scenario("O7", "R6")
def test_cancel_needs_a_cancel_reason_code_and_an_ended_case_is_a_conflict(
    analyst: Any, officer: Any
) -> None:
    case = planned_invoice_case(analyst)
    url = f"/api/cases/{case.pk}/cancel"
    client = api(analyst)
    missing = post(client, url, {"reason_code": ""})
    assert missing.status_code == 422 and "reason_code" in missing.json()["fields"]
    # `incorrect` applies to rejections and edits, not to cancelling.
    assert post(client, url, {"reason_code": "incorrect"}).status_code == 422
    # `other` names no reason: its text must.
    bare = post(client, url, {"reason_code": "other", "reason": " "})
    assert bare.status_code == 422 and list(bare.json()["fields"]) == ["reason"]
    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL
    assert post(client, url, {"reason_code": "duplicate"}).status_code == 200
    again = post(client, url, {"reason_code": "duplicate"})
    assert again.status_code == 409 and "already cancelled" in again.json()["message"]


# The stop switch ------------------------------------------------------------------------------


def test_only_admins_stop_and_resume_and_every_role_reads_the_switch(
    analyst: Any, officer: Any, auditor: Any, admin_user: Any, outsider: Any
) -> None:
    for user in (analyst, officer, auditor):
        assert post(api(user), "/api/control/stop", {"reason": "x"}).status_code == 403
        assert post(api(user), "/api/control/resume", {}).status_code == 403
    assert not execution.is_stopped()
    stopped = post(api(admin_user), "/api/control/stop", {"reason": "maintenance window"})
    assert stopped.status_code == 200
    assert stopped.json()["stopped"] is True and stopped.json()["changed_by"] == "adam"
    assert execution.is_stopped()
    for user in (analyst, officer, auditor, admin_user):
        read = api(user).get("/api/control")
        assert read.status_code == 200 and read.json()["stopped"] is True
        assert read.json()["reason"] == "maintenance window"
    assert api(outsider).get("/api/control").status_code == 403
    resumed = post(api(admin_user), "/api/control/resume", {"reason": "done"})
    assert resumed.status_code == 200 and resumed.json()["stopped"] is False
    actions_seen = list(
        AuditEvent.objects.filter(action__startswith="execution.control").values_list(
            "action", flat=True
        )
    )
    assert actions_seen == ["execution.control.stopped", "execution.control.resumed"]


def test_stopping_needs_a_reason(admin_user: Any) -> None:
    response = post(api(admin_user), "/api/control/stop", {"reason": ""})
    assert response.status_code == 422 and "reason" in str(response.json()["fields"])
    assert not execution.is_stopped()


# Work items ----------------------------------------------------------------------------------


def test_a_work_item_is_listed_for_its_group_with_task_inputs_and_upstream_outputs(
    analyst: Any, officer: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    ben = personas.analyst("ben")
    response = api(ben).get("/api/work-items", {"status": "open"})
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 1
    (listed,) = body["items"]
    assert listed["id"] == item.pk and listed["case"] == item.case_id
    assert listed["node"] == "extract-fields" and listed["task"] == item.node.task
    assert listed["inputs"] == item.node.inputs
    assert listed["upstream_outputs"] == {}  # the first step: nothing ran before it
    assert listed["expected_output"] == "InvoiceFields"
    assert listed["group"] == "analyst" and listed["status"] == "open"
    assert listed["deadline"]
    assert api(ben).get("/api/work-items", {"status": "completed"}).json()["count"] == 0


def test_upstream_outputs_are_those_of_the_steps_that_ran_before(
    analyst: Any, officer: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    PlanNode.objects.filter(pk=item.node_id).update(depends_on=["lookup-supplier"])
    PlanNode.objects.filter(version_id=item.node.version_id, key="lookup-supplier").update(
        status=NodeStatus.SUCCEEDED, output={"supplier_id": "SUP-1001", "found": True}
    )
    listed = api(personas.analyst("ben")).get(f"/api/work-items/{item.pk}").json()
    assert listed["upstream_outputs"] == {
        "lookup-supplier": {"supplier_id": "SUP-1001", "found": True}
    }


def test_other_groups_and_the_submitter_find_no_work_item(
    analyst: Any, officer: Any, auditor: Any, admin_user: Any, outsider: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    for user in (analyst, officer, auditor, admin_user, outsider):
        client = api(user)
        assert client.get("/api/work-items").json()["count"] == 0, user
        assert client.get(f"/api/work-items/{item.pk}").status_code == 404
        complete = post(client, f"/api/work-items/{item.pk}/complete", {"output": {}})
        assert complete.status_code == 404, user
    assert WorkItem.objects.get(pk=item.pk).status == WorkItem.Status.OPEN


def test_completing_a_work_item_checks_the_output_and_the_step_succeeds(
    analyst: Any, officer: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    client = api(personas.analyst("ben"))
    url = f"/api/work-items/{item.pk}/complete"
    bad = post(client, url, {"output": {"invoice_id": "INV-1042"}})
    assert bad.status_code == 422
    assert "InvoiceFields" in bad.json()["message"] and "supplier_id" in bad.json()["message"]
    assert WorkItem.objects.get(pk=item.pk).status == WorkItem.Status.OPEN
    done = post(client, url, {"output": INVOICE_FIELDS})
    assert done.status_code == 200, done.content
    assert done.json()["status"] == "completed" and done.json()["completed_by"] == "ben"
    node = PlanNode.objects.get(pk=item.node_id)
    assert node.status == NodeStatus.SUCCEEDED and node.output["invoice_id"] == "INV-1042"
    assert AuditEvent.objects.filter(action="execution.work_item.completed").count() == 1
    again = post(client, url, {"output": INVOICE_FIELDS})
    assert again.status_code == 409


def test_a_work_item_of_a_cancelled_case_cannot_be_completed(analyst: Any, officer: Any) -> None:
    item = waiting_work_item(analyst, officer)
    execution.cancel_case(
        case_id=item.case_id, user=analyst, reason_code="other", reason="not needed"
    )
    response = post(
        api(personas.analyst("ben")),
        f"/api/work-items/{item.pk}/complete",
        {"output": INVOICE_FIELDS},
    )
    assert response.status_code == 409
    assert "cancelled" in response.json()["message"]


def test_the_work_item_list_costs_the_same_queries_for_one_item_and_for_many(
    analyst: Any, officer: Any
) -> None:
    waiting_work_item(analyst, officer)
    client = api(personas.analyst("ben"))
    client.get("/api/work-items")
    with CaptureQueriesContext(connection) as one:
        assert client.get("/api/work-items").json()["count"] == 1
    for _ in range(3):
        waiting_work_item(analyst, officer)
    with CaptureQueriesContext(connection) as four:
        assert client.get("/api/work-items").json()["count"] == 4
    assert len(four.captured_queries) == len(one.captured_queries)


# What plans and cases say about their run ----------------------------------------------------


def test_plan_nodes_carry_their_run_and_the_ended_case_its_verification(
    analyst: Any, officer: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    client = api(analyst)
    nodes = {n["id"]: n for n in client.get(f"/api/cases/{item.case_id}/plan").json()["nodes"]}
    first = nodes["extract-fields"]
    assert first["status"] == "running" and first["attempts"] == 1
    assert first["started_at"] is not None and first["finished_at"] is None
    assert first["output"] is None and first["error"] is None
    assert nodes["lookup-supplier"]["attempts"] == 0
    post(api(personas.analyst("ben")), f"/api/work-items/{item.pk}/complete",
         {"output": INVOICE_FIELDS})  # fmt: skip
    done = {n["id"]: n for n in client.get(f"/api/cases/{item.case_id}/plan").json()["nodes"]}
    assert done["extract-fields"]["output"]["supplier_id"] == "SUP-1001"
    assert done["extract-fields"]["finished_at"] is not None
    case = client.get(f"/api/cases/{item.case_id}").json()
    assert case["verification"] is None and case["finished_at"] is None
    execution.cancel_case(
        case_id=item.case_id, user=analyst, reason_code="other", reason="not needed"
    )
    assert client.get(f"/api/cases/{item.case_id}").json()["finished_at"] is not None


def test_a_failed_step_shows_its_error_and_class(analyst: Any, officer: Any) -> None:
    case = planned_invoice_case(analyst)
    approve_plan(case, officer)
    node = PlanNode.objects.get(version_id=case.current_version_id, key="extract-fields")
    claim = execution.claim_leaf(node.pk, worker="test")
    execution.fail_leaf(node.pk, claim.attempt, error_class="tool_failure", error="ERP is down")
    nodes = {n["id"]: n for n in api(analyst).get(f"/api/cases/{case.pk}/plan").json()["nodes"]}
    assert nodes["extract-fields"]["error"] == "ERP is down"
    assert nodes["extract-fields"]["error_class"] == "tool_failure"
    assert nodes["extract-fields"]["routing"]["agent"]


# Agents and their trust ------------------------------------------------------------------------


def test_the_agent_list_shows_the_learned_trust_routing_uses_beside_the_starting_trust(
    analyst: Any,
) -> None:
    sync_packs()
    execution.record_outcome("fraud-analyst", "failed", now=timezone.now())
    agent = Agent.objects.get(slug="fraud-analyst")
    routing_reads = execution.effective_trust(agent, list(agent.capabilities))
    assert routing_reads == pytest.approx(0.545, abs=5e-4)
    body = api(analyst).get("/api/agents?limit=200").json()
    (shown,) = [item for item in body["items"] if item["slug"] == "fraud-analyst"]
    assert shown["trust"] == pytest.approx(routing_reads, abs=1e-6)  # read a moment later
    assert shown["starting_trust"] == 0.6
