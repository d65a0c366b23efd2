"""The LLM goal judge: asked, where configured, whether a case whose steps all ended reached its
goal; a verdict it cannot give fails the case with the reason; every call is in the trail (L9).

Cases of the scripted execution pack (tests/fakes/execution_pack.py, no goal rules of its own) run
in this process like a worker runs them; the fake OpenAI server plays the judge.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from oversight.goal_judge import OUTPUT_MIN_CHARS, PURPOSE, SCHEMA_NAME, bounded, judge_messages
from oversight.models import AuditEvent, Gate, GateKind, GateStatus
from planning.actions import materialise_plan, submit_case
from planning.catalogue import sync_packs
from planning.models import Case, CaseStatus, LlmCall
from tests.fakes.execution_pack import SLUG
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply
from tests.oversight.test_execution import approve, leaves, run_ready

pytestmark = pytest.mark.django_db

JUDGE = "judge-model"
REACHED = {"reached": True, "reasons": ["both steps acted once", "nothing is left open"]}


@pytest.fixture
def judged(
    settings: Any, fake_openai: FakeOpenAIServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> FakeOpenAIServer:
    """The scripted pack registered, the fake server as the provider, the judge switched on."""
    monkeypatch.setenv("CASEHUB_TEST_EFFECTS_DIR", str(tmp_path / "effects"))
    settings.CASEHUB_EXTRA_PACKS = ["tests.fakes.execution_pack.PACK"]
    for name, value in fake_openai.env().items():
        setattr(settings, name, value)
    settings.CASEHUB_LLM_MAX_RETRIES = 0
    settings.CASEHUB_GOAL_JUDGE_MODEL = JUDGE
    sync_packs()
    return fake_openai


def run_case(analyst: Any, officer: Any, script: list[dict[str, Any]] | None = None) -> Case:
    """Submit, plan, approve and run a scripted case to its end; return it refreshed."""
    script = script or [{"key": "pay"}, {"key": "note", "depends_on": ["pay"]}]
    case = submit_case(
        submitter=analyst,
        title="Scripted execution",
        goal="Settle the invoices <b>once</b>",
        domain=SLUG,
        strategy="static",
        inputs={"leaves": script},
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    approve(Gate.objects.get(case=case, kind=GateKind.PLAN, status=GateStatus.PENDING), officer)
    run_ready(case)
    case.refresh_from_db()
    return case


def judged_events(case: Case) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain=f"case:{case.pk}", action="execution.goal.judged"))


def test_without_a_judge_model_no_judge_is_asked(
    judged: FakeOpenAIServer, settings: Any, analyst: Any, officer: Any
) -> None:
    settings.CASEHUB_GOAL_JUDGE_MODEL = ""
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert judged.requests == []
    assert judged_events(case) == []


@pytest.mark.scenario("L9")
def test_a_reached_verdict_completes_the_case_with_the_judges_reasons_and_is_audited(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue(FakeReply(content=json.dumps(REACHED), prompt_tokens=321, completion_tokens=12))
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert case.verification["reasons"] == []
    assert case.verification["checks"][-3:] == [
        f"the goal judge ({JUDGE}) says the goal is reached",
        f"the goal judge ({JUDGE}): both steps acted once",
        f"the goal judge ({JUDGE}): nothing is left open",
    ]
    (request,) = judged.requests
    assert request.body["model"] == JUDGE
    assert request.response_format["json_schema"]["name"] == SCHEMA_NAME
    assert set(request.json_schema["properties"]) == {"reached", "reasons"}
    prompt = request.user_prompt
    assert "Settle the invoices <b>once</b>" in prompt and "untrusted" in prompt
    data = json.loads(prompt[prompt.index("{") :])
    assert [step["key"] for step in data["steps"]] == ["note", "pay"]
    assert data["steps"][1]["output"] == {"label": "pay", "effects": 1, "invocations": 1}
    assert data["case"]["inputs"]["leaves"][0]["key"] == "pay"
    call = LlmCall.objects.get(case=case, purpose=PURPOSE)
    assert (call.model, call.prompt_tokens, call.completion_tokens) == (JUDGE, 321, 12)
    assert call.error == ""
    (event,) = judged_events(case)
    assert event.data["reached"] is True and event.data["reasons"] == REACHED["reasons"]
    assert event.data["parameters"]["model"] == JUDGE
    assert event.data["parameters"]["schema"] == SCHEMA_NAME
    (made,) = event.data["calls"]
    assert made["prompt_hash"] == call.prompt_hash
    assert made["response_hash"] == call.response_hash
    assert (made["prompt_tokens"], made["completion_tokens"]) == (321, 12)
    assert made["latency_ms"] == call.latency_ms
    recorded = AuditEvent.objects.get(action="planning.llm.called", data__llm_call=call.pk)
    assert recorded.data["purpose"] == PURPOSE
    ended = AuditEvent.objects.get(chain=f"case:{case.pk}", action="planning.case.completed")
    assert ended.seq > event.seq  # the verdict is in the trail before the case's end


def test_a_not_reached_verdict_fails_the_case_with_the_judges_reasons(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue({"reached": False, "reasons": ["the note does not say which invoice"]})
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.FAILED
    assert case.verification["passed"] is False
    assert case.verification["reasons"] == [
        f"the goal judge ({JUDGE}) says the goal is not reached",
        f"the goal judge ({JUDGE}): the note does not say which invoice",
    ]
    (event,) = judged_events(case)
    assert event.data["reached"] is False and event.data["error"] is None


def test_a_malformed_verdict_fails_the_case_instead_of_completing_it(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue('{"reached": "probably", "reasons": []}')
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.FAILED
    (reason,) = case.verification["reasons"]
    assert reason.startswith(f"the goal judge ({JUDGE}) could not decide: its answer does not fit")
    assert "reached" in reason
    call = LlmCall.objects.get(case=case, purpose=PURPOSE)
    assert call.response == '{"reached": "probably", "reasons": []}' and call.error
    (event,) = judged_events(case)
    assert event.data["reached"] is None and "does not fit" in event.data["error"]


def test_unparseable_text_fails_the_case(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue("The goal looks reached to me.")
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.FAILED
    assert "could not decide" in case.verification["reasons"][0]


def test_a_server_error_fails_the_case_and_the_failed_call_is_recorded(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue(FakeReply(status=500, error_message="the judge is down"))
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.FAILED
    (reason,) = case.verification["reasons"]
    assert reason.startswith(f"the goal judge ({JUDGE}) could not decide: LLM call to model")
    call = LlmCall.objects.get(case=case, purpose=PURPOSE)
    assert call.error and call.response == ""
    (event,) = judged_events(case)
    assert event.data["error"] and len(event.data["calls"]) == 1


def test_a_judge_without_a_provider_fails_the_case(
    judged: FakeOpenAIServer, settings: Any, analyst: Any, officer: Any
) -> None:
    settings.OPENAI_BASE_URL = ""
    settings.OPENAI_API_KEY = ""
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.FAILED
    assert "could not decide" in case.verification["reasons"][0]
    assert "needs an LLM provider" in case.verification["reasons"][0]
    assert judged.requests == []
    (event,) = judged_events(case)
    assert event.data["calls"] == [] and event.data["error"]


def test_a_case_whose_steps_failed_is_not_judged(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    case = run_case(analyst, officer, [{"key": "broken", "tool": "fail"}])
    assert case.status == CaseStatus.FAILED
    assert judged.requests == []
    assert not any("goal judge" in reason for reason in case.verification["reasons"])


def test_outputs_are_cut_to_a_bounded_size_and_marked(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue(REACHED)
    case = run_case(analyst, officer)
    nodes = list(leaves(case).values())
    huge = {"text": "x" * 100_000}
    nodes[0].output = huge
    case.description = "y" * 50_000
    (_, user) = judge_messages(case, nodes)
    assert len(user["content"]) < 40_000
    data = json.loads(user["content"][user["content"].index("{") :])
    cut = next(step["output"] for step in data["steps"] if step["key"] == nodes[0].key)
    assert cut["truncated"] is True and cut["chars"] > 100_000
    assert data["case"]["description"]["truncated"] is True
    assert bounded({"a": 1}, OUTPUT_MIN_CHARS) == {"a": 1}


def test_the_case_page_shows_the_judges_reasons_escaped(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue({"reached": False, "reasons": ['<img src=x onerror="alert(1)"> is no report']})
    case = run_case(analyst, officer)
    client = Client()
    client.force_login(analyst)
    page = client.get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    result = page[page.index('id="case-result"') :]
    assert f"the goal judge ({JUDGE}) says the goal is not reached" in result
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt; is no report" in result
    assert '<img src=x onerror="alert(1)">' not in page
