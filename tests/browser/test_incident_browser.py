"""An incident walked as a new user walks it, in a real browser on a real worker: the analyst
submits an outage of inventory-db (whose replica is down too) on the form, an officer approves
the plan and signs the fail-over and the notice on their gate pages, and the case page ends
"goal not reached" with the finding — not "reached" because every step ran. Screenshots land
under the var dir (incident-shots/)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings as django_settings

from oversight.models import Gate, GateKind
from planning.models import Case, CaseStatus, EstateNotice
from tests.browser.test_case_flow import _log_in, _watch_console
from tests.browser.test_execution_browser import SHOWN_WITHIN_MS, _decider, _open_gate
from tests.execution.test_pack_outcomes import NOT_RESTORED
from tests.personas import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow]


def _sign(page: Any, gate: Gate) -> None:
    _open_gate(page, gate)  # the approval waits until the step's detail was opened
    page.fill("#id_password", PASSWORD)
    page.click("[data-approve]")
    page.wait_for_selector('.gate-page[data-status="approved"]')


def test_an_outage_whose_fail_over_does_not_restore_the_service_ends_goal_not_reached(
    page: Any,
    browser: Any,
    live_server: Any,
    transactional_db: None,
    analyst: Any,
    officer: Any,
) -> None:
    from tests.conftest import running_worker

    shots = django_settings.VAR_DIR / "incident-shots"
    shots.mkdir(parents=True, exist_ok=True)
    problems = _watch_console(page)
    page.set_viewport_size({"width": 1300, "height": 1100})
    _log_in(page, analyst.username)
    page.goto("/cases/new/")
    page.wait_for_selector("#case-form")
    page.select_option("select[name=domain]", "incident")
    page.wait_for_selector("input[name=input_service]")
    page.fill("input[name=title]", "inventory-db is down")
    page.fill("input[name=goal]", "Bring inventory-db back and tell its owners")
    page.fill("input[name=input_kind]", "database-outage")
    page.fill("input[name=input_service]", "inventory-db")
    page.click("button.primary[type=submit]")
    page.wait_for_selector("#case-live[data-status]")
    case = Case.objects.get()
    assert (case.domain, case.inputs["service"]) == ("incident", "inventory-db")

    worker = running_worker({"OPENAI_BASE_URL": "", "OPENAI_API_KEY": ""}, purge=False)
    context = None
    try:
        page.wait_for_selector(
            '#case-live[data-status="awaiting_approval"]', timeout=SHOWN_WITHIN_MS
        )
        context, officer_page, officer_problems = _decider(browser, live_server, officer.username)
        plan = Gate.objects.get(case=case, kind=GateKind.PLAN)
        _open_gate(officer_page, plan)
        officer_page.click("[data-approve]")
        officer_page.wait_for_selector('.gate-page[data-status="approved"]')
        # The fail-over (destructive) and the notice (external) are signed, each on its page.
        for key in ("fail-over", "notify-stakeholders"):
            _sign(officer_page, Gate.objects.get(case=case, kind=GateKind.STEP, node__key=key))
        page.wait_for_selector('#case-live[data-status="failed"]', timeout=60_000)
    finally:
        worker.stop()
        if context is not None:
            context.close()
    case.refresh_from_db()
    assert case.status == CaseStatus.FAILED
    assert case.verification["reasons"] == [NOT_RESTORED]
    page.wait_for_selector("#case-result")
    result = page.locator("#case-result")
    assert result.get_attribute("data-passed") == "false"
    text = result.inner_text()
    assert "The goal is not reached." in text
    assert "The goal is reached" not in text
    assert NOT_RESTORED in page.locator("#case-result .verdict-reasons").inner_text()
    # What the stakeholders were told is what the estate shows.
    notice = page.locator('#case-result [data-output="notify-stakeholders"]').inner_text()
    assert "does not answer on its primary db-inventory-2" in notice
    assert EstateNotice.objects.get().message.endswith("it is still down")
    result.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "goal-not-reached.png"), full_page=True)
    assert problems == officer_problems == []
