"""An analyst may submit only so many cases a minute, fewer planned by the LLM; an oversized form
is refused before it is read; the server answers the next request as usual (RELIABILITY W10)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client
from django.utils import timezone

from accounts import tokens as api_tokens
from audit.models import AuditEvent
from planning import actions
from planning.actions import RATE_LIMITED
from planning.models import Case
from tests import personas

pytestmark = pytest.mark.django_db

INVOICE_CASE: dict[str, Any] = {
    "title": "Check INV-1042",
    "goal": "Verify invoice INV-1042 before it is paid",
    "inputs": {"invoice_id": "INV-1042"},
    "domain": "invoice",
    "strategy": "static",
}
LLM_CASE: dict[str, Any] = {
    "title": "Outage",
    "goal": "Find why checkout is slow",
    "inputs": {"region": "eu"},
    "strategy": "llm",
}


@pytest.fixture(autouse=True)
def _small_rates(settings: Any, fake_openai: Any) -> Iterator[None]:
    settings.CASEHUB_SUBMIT_RATE_PER_MINUTE = 3
    settings.CASEHUB_SUBMIT_LLM_RATE_PER_MINUTE = 1
    # LLM cases may be submitted only with a provider: the test's fake one (never called here).
    settings.OPENAI_BASE_URL = fake_openai.base_url
    settings.OPENAI_API_KEY = "test-key"
    cache.clear()  # the one-audit-event-a-minute marks of earlier tests
    yield
    cache.clear()


def _api(user: Any) -> Client:
    return Client(headers={"Authorization": f"Bearer {api_tokens.issue_api_token(user)}"})


def _submit(client: Client, body: dict[str, Any]) -> Any:
    return client.post("/api/cases", body, content_type="application/json")


def _age_cases(user: Any, seconds: int) -> None:
    Case.objects.filter(submitter=user).update(
        created_at=timezone.now() - timedelta(seconds=seconds)
    )


@pytest.mark.scenario("W10")
def test_the_api_refuses_a_submission_over_the_rate_with_429_and_retry_after() -> None:
    analyst = personas.analyst()
    client = _api(analyst)
    for _ in range(3):
        assert _submit(client, INVOICE_CASE).status_code == 201
    _age_cases(analyst, 20)  # the three were sent 20 s ago: the oldest leaves the window in 40 s

    refused = _submit(client, INVOICE_CASE)
    assert refused.status_code == 429
    assert refused["Content-Type"].startswith("application/json")
    assert 39 <= int(refused["Retry-After"]) <= 41
    assert refused.json()["message"].startswith("You may submit at most 3 cases a minute.")
    assert Case.objects.filter(submitter=analyst).count() == 3

    _age_cases(analyst, 61)  # a minute later the window is empty again
    assert _submit(client, INVOICE_CASE).status_code == 201


@pytest.mark.scenario("W10")
def test_llm_planned_cases_have_a_lower_rate_than_the_others() -> None:
    client = _api(personas.analyst())
    assert _submit(client, LLM_CASE).status_code == 201
    refused = _submit(client, {**LLM_CASE, "strategy": "hybrid", "domain": "invoice"})
    assert refused.status_code == 429
    assert "at most 1 cases planned by the LLM a minute" in refused.json()["message"]
    # Cases that need no model still fit in the general rate.
    assert _submit(client, INVOICE_CASE).status_code == 201


@pytest.mark.scenario("W10")
def test_each_user_has_a_rate_of_their_own() -> None:
    first = _api(personas.analyst())
    for _ in range(3):
        assert _submit(first, INVOICE_CASE).status_code == 201
    assert _submit(first, INVOICE_CASE).status_code == 429
    second_analyst = personas.analyst("andy")
    assert _submit(_api(second_analyst), INVOICE_CASE).status_code == 201


@pytest.mark.scenario("W10")
def test_the_first_refusal_of_a_minute_is_audited_once() -> None:
    analyst = personas.analyst()
    client = _api(analyst)
    for _ in range(3):
        _submit(client, INVOICE_CASE)
    for _ in range(5):
        assert _submit(client, INVOICE_CASE).status_code == 429
    events = AuditEvent.objects.filter(action=RATE_LIMITED)
    assert events.count() == 1
    event = events.get()
    assert event.actor_user == analyst
    assert event.data["limit"] == 3 and event.data["strategy"] == "static"


@pytest.mark.scenario("W10")
def test_the_form_over_the_rate_says_why_with_429_and_keeps_what_was_typed() -> None:
    analyst = personas.analyst()
    for _ in range(3):
        actions.submit_case(submitter=analyst, **INVOICE_CASE)
    client = Client()
    client.force_login(analyst)
    response = client.post(
        "/cases/new/",
        {
            "domain": "invoice",
            "title": "Keep this title",
            "goal": "Verify invoice INV-1042 before it is paid",
            "description": "",
            "strategy": "static",
            "max_depth": "2",
            "input_invoice_id": "INV-1042",
        },
    )
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    html = response.content.decode()
    assert "You may submit at most 3 cases a minute." in html
    assert 'value="Keep this title"' in html
    assert Case.objects.filter(submitter=analyst).count() == 3


# Oversized requests -----------------------------------------------------------------------------


@pytest.mark.scenario("W10")
@pytest.mark.parametrize("megabytes", [3, 20])
def test_an_oversized_form_is_a_400_page_and_the_next_request_is_answered(megabytes: int) -> None:
    analyst = personas.analyst()
    client = Client()
    client.force_login(analyst)
    body = "description=" + "x" * (megabytes * 1024 * 1024)
    response = client.post("/cases/new/", body, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400
    html = response.content.decode()
    assert "The form sent more than 1,048,576 bytes." in html
    assert "Traceback" not in html
    assert Case.objects.count() == 0
    assert client.get("/cases/").status_code == 200


@pytest.mark.scenario("W10")
def test_an_oversized_htmx_request_is_a_notice_in_the_error_region() -> None:
    client = Client()
    client.force_login(personas.analyst())
    response = client.post(
        "/cases/new/",
        "description=" + "x" * (3 * 1024 * 1024),
        content_type="application/x-www-form-urlencoded",
        headers={"HX-Request": "true", "HX-Target": "case-form"},
    )
    assert response.status_code == 400
    assert response["HX-Retarget"] == "#htmx-error"
    assert 'data-error-notice="400"' in response.content.decode()
