"""Planning through a real Celery worker process, with the real openai client against the fake
OpenAI server, on the configured database and broker."""

from __future__ import annotations

import time
from typing import Any

import pytest

from planning.actions import submit_case
from planning.models import Case, CaseStatus, LlmCall, PlanNode, PlanVersion
from tests import personas
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply
from tests.planning.llm_scripts import fraud_plan_responder, incident_responder

pytestmark = pytest.mark.integration


def _settled(case: Case, timeout_s: float = 60) -> Case:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        case.refresh_from_db()
        if case.status != CaseStatus.PLANNING:
            return case
        time.sleep(0.2)
    pytest.fail(f"case {case.pk} still planning after {timeout_s} s")


def _submit(**fields: Any) -> Case:
    return submit_case(submitter=personas.analyst(), title="A case", **fields)


def test_a_submitted_invoice_case_is_planned_by_the_worker(worker_process: Any) -> None:
    case = _submit(
        goal="Verify invoice INV-1042",
        domain="invoice",
        strategy="static",
        inputs={"invoice_id": "INV-1042"},
    )
    case = _settled(case)
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    keys = set(PlanNode.objects.filter(version=case.current_version).values_list("key", flat=True))
    assert {"extract-fields", "lookup-supplier", "check-duplicate", "audit-report"} <= keys


def test_llm_planning_runs_in_the_worker_against_the_llm_server(
    llm_worker_process: Any, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.responder = fraud_plan_responder
    case = _settled(_submit(goal="investigate-fraud", strategy="llm", max_depth=2))
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    assert case.current_version is not None
    assert case.current_version.llm_calls == 2
    assert len(fake_openai.requests) == 2
    assert LlmCall.objects.filter(case=case).count() == 2


def test_hybrid_planning_of_an_unknown_incident_asks_the_llm(
    llm_worker_process: Any, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.responder = incident_responder
    case = _settled(
        _submit(
            goal="Certificate expired on the web tier",
            domain="incident",
            strategy="hybrid",
            inputs={"kind": "certificate-expiry", "service": "web"},
        )
    )
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    assert len(fake_openai.requests) == 1
    leaves = PlanNode.objects.filter(version=case.current_version, kind="leaf")
    assert {leaf.provenance["strategy"] for leaf in leaves} == {"hybrid"}


def test_a_failing_llm_leaves_the_case_plan_failed_with_no_plan_rows(
    llm_worker_process: Any, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.responder = lambda request: FakeReply(status=500, should_retry=False)
    case = _settled(_submit(goal="investigate-fraud", strategy="llm"))
    assert case.status == CaseStatus.PLAN_FAILED
    assert case.error
    assert not PlanVersion.objects.filter(case=case).exists()
    assert not PlanNode.objects.exists()


@pytest.mark.scenario("L1")
def test_an_answer_cut_off_twice_fails_the_case_saying_so_and_saves_no_plan(
    llm_worker_process: Any, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.responder = lambda request: FakeReply(
        content='{"steps": [{"id": "1", "agent": "fraud-analyst", "task": "re',
        finish_reason="length",
    )
    case = _settled(_submit(goal="investigate-fraud", strategy="llm", max_depth=1))
    assert case.status == CaseStatus.PLAN_FAILED
    assert "was cut off again, after a request for a shorter answer" in case.error
    assert "not valid JSON" not in case.error
    assert all(request.max_tokens for request in fake_openai.requests)
    assert not PlanVersion.objects.filter(case=case).exists()


def test_a_server_without_json_schema_support_still_plans_the_case(
    llm_worker_process: Any, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.refuse_json_schema = True
    fake_openai.responder = fraud_plan_responder
    case = _settled(_submit(goal="investigate-fraud", strategy="llm", max_depth=2))
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    formats = [request.response_format["type"] for request in fake_openai.requests]
    assert formats[0] == "json_schema" and set(formats[1:]) == {"json_object"}
