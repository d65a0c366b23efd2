"""The case form's LLM estimate: expected calls, their cost (an upper estimate) and the budgets."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from planning.catalogue import sync_packs
from planning.core.llm.pricing import PriceTable
from planning.models import LlmUsage
from tests.planning.test_views import client_for, htmx_get

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def priced(settings: Any) -> None:
    sync_packs()
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"  # a provider; nothing is called
    settings.CASEHUB_LLM_MODEL = "gpt-4o-mini"
    settings.CASEHUB_LLM_PRICE_TABLE = PriceTable.parse("gpt-4o-mini=0.15/0.60")
    settings.CASEHUB_LLM_MAX_TOKENS_PER_CALL = 2048
    for scope in ("CASE", "DAY"):
        setattr(settings, f"CASEHUB_LLM_{scope}_MAX_CALLS", 0)
        setattr(settings, f"CASEHUB_LLM_{scope}_MAX_TOKENS", 0)
        setattr(settings, f"CASEHUB_LLM_{scope}_MAX_COST_USD", Decimal(0))


def _estimate(user: Any, strategy: str = "llm", depth: int = 3, domain: str = "") -> str:
    response = htmx_get(
        client_for(user), reverse("planning:case-new"), "llm-estimate",
        domain=domain, strategy=strategy, max_depth=depth,
    )  # fmt: skip
    assert response.status_code == 200
    body: str = response.content.decode().strip()
    assert body.startswith('<p id="llm-estimate"')
    return body


def test_the_estimate_shows_the_calls_and_their_cost_at_the_models_price(analyst: Any) -> None:
    body = _estimate(analyst)
    # 31 calls x (1,500 prompt tokens at $0.15/M + 2,048 answer tokens at $0.60/M) = $0.045
    assert "Up to 31 LLM calls" in body
    assert "Up to about $0.05 on gpt-4o-mini (an upper estimate" in body
    assert "budget-warning" not in body and "today" not in body


def test_an_unpriced_model_has_an_unknown_cost_never_zero(analyst: Any, settings: Any) -> None:
    settings.CASEHUB_LLM_PRICE_TABLE = PriceTable()
    body = _estimate(analyst)
    assert "Cost unknown: the model gpt-4o-mini has no price configured." in body
    assert "$0.00" not in body


def test_a_plan_that_may_pass_the_per_case_budget_is_flagged_before_submit(
    analyst: Any, settings: Any
) -> None:
    settings.CASEHUB_LLM_CASE_MAX_COST_USD = Decimal("0.01")
    settings.CASEHUB_LLM_CASE_MAX_CALLS = 20
    body = _estimate(analyst)
    assert 'class="budget-warning"' in body
    assert "may pass the per-case budget (20 calls, $0.01)" in body
    assert "may pass" not in _estimate(analyst, depth=1)  # 1 call, $0.0015


def test_the_form_shows_what_is_left_of_todays_budget(analyst: Any, settings: Any) -> None:
    settings.CASEHUB_LLM_DAY_MAX_CALLS = 100
    settings.CASEHUB_LLM_DAY_MAX_COST_USD = Decimal("5")
    LlmUsage.objects.create(day=timezone.localdate(), calls=95, cost_nano_usd=1_250_000_000)
    body = _estimate(analyst)
    assert "Left of today&#x27;s LLM budget: 5 calls, $3.75. It may not be enough" in body
    assert "It may not be enough" not in _estimate(analyst, depth=1)


def test_strategies_without_llm_calls_show_no_cost(analyst: Any) -> None:
    body = _estimate(analyst, strategy="static", depth=2, domain="invoice")
    assert "No LLM calls" in body and "$" not in body
