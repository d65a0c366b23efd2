"""The planner's settings from the database and Django settings, against the fake OpenAI server."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from pydantic import BaseModel

from planning import planner
from planning.actions import materialise_plan
from planning.core.llm.decomposition import LlmDecomposition
from planning.core.llm.records import LlmCallRecord
from planning.models import Agent, Case, CaseStatus, LlmCall, PlanNode, PlanVersion, Strategy
from planning.packs import PACKS
from tests import personas
from tests.fakes.openai_server import FakeOpenAIServer, RecordedRequest
from tests.planning.core.llm_helpers import answer, leaf
from tests.planning.factories import make_case

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "You plan fraud investigations for the bank's fraud desk. Interviews come first."


class _AnyInputs(BaseModel):
    """The test pack takes any inputs: the pack's own schema is not what is under test."""


@pytest.fixture
def fraud_with_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    pack = dataclasses.replace(
        PACKS["fraud"], planner_agent="fraud-analyst", input_schema=_AnyInputs
    )
    monkeypatch.setattr(planner, "enabled_pack", lambda slug: pack if slug == "fraud" else None)


@pytest.fixture
def llm(fake_openai: FakeOpenAIServer) -> Iterator[FakeOpenAIServer]:
    def respond(request: RecordedRequest) -> str:
        agent = "fraud-analyst" if "- fraud-analyst:" in request.user_prompt else "investigator"
        return answer(leaf("review", agent, "review the flagged transactions"))

    fake_openai.responder = respond
    with override_settings(OPENAI_BASE_URL=fake_openai.base_url, OPENAI_API_KEY="test-key"):
        yield fake_openai


def _case() -> Case:
    return make_case(
        personas.analyst(),
        domain="fraud",
        strategy=Strategy.LLM,
        status=CaseStatus.PLANNING,
        inputs={},
        max_depth=1,
    )


def _plan(case: Case) -> list[LlmCallRecord]:
    records: list[LlmCallRecord] = []
    request = planner.build_request(case, records.append)
    try:
        request.strategy.plan(request.goal, request.state)
    finally:
        request.close()
    return records


def test_a_packs_planner_agent_plans_with_its_own_model_and_system_prompt(
    fraud_with_planner: None, llm: FakeOpenAIServer
) -> None:
    Agent.objects.filter(slug="fraud-analyst").update(model="fraud-llama-8b", system_prompt=PROMPT)
    records = _plan(_case())
    (request,) = llm.requests
    assert request.body["model"] == "fraud-llama-8b"
    assert request.system_prompt.startswith(PROMPT)
    assert 'Answer with JSON only: an object {"steps": [...]}' in request.system_prompt
    assert "planning component of CaseHub" not in request.system_prompt
    assert [r.model for r in records] == ["fraud-llama-8b"]  # the trail names the model used


@pytest.mark.parametrize(
    "change",
    [
        {"enabled": False},
        {"kind": Agent.Kind.HUMAN},
        {"model": "", "system_prompt": ""},
    ],
    ids=["disabled", "not-an-llm-agent", "nothing-set"],
)
def test_without_a_usable_planner_agent_the_environment_model_and_prompt_are_used(
    fraud_with_planner: None, llm: FakeOpenAIServer, change: dict[str, Any]
) -> None:
    Agent.objects.filter(slug="fraud-analyst").update(
        **{"model": "fraud-llama-8b", "system_prompt": PROMPT, **change}
    )
    _plan(_case())
    (request,) = llm.requests
    assert request.body["model"] == settings.CASEHUB_LLM_MODEL
    assert "planning component of CaseHub" in request.system_prompt
    assert PROMPT not in request.system_prompt


def test_only_the_model_is_taken_from_an_agent_that_sets_no_prompt(
    fraud_with_planner: None, llm: FakeOpenAIServer
) -> None:
    Agent.objects.filter(slug="fraud-analyst").update(model="fraud-llama-8b", system_prompt="")
    _plan(_case())
    (request,) = llm.requests
    assert request.body["model"] == "fraud-llama-8b"
    assert "planning component of CaseHub" in request.system_prompt


def test_a_pack_naming_no_planner_agent_plans_with_the_environment(
    monkeypatch: pytest.MonkeyPatch, llm: FakeOpenAIServer
) -> None:
    pack = dataclasses.replace(PACKS["fraud"], planner_agent="", input_schema=_AnyInputs)
    monkeypatch.setattr(planner, "enabled_pack", lambda slug: pack)
    Agent.objects.filter(slug="fraud-analyst").update(model="fraud-llama-8b", system_prompt=PROMPT)
    _plan(_case())
    assert llm.requests[0].body["model"] == settings.CASEHUB_LLM_MODEL


