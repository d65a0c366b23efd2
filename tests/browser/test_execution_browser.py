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

from oversight.actions.gates import DecisionInput, decide_gate
from oversight.models import Gate, GateKind, GateStatus
from planning.models import CaseStatus, NodeStatus
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
        # A plan waiting for approval is not live: the analyst opens the page again, and from
        # then on it refreshes itself until the case ends (no reload below).
        page.reload()
        page.wait_for_selector('#case-live[data-status="executing"]')
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
    assert "The goal is verified." in result
    report = page.locator('#case-result [data-output="audit-report"]').inner_text()
    assert "duplicate payment" in report
    assert "recommendation" in report and "hold" in report
    assert page.locator('#case-result [data-output="place-hold"]').count() == 1
    assert page.locator("#case-live[hx-trigger]").count() == 0  # ended: it stops polling
    page.locator("#case-result").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "completed.png"), full_page=True)
    assert problems == []
