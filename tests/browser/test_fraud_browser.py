"""A new user's fraud case on an installation without an LLM provider, in a real browser, on a
real worker: the form's estimate says the plan has no step for an LLM agent, the officer approves
the plan (its gate flags nothing), a person writes up the findings, and the case completes.

Before, the plan gave the write-up to the `llm` agent fraud-analyst while the form said "No LLM
calls"; the step failed for want of a provider and lowered the agent's trust.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from execution import actions as execution
from execution.models import WorkItem
from oversight.models import Gate, GateKind
from planning.models import Agent, Case, CaseStatus, NodeStatus
from tests import personas
from tests.browser.test_case_flow import _log_in, _watch_console
from tests.browser.test_execution_browser import _decider, _open_gate
from tests.integration.execution import Harness, leaf, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]

SHOWN_WITHIN_MS = 30_000


def _fraud_analyst_trust() -> float:
    agent = Agent.objects.get(slug="fraud-analyst")
    return execution.effective_trust(agent, list(agent.capabilities))


def test_a_new_users_fraud_case_completes_without_an_llm_provider(
    page: Any,
    browser: Any,
    live_server: Any,
    transactional_db: None,
    settings: Any,
    tmp_path: Any,
    analyst: Any,
    officer: Any,
) -> None:
    settings.OPENAI_API_KEY = settings.OPENAI_BASE_URL = ""
    harness = Harness(settings, tmp_path / "effects")
    second = personas.analyst("ben")  # does the work items of ana's cases
    trust_before = _fraud_analyst_trust()
    problems = _watch_console(page)
    page.set_viewport_size({"width": 1300, "height": 1100})
    _log_in(page, analyst.username)

    page.click('[data-nav="case-new"]')
    page.wait_for_selector("#case-form")
    page.select_option("select[name=domain]", "fraud")
    page.wait_for_selector("input[name=input_account_id]")
    page.fill("input[name=title]", "Check ACC-410")
    page.fill("input[name=goal]", "Find out whether the flagged payment is fraud")
    page.fill("input[name=input_account_id]", "ACC-410")
    page.fill("input[name=input_amount]", "120")
    page.locator("input[name=input_amount]").dispatch_event("change")
    estimate = page.wait_for_selector(
        "#llm-estimate >> text=The plan has no step for an LLM agent", timeout=SHOWN_WITHIN_MS
    )
    assert "No LLM calls to plan" in estimate.inner_text()
    assert page.locator('[data-budget="llm-steps"]').count() == 0
    worker = harness.worker()
    contexts: list[Any] = []
    try:
        page.click("button.primary[type=submit]")
        page.wait_for_selector("#case-live")
        case = Case.objects.get(domain="fraud")
        page.wait_for_selector(
            '#case-live[data-status="awaiting_approval"]', timeout=SHOWN_WITHIN_MS
        )
        status = page.locator(".case-status").inner_text()
        assert "0 LLM calls to plan" in status and "step for an LLM agent" not in status
        assert page.locator('[data-note="llm-steps"]').count() == 0
        assert leaf(case, "summarise-findings").agent == "investigator"

        context, officer_page, officer_problems = _decider(browser, live_server, officer.username)
        contexts.append(context)
        _open_gate(officer_page, Gate.objects.get(case=case, kind=GateKind.PLAN))
        assert officer_page.locator('[data-note="llm-steps"]').count() == 0
        officer_page.click("[data-approve]")
        officer_page.wait_for_selector('.gate-page[data-status="approved"]')

        wait_until(
            "the write-up's work item",
            lambda: WorkItem.objects.filter(case=case, status=WorkItem.Status.OPEN).exists(),
            workers=(worker,),
        )
        item = WorkItem.objects.get(case=case)
        context, writer, writer_problems = _decider(browser, live_server, second.username)
        contexts.append(context)
        writer.goto(reverse("execution:work-item", args=[item.pk]))
        writer.fill("#output", "Two card payments of 60 to a known merchant; nothing unusual.")
        writer.click('[data-action="complete"]')
        wait_until(
            "the case to end",
            lambda: (
                leaf(case, "summarise-findings").status == NodeStatus.SUCCEEDED
                and Case.objects.get(pk=case.pk).status == CaseStatus.COMPLETED
            ),
            workers=(worker,),
        )
        page.wait_for_selector('#case-live[data-status="completed"]', timeout=SHOWN_WITHIN_MS)
        assert "The goal is reached" in page.locator("#case-result").inner_text()
    finally:
        worker.stop()
        for context in contexts:
            context.close()
    # Nothing of it was the LLM agent's to do: its trust did not move.
    assert _fraud_analyst_trust() == pytest.approx(trust_before)
    assert problems == [] and officer_problems == [] and writer_problems == []
