"""The analyst watches the INV-1042 case run on its page in a real browser, on a real worker.

The plan is approved; the page, without a reload, shows the steps turn running and succeeded
with their attempts, waits at the payment hold's signed step gate, and once the hold is signed
and placed shows the Result: the goal verified, the audit report's findings and its
recommendation. Screenshots land under the var dir (execution-shots/).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings as django_settings

from accounts import roles
from oversight.actions.gates import DecisionInput, decide_gate
from oversight.models import Gate, GateKind, GateStatus
from planning.models import CaseStatus, NodeStatus
from tests import personas
from tests.browser.test_case_flow import _log_in, _watch_console
from tests.cases import planned_invoice_case
from tests.integration.execution import Harness, approve_plan, leaf, wait_until
from tests.personas import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]

# The page polls every 2 s; a step seen in the database shows within a few polls.
SHOWN_WITHIN_MS = 30_000


def test_the_analyst_watches_the_invoice_case_run_and_reads_its_result(
    page: Any, transactional_db: None, settings: Any, tmp_path: Any, analyst: Any, officer: Any
) -> None:
    shots = django_settings.VAR_DIR / "execution-shots"
    shots.mkdir(parents=True, exist_ok=True)
    harness = Harness(settings, tmp_path / "effects")
    problems = _watch_console(page)
    page.set_viewport_size({"width": 1300, "height": 1100})
    case = planned_invoice_case(analyst)
    _log_in(page, analyst.username)
    page.goto(f"/cases/{case.pk}/")
    page.wait_for_selector('[data-note="stops-here"]')
    worker = harness.worker()
    try:
        approve_plan(case, officer)
        # The page refreshes itself from "Awaiting approval" on until the case ends (no reload).
        page.wait_for_selector('#case-live[data-status="executing"]', timeout=SHOWN_WITHIN_MS)
        wait_until(
            "the audit report",
            lambda: leaf(case, "audit-report").status == NodeStatus.SUCCEEDED,
            workers=(worker,),
        )
        page.wait_for_selector(
            'tr[data-key="audit-report"][data-status="succeeded"]', timeout=SHOWN_WITHIN_MS
        )
        hold = page.locator('tr[data-key="place-hold"]')
        assert hold.get_attribute("data-status") == NodeStatus.AWAITING_APPROVAL
        report_row = page.locator('tr[data-key="audit-report"]').inner_text()
        assert "attempt 1" in report_row
        assert page.locator('.legend li[data-status="succeeded"]').count() == 1
        page.screenshot(path=str(shots / "running.png"), full_page=True)

        step = Gate.objects.get(case=case, kind=GateKind.STEP, status=GateStatus.PENDING)
        decide_gate(
            gate_id=step.pk,
            user=officer,
            decision=DecisionInput(decision="approve", password=PASSWORD),
        )
        wait_until(
            "the case to end",
            lambda: leaf(case, "place-hold").status == NodeStatus.SUCCEEDED,
            workers=(worker,),
        )
        page.wait_for_selector("#case-result", timeout=SHOWN_WITHIN_MS)
    finally:
        worker.stop()
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    page.wait_for_selector('#case-live[data-status="completed"]')
    result = page.locator("#case-result").inner_text()
    reached = "The goal is reached — and the steps reported 2 findings: see the outputs below."
    assert reached in result
    report = page.locator('#case-result [data-output="audit-report"]').inner_text()
    assert "duplicate payment" in report
    assert "recommendation" in report and "hold" in report
    assert page.locator('#case-result [data-output="place-hold"]').count() == 1
    assert page.locator("#case-live[hx-trigger]").count() == 0  # ended: it stops polling
    page.locator("#case-result").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "completed.png"), full_page=True)
    assert problems == []


def _decider(browser: Any, live_server: Any, username: str) -> tuple[Any, Any, list[str]]:
    context = browser.new_context(base_url=live_server.url)
    page = context.new_page()
    page.set_viewport_size({"width": 1300, "height": 1000})
    problems = _watch_console(page)
    _log_in(page, username)
    return context, page, problems


def _open_gate(page: Any, gate: Gate) -> None:
    page.goto(f"/gates/{gate.pk}/")
    page.wait_for_selector(f'.gate-page[data-gate="{gate.pk}"]')
    page.click("#step-detail summary")
    page.wait_for_selector("[data-approve]:not([disabled])")


@pytest.mark.scenario("S6")
def test_a_rejected_hold_approved_by_the_supervisor_with_a_signature_completes_live(
    page: Any,
    browser: Any,
    live_server: Any,
    transactional_db: None,
    settings: Any,
    tmp_path: Any,
    analyst: Any,
    officer: Any,
) -> None:
    """The walk a new user took (#21): the officer rejects the INV-1042 payment hold, the
    supervisor approves its escalation with a signature, and the case completes — the analyst's
    page, opened while the plan awaited approval, following every step without a reload."""
    shots = django_settings.VAR_DIR / "execution-shots"
    shots.mkdir(parents=True, exist_ok=True)
    harness = Harness(settings, tmp_path / "effects")
    supervisor = personas.make_user("sam", roles.SUPERVISOR)
    problems = _watch_console(page)
    page.set_viewport_size({"width": 1300, "height": 1100})
    case = planned_invoice_case(analyst)
    _log_in(page, analyst.username)
    page.goto(f"/cases/{case.pk}/")
    page.wait_for_selector('#case-live[data-status="awaiting_approval"]')
    worker = harness.worker()
    contexts: list[Any] = []
    try:
        context, officer_page, officer_problems = _decider(browser, live_server, officer.username)
        contexts.append(context)
        _open_gate(officer_page, Gate.objects.get(case=case, kind=GateKind.PLAN))
        officer_page.click("[data-approve]")
        officer_page.wait_for_selector('.gate-page[data-status="approved"]')
        page.wait_for_selector('#case-live[data-status="executing"]', timeout=SHOWN_WITHIN_MS)

        wait_until(
            "the payment hold's gate",
            lambda: (
                leaf(case, "place-hold").status == NodeStatus.AWAITING_APPROVAL
                and leaf(case, "audit-report").status == NodeStatus.SUCCEEDED
            ),
            workers=(worker,),
        )
        hold = Gate.objects.get(case=case, kind=GateKind.STEP, node__key="place-hold")
        officer_page.goto(f"/gates/{hold.pk}/")
        officer_page.wait_for_selector(f'.gate-page[data-gate="{hold.pk}"]')
        officer_page.select_option("select[name=reason_code]", "incorrect")
        officer_page.fill("#id_reject_reason", "The supplier's bank details changed last week")
        officer_page.click("[data-reject]")
        officer_page.wait_for_selector('.gate-page[data-status="rejected"]')

        escalation = Gate.objects.get(case=case, kind=GateKind.ESCALATION, node__key="place-hold")
        context, supervisor_page, supervisor_problems = _decider(
            browser, live_server, supervisor.username
        )
        contexts.append(context)
        _open_gate(supervisor_page, escalation)
        assert supervisor_page.inner_text("h1") == "Escalation: place-hold"
        assert supervisor_page.inner_text("[data-approve]") == "Sign and approve"
        supervisor_page.fill("#id_password", PASSWORD)
        supervisor_page.screenshot(path=str(shots / "escalation-sign.png"), full_page=True)
        supervisor_page.click("[data-approve]")
        supervisor_page.wait_for_selector('.gate-page[data-status="approved"]')

        wait_until(
            "the case to end",
            lambda: leaf(case, "place-hold").status == NodeStatus.SUCCEEDED,
            workers=(worker,),
        )
        page.wait_for_selector('#case-live[data-status="completed"]', timeout=SHOWN_WITHIN_MS)
    finally:
        worker.stop()
        for context in contexts:
            context.close()
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert page.locator('#case-result [data-output="place-hold"]').count() == 1
    page.screenshot(path=str(shots / "escalated-completed.png"), full_page=True)
    assert problems == officer_problems == supervisor_problems == []
