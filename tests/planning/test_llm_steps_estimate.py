"""The steps an `llm` agent runs are counted with the planning calls, and a plan with such steps
on an installation without a provider says so on the form, the case page and the plan gate."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from oversight.models import Gate, GateKind
from planning.catalogue import sync_packs
from planning.estimates import LlmSteps, preview_llm_steps
from tests.cases import planned_case
from tests.planning.test_views import client_for, htmx_get

pytestmark = pytest.mark.django_db

LIGHT_FRAUD = {"input_account_id": "ACC-410", "input_amount": "120"}
BREACH = {"kind": "security-breach", "service": "web", "affected_hosts": ["web-2"]}
NO_PROVIDER_WARNING = "This installation has no LLM provider, so"


@pytest.fixture(autouse=True)
def packs() -> None:
    sync_packs()


def _estimate(user: Any, **params: Any) -> str:
    response = htmx_get(client_for(user), reverse("planning:case-new"), "llm-estimate", **params)
    assert response.status_code == 200
    return str(response.content.decode())


def test_with_a_provider_the_forms_estimate_counts_the_fraud_analysts_step(
    analyst: Any, settings: Any
) -> None:
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"  # configured; nothing is called
    body = _estimate(analyst, domain="fraud", strategy="static", max_depth=2, **LIGHT_FRAUD)
    assert "No LLM calls to plan" in body
    assert "1 step for an LLM agent (fraud-analyst): up to 4 LLM calls when it runs" in body
    assert NO_PROVIDER_WARNING not in body
    settings.CASEHUB_LLM_AGENT_MAX_ROUNDS = 2
    body = _estimate(analyst, domain="fraud", strategy="static", max_depth=2, **LIGHT_FRAUD)
    assert "up to 2 LLM calls when it runs" in body


def test_without_a_provider_the_fraud_plan_has_no_llm_step_and_the_form_says_so(
    analyst: Any, settings: Any
) -> None:
    settings.OPENAI_API_KEY = settings.OPENAI_BASE_URL = ""
    body = _estimate(analyst, domain="fraud", strategy="static", max_depth=2, **LIGHT_FRAUD)
    assert "The plan has no step for an LLM agent: no LLM calls in all." in body
    assert NO_PROVIDER_WARNING not in body


def test_the_forms_estimate_waits_for_valid_inputs_to_count_llm_steps(analyst: Any) -> None:
    body = _estimate(analyst, domain="fraud", strategy="static", max_depth=2)
    assert "shows once the inputs are valid" in body


def test_llm_planning_adds_the_llm_steps_to_its_planning_calls(analyst: Any, settings: Any) -> None:
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    body = _estimate(analyst, domain="fraud", strategy="llm", max_depth=3, **LIGHT_FRAUD)
    assert "Up to 31 LLM calls (b = 5, depth 3) to plan the case" in body
    assert "Each step the plan gives an LLM agent makes up to 4 more when it runs." in body


def test_a_breach_plan_counts_its_llm_step_with_a_provider_and_gives_it_to_a_person_without(
    settings: Any,
) -> None:
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"  # configured; nothing is called
    steps = preview_llm_steps(domain="incident", strategy="static", inputs=BREACH, max_depth=2)
    assert steps is not None and steps.agents == ("forensic-analyst",)
    assert not steps.cannot_run and steps.warning == ""
    settings.OPENAI_API_KEY = settings.OPENAI_BASE_URL = ""
    steps = preview_llm_steps(domain="incident", strategy="static", inputs=BREACH, max_depth=2)
    assert steps is not None and steps.keys == () and not steps.cannot_run
    assert preview_llm_steps(domain="incident", strategy="llm", inputs=BREACH, max_depth=2) is None


def test_llm_steps_without_a_provider_say_they_cannot_run() -> None:
    steps = LlmSteps(keys=("analyse",), agents=("forensic-analyst",), has_provider=False, rounds=4)
    assert steps.cannot_run and NO_PROVIDER_WARNING in steps.warning and "analyse" in steps.warning
    assert LlmSteps(keys=(), agents=(), has_provider=False, rounds=4).warning == ""


def test_the_case_page_and_the_plan_gate_say_an_llm_step_cannot_run_without_a_provider(
    analyst: Any, officer: Any, settings: Any
) -> None:
    # Planned while a provider was configured, which the operator then removed before approval.
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    case = planned_case(analyst, domain="incident", inputs=BREACH)
    settings.OPENAI_API_KEY = settings.OPENAI_BASE_URL = ""
    client = client_for(officer)
    page = client.get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    assert "0 LLM calls to plan · 1 step for an LLM agent (forensic-analyst)" in page
    assert 'data-note="llm-steps"' in page and NO_PROVIDER_WARNING in page
    gate = Gate.objects.get(case=case, kind=GateKind.PLAN)
    page = client.get(reverse("oversight:gate-detail", args=[gate.pk])).content.decode()
    assert 'data-note="llm-steps"' in page and NO_PROVIDER_WARNING in page
    # With a provider the step can run: counted, not flagged.
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"
    page = client.get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    assert "1 step for an LLM agent" in page and NO_PROVIDER_WARNING not in page


def test_a_fraud_plan_made_without_a_provider_shows_no_llm_step_and_no_warning(
    analyst: Any, officer: Any, settings: Any
) -> None:
    settings.OPENAI_API_KEY = settings.OPENAI_BASE_URL = ""
    case = planned_case(analyst, domain="fraud", inputs={"account_id": "ACC-410", "amount": "120"})
    page = client_for(officer).get(reverse("planning:case-detail", args=[case.pk]))
    body = page.content.decode()
    assert "0 LLM calls to plan</span>" in body and NO_PROVIDER_WARNING not in body