def test_llm_planning_offers_only_the_packs_llm_and_human_agents(
    fraud_with_planner: None, llm: FakeOpenAIServer
) -> None:
    _plan(_case())
    prompt = llm.requests[0].user_prompt
    offered = {line.split(":")[0][2:] for line in prompt.splitlines() if line.startswith("- ")}
    kinds = dict(Agent.objects.filter(pack__slug="fraud").values_list("slug", "kind"))
    assert offered == {slug for slug, kind in kinds.items() if kind in ("llm", "human")}
    assert "tool" in kinds.values()  # the pack has tool agents, and none was offered


def test_llm_planning_shows_the_model_the_packs_own_method_and_the_agents_descriptions(
    monkeypatch: pytest.MonkeyPatch, llm: FakeOpenAIServer
) -> None:
    pack = dataclasses.replace(PACKS["fraud"], planner_agent="")
    monkeypatch.setattr(planner, "enabled_pack", lambda slug: pack)
    case = _case()
    case.inputs = {"account_id": "ACC-7", "amount": "50", "prior_flags": 0}
    case.save(update_fields=["inputs"])
    _plan(case)
    prompt = llm.requests[0].user_prompt
    assert (
        "Example: how this domain's own method 'light-investigation' decomposes "
        "'investigate-fraud' for this case." in prompt
    )
    assert '{"id": "pull-transactions", "task": "Pull the transactions", "depends_on": null}' in (
        prompt
    )
    analyst = Agent.objects.get(slug="fraud-analyst")
    assert analyst.description and f"- fraud-analyst: {analyst.name}. {analyst.description}" in (
        prompt
    )


def test_the_concurrency_setting_reaches_the_client_and_the_planner(
    fraud_with_planner: None, llm: FakeOpenAIServer
) -> None:
    with override_settings(CASEHUB_LLM_CONCURRENCY=3):
        request = planner.build_request(_case(), lambda record: None)
    request.close()
    (client,) = request.clients
    assert client.settings.max_concurrency == 3
    assert isinstance(request.strategy, LlmDecomposition)
    assert request.strategy.new_run().max_concurrency == 3


def test_llm_settings_out_of_range_make_planning_unavailable_naming_the_setting() -> None:
    with (
        override_settings(OPENAI_API_KEY="k", CASEHUB_LLM_CONCURRENCY=0),
        pytest.raises(planner.PlanningUnavailable, match="max_concurrency"),
    ):
        planner.llm_settings()


def test_the_per_call_token_ceiling_and_the_response_format_reach_the_client() -> None:
    assert planner.llm_settings().max_tokens_per_call == settings.CASEHUB_LLM_MAX_TOKENS_PER_CALL
    with override_settings(
        OPENAI_API_KEY="k",
        CASEHUB_LLM_MAX_TOKENS_PER_CALL=512,
        CASEHUB_LLM_RESPONSE_FORMAT="json_object",
    ):
        chosen = planner.llm_settings()
    assert (chosen.max_tokens_per_call, chosen.response_format) == (512, "json_object")
    lines = (ROOT / ".env.example").read_text().splitlines()
    assert "CASEHUB_LLM_MAX_TOKENS_PER_CALL=2048" in lines
    assert "CASEHUB_LLM_RESPONSE_FORMAT=json_schema" in lines


def test_the_concurrency_setting_is_read_from_the_environment_and_defaults_to_64(
    tmp_path: Path,
) -> None:
    code = "from django.conf import settings as s; print(s.CASEHUB_LLM_CONCURRENCY)"
    base = {k: v for k, v in os.environ.items() if k != "CASEHUB_LLM_CONCURRENCY"}
    base.update(
        DJANGO_SETTINGS_MODULE="casehub.settings",
        CASEHUB_VAR_DIR=str(tmp_path),
        SECRET_KEY="tests-only",
    )
    values = [
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**base, **extra},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for extra in ({}, {"CASEHUB_LLM_CONCURRENCY": "16"})
    ]
    assert values == ["64", "16"]
    assert "CASEHUB_LLM_CONCURRENCY=64" in (ROOT / ".env.example").read_text().splitlines()


def test_a_step_still_invalid_after_the_repairs_is_dropped_and_its_warning_stored_with_the_plan(
    fake_openai: FakeOpenAIServer,
) -> None:
    stubborn = answer(
        leaf("review", "fraud-analyst", "review the flagged transactions"),
        leaf("pull", "transaction-monitor", "pull the transactions"),  # a tool agent
    )
    fake_openai.responder = lambda request: stubborn
    case = make_case(
        personas.analyst(),
        domain="",
        strategy=Strategy.LLM,
        status=CaseStatus.PLANNING,
        inputs={},
        goal="investigate-fraud",
        max_depth=1,
    )
    with override_settings(OPENAI_BASE_URL=fake_openai.base_url, OPENAI_API_KEY="test-key"):
        materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    version = PlanVersion.objects.get(case=case)
    (warning,) = version.warnings
    assert "dropped step 'pull'" in warning and "'transaction-monitor'" in warning
    leaves = PlanNode.objects.filter(version=version, kind=PlanNode.Kind.LEAF)
    assert list(leaves.values_list("key", "agent")) == [("review", "fraud-analyst")]
    calls = LlmCall.objects.filter(case=case)
    # the call and one repair request, each recorded with why; the model repeated its answer,
    # so the second repair request was not sent
    assert calls.count() == 2
    assert all("not one of the available agents" in call.error for call in calls)
    assert "the model repeated an earlier answer word for word" in warning


