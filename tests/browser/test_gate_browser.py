"""The officer's review in a real browser: the inbox, the plan gate's page with its graph, the
approve button that waits for the opened detail (R9), the approval; the signature step's page
with its step highlighted in the graph; the case page's gates panel loaded by htmx."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oversight.models import Gate, GateDecision, GateKind
from planning.catalogue import sync_packs
from planning.models import Case, CaseStatus
from tests import personas
from tests.browser.test_case_flow import _log_in, _watch_console
from tests.cases import planned_invoice_case
from tests.execution.test_execution import approve as approve_gate
from tests.execution.test_execution import run_ready
from tests.planning.factories import make_case

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENS = Path(__file__).resolve().parents[2] / "var" / "screens"


def _invoice_case(analyst: Any) -> Case:
    return planned_invoice_case(analyst, goal="Verify invoice INV-1042 before it is paid")


def test_officer_reviews_and_approves_a_plan_gate_from_the_inbox(page: Any, tmp_path: Path) -> None:
    sync_packs()
    officer = personas.officer()
    officer.first_name, officer.last_name = "Olivia", "Ortega"
    officer.save()
    case = _invoice_case(personas.analyst())  # the officer's group is notified
    plan_gate = Gate.objects.get(case=case, kind=GateKind.PLAN)
    hold_gate = Gate.objects.get(case=case, kind=GateKind.STEP, node__key="place-hold")
    problems = _watch_console(page)
    page.set_viewport_size({"width": 1500, "height": 1000})
    _log_in(page, officer.username)

    assert page.inner_text('[data-nav="inbox"] [data-count="inbox"]') == "2"
    page.click('[data-nav="inbox"]')
    page.wait_for_selector(f'#inbox-table tr[data-gate="{plan_gate.pk}"]')
    page.screenshot(path=str(tmp_path / "inbox.png"), full_page=True)
    # A filter in the URL, applied by htmx without a reload.
    page.select_option("select[name=risk]", plan_gate.risk)
    page.wait_for_url(f"**/inbox/?*risk={plan_gate.risk}*")
    page.click(f'#inbox-table tr[data-gate="{plan_gate.pk}"] a[data-link="gate"]')

    page.wait_for_selector(f'.gate-page[data-gate="{plan_gate.pk}"]')
    page.wait_for_selector("#dag svg g.node", timeout=30_000)
    effects = page.inner_text('[data-section="plan-effects"]')
    assert "place_payment_hold on INV-1042 — financial" in effects
    assert page.is_disabled("[data-approve]")
    assert page.is_visible("[data-approve-hint]")
    page.click("#step-detail summary")
    page.wait_for_selector("[data-approve]:not([disabled])")
    assert page.input_value("[data-detail-flag]") == "1"
    page.screenshot(path=str(tmp_path / "gate.png"), full_page=True)
    page.click("[data-approve]")

    page.wait_for_selector('.gate-page[data-status="approved"]')
    assert "Your approval is recorded" in page.inner_text(".messages")
    assert "Olivia Ortega" in page.inner_text('[data-section="decisions"]')
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING  # approved, and its first steps are ready
    assert GateDecision.objects.filter(gate=plan_gate, decider=officer).count() == 1
    page.screenshot(path=str(tmp_path / "approved.png"), full_page=True)

    # The signature step: its step is the one highlighted in the graph.
    page.goto(f"/gates/{hold_gate.pk}/")
    page.wait_for_selector("#dag svg g.node.highlight", timeout=30_000)
    highlighted = page.eval_on_selector_all(
        "#dag svg g.node.highlight text:first-of-type", "els => els.map(e => e.textContent)"
    )
    assert highlighted == ["place-hold"]
    assert page.is_visible("input[type=password]")
    page.screenshot(path=str(tmp_path / "signature-gate.png"), full_page=True)

    # The case page loads its gates panel with htmx.
    page.goto(f"/cases/{case.pk}/")
    page.wait_for_selector('#case-gates[data-loaded="true"]')
    assert page.locator(f'#case-gates [data-gate="{hold_gate.pk}"]').count() == 1
    page.screenshot(path=str(tmp_path / "case-gates.png"), full_page=True)

    # Home counts what waits; the notice of the opened gates is read and marked read.
    page.goto("/")
    assert page.inner_text('[data-count="pending"]') == "1"
    page.screenshot(path=str(tmp_path / "home.png"), full_page=True)
    assert page.inner_text('[data-nav="notifications"] [data-count="notifications"]') == "1"
    page.click('[data-nav="notifications"]')
    page.wait_for_selector('.notification[data-read="false"]')
    assert f"Case #{case.pk}" in page.inner_text(".notification-list")
    page.screenshot(path=str(tmp_path / "notifications.png"), full_page=True)
    page.click('[data-action="read-all"]')
    page.wait_for_selector('.notification[data-read="true"]')
    assert page.locator('[data-count="notifications"]').count() == 0
    assert problems == []


def test_the_gate_of_an_edited_version_shows_what_changed_and_opens_the_diff(page: Any) -> None:
    from oversight.actions.edits import edit_plan

    sync_packs()
    case = _invoice_case(personas.analyst())
    edit_plan(
        case_id=case.pk,
        user=personas.officer(),
        node_key="check-totals",
        changes={"task": "Compare the totals with the purchase order, line by line"},
        reason_code="wrong-agent",
        reason="the totals need a line by line look",
    )
    gate = Gate.objects.get(case=case, version__number=2, kind=GateKind.PLAN)
    page.set_viewport_size({"width": 1280, "height": 900})
    _log_in(page, personas.second_officer().username)
    page.goto(f"/gates/{gate.pk}/")
    changes = page.inner_text('[data-section="version-changes"]')
    assert "What changed from v1" in changes and "check-totals: task" in changes, changes
    page.locator('[data-section="version-changes"]').screenshot(
        path=str(SCREENS / "gate-changes.png")
    )
    page.click('[data-section="version-changes"] a')
    page.wait_for_selector('.diff-page[data-from="1"][data-to="2"] [data-node="check-totals"]')


def test_a_wrong_signing_password_keeps_the_gates_url_the_detail_open_and_sign_enabled(
    page: Any,
) -> None:
    sync_packs()
    case = _invoice_case(personas.analyst())
    hold_gate = Gate.objects.get(case=case, kind=GateKind.STEP, node__key="place-hold")
    assert hold_gate.needs_signature
    officer = personas.officer()
    page.set_viewport_size({"width": 1280, "height": 900})
    _log_in(page, officer.username)
    page.goto(f"/gates/{hold_gate.pk}/")
    page.click("#step-detail summary")
    page.wait_for_selector("[data-approve]:not([disabled])")
    page.fill("#id_password", "not my password")
    page.fill("#id_approve_reason", "checked the hold")
    page.click("[data-approve]")
    page.wait_for_selector("#password-error")
    assert page.url.endswith(f"/gates/{hold_gate.pk}/"), page.url
    assert page.get_attribute("#step-detail", "open") is not None
    assert page.is_enabled("[data-approve]")
    assert page.input_value("#id_approve_reason") == "checked the hold"
    page.screenshot(path=str(SCREENS / "gate-wrong-password.png"))
    page.fill("#id_password", personas.PASSWORD)
    page.click("[data-approve]")
    page.wait_for_selector('.gate-page[data-status="approved"]')
    assert GateDecision.objects.filter(gate=hold_gate, decider=officer).count() == 1


def test_the_payment_holds_gate_shows_the_audit_reports_recommendation_before_and_after_signing(
    page: Any,
) -> None:
    sync_packs()
    case = _invoice_case(personas.analyst())
    plan_gate = Gate.objects.get(case=case, kind=GateKind.PLAN)
    hold_gate = Gate.objects.get(case=case, kind=GateKind.STEP, node__key="place-hold")
    officer = personas.officer()
    problems = _watch_console(page)
    page.set_viewport_size({"width": 1400, "height": 1000})
    _log_in(page, officer.username)
    # Before the plan runs, the hold's gate says the report has not run yet.
    page.goto(f"/gates/{hold_gate.pk}/")
    page.click("#step-detail summary")
    report = '[data-upstream="audit-report"]'
    assert page.get_attribute(report, "data-ran") == "false"
    assert "not run yet" in page.inner_text(report)
    # The plan approved on its page, its steps run up to the hold, as a worker runs them.
    page.goto(f"/gates/{plan_gate.pk}/")
    page.click("#step-detail summary")
    page.wait_for_selector("[data-approve]:not([disabled])")
    page.click("[data-approve]")
    page.wait_for_selector('.gate-page[data-status="approved"]')
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING

    page.goto(f"/gates/{hold_gate.pk}/")
    page.wait_for_selector("#dag svg g.node", timeout=30_000)
    page.click("#step-detail summary")
    page.wait_for_selector("[data-approve]:not([disabled])")
    assert page.get_attribute(report, "data-ran") == "true"
    shown = page.inner_text(report)
    assert "recommendation" in shown and "hold" in shown and "duplicate payment" in shown
    assert "not run yet" not in shown
    assert "recommendation: hold" in page.inner_text(".signature-note")
    assert "recommendation: hold" in page.inner_text('[data-section="plan-effects"]')
    page.locator("#step-detail").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENS / "hold-gate-report.png"), full_page=True)
    page.fill("#id_password", personas.PASSWORD)
    page.click("[data-approve]")

    page.wait_for_selector('.gate-page[data-status="approved"]')
    signature = page.inner_text("[data-signature]")
    assert "acting on the output of audit-report" in signature
    assert "recommendation: hold" in signature
    page.click("#step-detail summary")
    assert page.get_attribute(report, "data-ran") == "true"
    assert "hold" in page.inner_text(report)
    page.screenshot(path=str(SCREENS / "hold-gate-signed.png"), full_page=True)
    assert GateDecision.objects.filter(gate=hold_gate, decider=officer).count() == 1
    assert problems == []


# Cards stacked in one column with less than this between them (in CSS pixels) touch.
CARD_GAP_PX = 8
_TOUCHING_CARDS = """(least) => {
  const cards = [...document.querySelectorAll('.card')]
    .filter(e => e.offsetParent !== null)
    .map(e => [e, e.getBoundingClientRect()]);
  const name = e => e.id || e.className;
  const touching = [];
  for (const [a, ra] of cards) for (const [b, rb] of cards) {
    if (a === b || a.contains(b) || b.contains(a)) continue;
    const side = Math.min(ra.right, rb.right) - Math.max(ra.left, rb.left) > 0;
    const gap = rb.top - ra.bottom;
    if (side && gap > -1 && gap < least) touching.push(`${name(a)} / ${name(b)}`);
  }
  return touching;
}"""


def test_cards_keep_space_between_them_and_a_failed_plan_shows_no_empty_step_panel(
    page: Any,
) -> None:
    sync_packs()
    analyst = personas.analyst()
    failed = make_case(analyst, status=CaseStatus.PLAN_FAILED, error="no method matched the goal")
    case = _invoice_case(analyst)
    approve_gate(Gate.objects.get(case=case, kind=GateKind.PLAN), personas.officer())
    run_ready(case)
    hold = Gate.objects.get(case=case, kind=GateKind.STEP, node__key="place-hold")
    approve_gate(hold, personas.second_officer(), password=personas.PASSWORD)
    run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    page.set_viewport_size({"width": 1400, "height": 1000})
    _log_in(page, analyst.username)

    page.goto(f"/cases/{failed.pk}/")
    page.wait_for_selector('[data-action="resubmit"]')
    assert page.locator("#node-panel").count() == 0
    page.screenshot(path=str(SCREENS / "case-plan-failed.png"), full_page=True)

    page.goto(f"/cases/{case.pk}/")
    page.wait_for_selector('#case-gates[data-loaded="true"]')
    page.wait_for_selector("#case-result")
    assert page.locator("#node-panel").count() == 1  # a plan with steps keeps it
    assert page.evaluate(_TOUCHING_CARDS, CARD_GAP_PX) == []
    page.screenshot(path=str(SCREENS / "case-completed.png"), full_page=True)
    page.goto(f"/gates/{hold.pk}/")
    page.wait_for_selector("[data-signature]")
    assert page.evaluate(_TOUCHING_CARDS, CARD_GAP_PX) == []


def test_an_officer_adds_a_step_in_the_browser_and_reads_why_a_first_try_was_refused(
    page: Any,
) -> None:
    sync_packs()
    case = _invoice_case(personas.analyst())
    hold = Gate.objects.get(case=case, kind=GateKind.STEP, node__key="place-hold")
    problems = _watch_console(page)
    page.set_viewport_size({"width": 1280, "height": 1000})
    _log_in(page, personas.officer().username)
    page.goto(f"/cases/{case.pk}/nodes/{hold.node_id}/edit/")
    # The agent list offers only the agents that can run the hold.
    offered = page.eval_on_selector_all("#id_agent option", "els => els.map(e => e.value)")
    assert offered == ["payments-clerk"]
    page.click('[data-action="add-step"]')
    page.wait_for_selector("#plan-add-form")
    page.fill("#id_key", "second-hold")
    page.select_option("#id_runner", "payments-clerk:place_payment_hold")
    page.fill("#id_task", "Place a second hold, for the second finding")
    page.fill("#id_inputs", "{}")
    page.select_option("#id_reason_code", "other")
    page.fill("#id_reason", "two findings, two holds")
    page.click("#plan-add-form button[type=submit]")
    error = page.inner_text('[data-field="inputs"] .errorlist')
    assert error == (
        "Step second-hold: the inputs do not fit tool place_payment_hold: “report” is missing."
    )
    page.screenshot(path=str(SCREENS / "plan-add-step-refused.png"), full_page=True)
    page.fill("#id_inputs", '{"report": {"$ref": "audit-report"}}')
    page.click("#plan-add-form button[type=submit]")
    page.wait_for_selector('.diff-page[data-from="1"][data-to="2"]')
    assert "second-hold" in page.inner_text(".diff-page")
    # The refused first try answered 422, as it should; nothing else went wrong.
    assert [p for p in problems if not p.startswith("422 ")] == [], problems
