"""Cases for the promotion tests: a hybrid incident of an unknown kind, planned by the LLM (the
real openai client against the fake server), approved and run through the real oversight actions."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.models import User
from django.test import override_settings

from execution import actions as execution
from execution.models import WorkItem
from execution.work_items import complete_work_item
from oversight.actions.gates import DecisionInput, decide_gate
from oversight.models import Gate, GateStatus
from planning.actions import materialise_plan, submit_case
from planning.models import Case, NodeStatus, PlanNode
from tests.fakes.openai_server import FakeOpenAIServer, RecordedRequest
from tests.personas import PASSWORD, make_user
from tests.planning.llm_scripts import incident_responder

UNKNOWN_KIND = "certificate-expiry"


def model(request: RecordedRequest) -> str:
    """Answer planning requests with the incident plan and an agent's step with its result."""
    if "steps" in json.dumps(request.json_schema):
        return incident_responder(request)
    return json.dumps({"summary": "notice drafted"})


def llm(server: FakeOpenAIServer) -> Any:
    """Point the planner and the agents at the fake server."""
    return override_settings(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="test-key")


def incident(
    submitter: Any, *, kind: str = UNKNOWN_KIND, description: str = "", service: str = "web"
) -> Case:
    """Submit and plan a hybrid incident case (inside `llm(...)`); return it refreshed."""
    case = submit_case(
        submitter=submitter,
        title=f"Incident: {kind}",
        goal="Respond to the incident",
        description=description,
        domain="incident",
        strategy="hybrid",
        inputs={"kind": kind, "service": service},
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    return case


def _leaves(case: Case) -> list[PlanNode]:
    return list(PlanNode.objects.filter(version_id=case.current_version_id, kind="leaf"))


def run_to_end(case: Case, officer: User, person: User) -> Case:
    """Approve every gate as `officer`, run the ready steps, complete work items as `person`."""
    for _ in range(20):
        for gate in Gate.objects.filter(case=case, status=GateStatus.PENDING).select_related(
            "approver_group"
        ):
            # A step gate may be for another group (the supervisors): one of them decides it.
            decider = (
                officer
                if officer.groups.filter(pk=gate.approver_group_id).exists()
                else (
                    make_user(
                        f"{gate.approver_group.name[:10]}-{gate.pk}".replace(" ", "-"),
                        gate.approver_group.name,
                    )
                )
            )
            decide_gate(
                gate_id=gate.pk,
                user=decider,
                decision=DecisionInput(decision="approve", password=PASSWORD),
            )
        ready = [n for n in _leaves(case) if n.status == NodeStatus.READY]
        for node in ready:
            execution.execute_leaf(node.pk, worker="test")
        items = list(WorkItem.objects.filter(case=case, status="open"))
        for item in items:
            complete_work_item(item_id=item.pk, user=person, output={"summary": "triaged"})
        if all(n.status == NodeStatus.SUCCEEDED for n in _leaves(case)):
            break
    case.refresh_from_db()
    return case