def test_a_dangling_reference_and_a_reused_id_are_fixed_and_their_warnings_stored_with_the_plan(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = lambda request: answer(
        leaf("review", "fraud-analyst", "review the flagged transactions"),
        leaf("review", "fraud-analyst", "summarise the findings", depends_on=["step-0"]),
    )
    case = make_case(
        personas.analyst(),
        domain="",
        strategy=Strategy.LLM,
        status=CaseStatus.PLANNING,
        inputs={},
        goal="investigate-fraud",
        max_depth=1,
    )
    with override_settings(OPENAI_BASE_URL=fake_openai.base_url, OPENAI_API_KEY="test-key"):
        materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    version = PlanVersion.objects.get(case=case)
    renamed, dropped = version.warnings
    assert "renamed 'review-2'" in renamed
    assert "depends on 'step-0', which is not the id of any step" in dropped
    leaves = PlanNode.objects.filter(version=version, kind=PlanNode.Kind.LEAF)
    assert list(leaves.values_list("key", flat=True)) == ["review", "review-2"]
    assert LlmCall.objects.filter(case=case).count() == 1  # no repair spent on references


def test_a_one_step_depth_one_plan_of_a_goal_of_two_actions_is_stored_with_a_warning(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = lambda request: answer(leaf("review", "fraud-analyst"))
    case = make_case(
        personas.analyst(),
        domain="",
        strategy=Strategy.LLM,
        status=CaseStatus.PLANNING,
        inputs={},
        goal="Review the transfers and interview the account holder",
        max_depth=1,
    )
    with override_settings(OPENAI_BASE_URL=fake_openai.base_url, OPENAI_API_KEY="test-key"):
        materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    (warning,) = PlanVersion.objects.get(case=case).warnings
    assert "has a single step, but the goal has several parts" in warning
    assert "'Review the transfers', 'interview the account holder'" in warning


def test_an_llm_plan_with_no_usable_step_fails_and_stores_no_plan(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = lambda request: answer(leaf("pull", "transaction-monitor"))
    case = make_case(
        personas.analyst(),
        domain="",
        strategy=Strategy.LLM,
        status=CaseStatus.PLANNING,
        inputs={},
        goal="investigate-fraud",
        max_depth=1,
    )
    with override_settings(OPENAI_BASE_URL=fake_openai.base_url, OPENAI_API_KEY="test-key"):
        materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.status == CaseStatus.PLAN_FAILED
    assert "no usable step for goal 'investigate-fraud'" in case.error
    assert not PlanVersion.objects.filter(case=case).exists()


def test_an_invoice_case_planned_by_the_llm_at_depth_two_stores_the_packs_leaves_with_their_tools(
    fake_openai: FakeOpenAIServer,
) -> None:
    def respond(request: RecordedRequest) -> str:
        if "Goal: checks" in request.user_prompt:
            return answer(
                {**leaf("c1", "ap-reviewer", "look for a duplicate"), "action": "check-duplicate"}
            )
        assert "- check-duplicate: Check payment history" in request.user_prompt
        return answer(
            {**leaf("s1", "ap-reviewer", "read the invoice"), "action": "extract-fields"},
            {
                "id": "s2",
                "subtask": "checks",
                "description": "check the invoice",
                "depends_on": None,
            },
            leaf("s3", "ap-reviewer", "decide what to do with the findings"),
        )

    fake_openai.responder = respond
    case = make_case(
        personas.analyst(),
        domain="invoice",
        strategy=Strategy.LLM,
        status=CaseStatus.PLANNING,
        inputs={"invoice_id": "INV-1042"},
        max_depth=2,
    )
    with override_settings(OPENAI_BASE_URL=fake_openai.base_url, OPENAI_API_KEY="test-key"):
        materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    version = PlanVersion.objects.get(case=case)
    leaves = {
        node.key: node for node in PlanNode.objects.filter(version=version, kind=PlanNode.Kind.LEAF)
    }
    assert set(leaves) == {"extract-fields", "check-duplicate", "s3"}
    duplicate = leaves["check-duplicate"]
    assert (duplicate.agent, duplicate.tool) == ("payments-auditor", "check_duplicate_payment")
    assert duplicate.inputs == {"invoice": {"$ref": "extract-fields"}}
    assert (leaves["extract-fields"].tool, leaves["extract-fields"].inputs) == (
        "extract_invoice_fields",
        {"invoice_id": "INV-1042"},
    )
    assert leaves["s3"].tool == ""
    assert LlmCall.objects.filter(case=case).count() == 2
