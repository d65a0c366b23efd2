"""An admin asks what a pending, looser policy version would have done, in a real browser, on a
real worker: the report page shows its progress until the worker has replayed the plans, then
the totals and the changed cases, linked; axe-core finds nothing on it, at 390 px either.
Screenshots land under the var dir's screens/ (whatif-*)."""

from __future__ import annotations

from typing import Any

import pytest

from oversight.actions.policies import propose_policy
from oversight.models import PolicyWhatIf
from planning.catalogue import sync_packs
from tests import personas
from tests.browser.a11y import PHONE, assert_accessible, assert_fits_phone, shot
from tests.browser.test_case_flow import _log_in, _watch_console
from tests.cases import planned_invoice_case

pytestmark = [pytest.mark.browser, pytest.mark.integration]

# Financial steps (the payment hold) no longer gated or signed: a loosening.
LOOSER = {
    "gated_risks": ["write", "external", "destructive"],
    "signature_risks": ["external", "destructive"],
}
DONE_WITHIN_MS = 60_000


@pytest.mark.django_db(transaction=True)
def test_an_admin_runs_the_what_if_of_a_pending_proposal_and_reads_its_report(page: Any) -> None:
    sync_packs()
    case = planned_invoice_case(personas.analyst())
    version = propose_policy(personas.admin("alice"), LOOSER, "threshold-review", "fewer gates")
    admin = personas.admin()
    problems = _watch_console(page)
    page.set_viewport_size({"width": 1300, "height": 900})
    _log_in(page, admin.username)

    # The pending version's page: no what-if yet, and the button that runs one.
    page.goto(f"/admin/oversight/policyversion/{version.pk}/change/")
    page.wait_for_selector('[data-whatif-status="none"]')
    assert page.get_by_role("heading", name="What would this policy have done?").is_visible()
    page.click('[data-action="run-whatif"]')

    # No worker runs yet: the report waits, queued, and says so.
    page.wait_for_selector('#whatif-report[data-status="queued"]')
    report = PolicyWhatIf.objects.get(policy_version=version)
    assert page.url.endswith(f"/policy/what-if/{report.pk}/")
    assert page.get_by_label("Plan versions replayed").count() == 1
    assert "Queued: waiting for a worker." in page.inner_text("[data-progress]")
    shot(page, "whatif-queued")

    # A worker takes the queued task; the page follows it to the end without a reload.
    from tests.conftest import running_worker  # the fixtures' module, as test_case_flow does

    worker = running_worker({"OPENAI_BASE_URL": "", "OPENAI_API_KEY": ""}, purge=False)
    try:
        page.wait_for_selector('#whatif-report[data-status="done"]', timeout=DONE_WITHIN_MS)
    finally:
        worker.stop()
    assert page.url.endswith(f"/policy/what-if/{report.pk}/")
    assert "Done: 1 plan version replayed" in page.inner_text("[data-progress]")
    assert page.locator("progress#whatif-progress").get_attribute("value") == "1"
    ungated = page.locator('.whatif-totals tr[data-change="ungated"] [data-count]')
    assert ungated.inner_text() == "1"
    row = page.locator(f'#whatif-cases tr[data-case="{case.pk}"]')
    assert (
        row.locator('[data-step="place-hold"]')
        .inner_text()
        .startswith("place-hold: gate with e-signature → no gate")
    )
    link = row.locator("[data-case-link]")
    assert link.get_attribute("href") == f"/cases/{case.pk}/quality/"
    shot(page, "whatif-report")
    assert_accessible(page, "what-if report")
    page.set_viewport_size(PHONE)
    assert_fits_phone(page, "whatif-report")
    assert_accessible(page, "what-if report at 390 px")

    # The case link opens the case's figures (an admin reads no case itself).
    link.click()
    page.wait_for_selector('[data-page="case-quality"]')

    # The approving admin's page shows the finished report and links it.
    page.set_viewport_size({"width": 1300, "height": 900})
    page.goto(f"/admin/oversight/policyversion/{version.pk}/change/")
    page.wait_for_selector('[data-whatif-status="done"]')
    assert page.locator('#whatif tr[data-change="ungated"] [data-count]').inner_text() == "1"
    assert page.locator("[data-whatif-report]").get_attribute("href") == (
        f"/policy/what-if/{report.pk}/"
    )
    shot(page, "whatif-proposal")
    assert_accessible(page, "pending policy version with its what-if")
    page.set_viewport_size(PHONE)
    assert_fits_phone(page, "whatif-proposal")
    assert problems == []
