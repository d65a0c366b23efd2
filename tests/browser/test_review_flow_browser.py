"""Two officers review an analyst's invoice case in a real browser (issue #8).

Officer one finds the plan gate in the review inbox, follows it to the plan's versions, edits a
step with a reason code (among the agents the tool allows; inputs the tool refuses first) and
reads the diff; the version they made no longer waits for them. Officer two finds the new
version's plan gate, opens its detail (the approve button waits for it, R9), approves, then
signs the payment hold: a wrong password is refused, the right one signs, and the gate page
shows who signed, when, what it means and the hash. No dialog, console error, failed request or
CSP violation on the way, except the two refusals the test provokes.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.utils import dateformat, timezone

from oversight.models import Gate, GateDecision, GateKind, GateStatus
from planning.catalogue import sync_packs
from planning.models import Agent, Case, CaseStatus, PlanNode
from tests import personas
from tests.browser.test_case_flow import _log_in, _watch_console
from tests.cases import planned_invoice_case

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = Path("/tmp/review-shots")
# Reports every CSP violation of every page of the context to the test (see _watch).
CSP_LISTENER = """
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolation(`${e.violatedDirective} blocked ${e.blockedURI} in ${e.sourceFile}`);
});
"""


def _invoice_case(analyst: Any) -> Case:
    return planned_invoice_case(analyst, goal="Verify invoice INV-1042 before it is paid")


def _named(user: Any, first: str, last: str) -> Any:
    user.first_name, user.last_name = first, last
    user.save()
    return user


def _watch(page: Any) -> list[str]:
    """Collect the page's dialogs, console errors, failed requests and CSP violations.

    The CSP listener is proven to report before the list is handed back: an inline script,
    which the policy forbids, must come back as a violation.
    """
    problems = _watch_console(page)
    page.context.expose_function("__cspViolation", lambda text: problems.append(f"csp: {text}"))
    page.context.add_init_script(CSP_LISTENER)
    page.goto("/login/")
    page.evaluate(
        "() => { const s = document.createElement('script');"
        " s.textContent = 'window.__inline = 1'; document.head.appendChild(s); }"
    )
    for _ in range(50):
        if any(p.startswith("csp: script-src") for p in problems):
            break
        page.wait_for_timeout(100)
    assert any(p.startswith("csp: script-src") for p in problems), problems
    assert page.evaluate("window.__inline") is None  # the policy really blocked it
    problems.clear()  # the probe's own violation and console error
    return problems


def _shot(page: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, SHOTS / name)


def _inbox_gates(page: Any) -> list[int]:
    page.goto("/inbox/")
    page.wait_for_selector("#inbox-table")
    rows = page.eval_on_selector_all(
        "#inbox-table tr[data-gate]", "els => els.map(e => e.dataset.gate)"
    )
    return [int(pk) for pk in rows]


def _open_detail_and_check_the_button(page: Any) -> None:
    assert page.is_disabled("[data-approve]")
    assert page.is_visible("[data-approve-hint]")
    page.click("#step-detail summary")
    page.wait_for_selector("[data-approve]:not([disabled])")
    assert page.input_value("[data-detail-flag]") == "1"
    assert not page.is_visible("[data-approve-hint]")


def test_two_officers_edit_review_approve_and_sign_an_invoice_case(
    page: Any, browser: Any, live_server: Any, tmp_path: Path
) -> None:
    sync_packs()
    # A second agent allowed to run check_totals: the pack's own agents each hold their tools
    # alone, so no step of the invoice plan can move to another of them (shown below).
    Agent.objects.create(
        slug="second-auditor",
        name="Second auditor",
        kind=Agent.Kind.TOOL,
        tools=["check_totals"],
        trust=0.9,
    )
    one = _named(personas.officer(), "Olivia", "Ortega")
    two = _named(personas.second_officer(), "Oscar", "Osei")
    case = _invoice_case(personas.analyst())
    v1 = case.current_version
    assert v1 is not None and v1.number == 1
    v1_plan = Gate.objects.get(case=case, version=v1, kind=GateKind.PLAN)
    v1_hold = Gate.objects.get(case=case, version=v1, kind=GateKind.STEP, node__key="place-hold")
    totals = PlanNode.objects.get(version=v1, key="check-totals")

    problems = _watch(page)
    page.set_viewport_size({"width": 1500, "height": 1000})

    # Officer one: the inbox offers both gates of v1, its count in the navigation.
    _log_in(page, one.username)
    assert page.inner_text('[data-nav="inbox"] [data-count="inbox"]') == "2"
    page.click('[data-nav="inbox"]')
    page.wait_for_selector(f'#inbox-table tr[data-gate="{v1_plan.pk}"]')
    inbox = page.inner_text("#inbox-table")
    assert "Plan v1" in inbox and "Step place-hold" in inbox and "e-signature" in inbox
    assert sorted(_inbox_gates(page)) == sorted([v1_plan.pk, v1_hold.pk])

    # The plan gate leads to the plan's versions, where a step is chosen for editing.
    page.click(f'#inbox-table tr[data-gate="{v1_plan.pk}"] a[data-link="gate"]')
    page.wait_for_selector(f'.gate-page[data-gate="{v1_plan.pk}"]')
    assert "Plan gate: plan v1" in page.inner_text("h1")
    page.click('[data-section="decide"] a[data-action="edit"]')
    page.wait_for_selector(f'.versions-page[data-case="{case.pk}"]')
    assert "planned (static)" in page.inner_text('tr[data-version="1"]')
    page.click('.steps-table tr[data-step="check-totals"] a:text-is("Edit")')
    page.wait_for_url(f"**/cases/{case.pk}/nodes/{totals.pk}/edit/")
    page.wait_for_selector('.edit-page[data-node="check-totals"][data-version="1"]')
    assert page.input_value("select[name=agent]") == "payments-auditor"

    # Only the agents allowed the step's tool are offered.
    offered = page.eval_on_selector_all("select[name=agent] option", "els => els.map(e => e.value)")
    assert offered == ["payments-auditor", "second-auditor"]
    # Inputs the tool refuses are refused, in a sentence, and nothing changes.
    inputs = page.input_value("textarea[name=inputs]")
    page.select_option("select[name=agent]", "second-auditor")
    page.fill("textarea[name=inputs]", '{"invoice": 7}')
    page.select_option("select[name=reason_code]", "wrong-agent")
    page.fill("textarea[name=reason]", "The second auditor recomputes totals independently")
    page.click("#plan-edit-form button[type=submit]")
    page.wait_for_selector('[data-field="inputs"] .errorlist')
    refusal = page.inner_text('[data-field="inputs"] .errorlist')
    assert refusal.startswith("Step check-totals: the inputs do not fit tool check_totals"), refusal
    assert case.versions.count() == 1
    assert page.input_value("select[name=reason_code]") == "wrong-agent"  # kept for the retry
    _shot(page, tmp_path, "review-edit-refused.png")

    # The step's own inputs with an agent allowed check_totals: v2, and the diff shows the change.
    page.fill("textarea[name=inputs]", inputs)
    page.click("#plan-edit-form button[type=submit]")
    page.wait_for_url(f"**/cases/{case.pk}/versions/diff/?from=1&to=2")
    page.wait_for_selector('.diff-page[data-from="1"][data-to="2"]')
    note = page.inner_text("[data-edit]")
    assert "v2 is an edit of step check-totals by olivia" in note, note
    assert "wrong-agent" in note and "recomputes totals independently" in note, note
    changed = page.inner_text('[data-section="changed"] [data-node="check-totals"]')
    assert "Recompute the total from the line items · second-auditor · check_totals" in changed
    agent_row = page.locator('[data-node="check-totals"] tr[data-field="agent"] td')
    assert agent_row.all_inner_texts() == ["payments-auditor", "second-auditor"]
    assert page.locator('[data-section="changed"] .diff-node').count() == 1
    assert page.locator('[data-section="added"], [data-section="removed"]').count() == 0
    before = page.locator('[data-field="agent"] td:nth-of-type(1) pre.json')
    assert before.evaluate("e => getComputedStyle(e).marginTop") == "0px"  # versions.css loaded
    _shot(page, tmp_path, "review-diff.png")

    case.refresh_from_db()
    v2 = case.current_version
    assert v2 is not None and v2.number == 2 and v2.edited_by_id == one.pk
    v2_plan = Gate.objects.get(case=case, version=v2, kind=GateKind.PLAN, status=GateStatus.PENDING)
    v2_hold = Gate.objects.get(
        case=case, version=v2, kind=GateKind.STEP, node__key="place-hold", status=GateStatus.PENDING
    )
    assert set(Gate.objects.filter(version=v1).values_list("status", flat=True)) == {
        GateStatus.VOID
    }

    # The editor's inbox no longer offers anything of this case: v1 is void, v2 is theirs.
    assert _inbox_gates(page) == []
    assert "No gate waits for your decision" in page.inner_text('[data-empty="inbox"]')
    assert page.locator('[data-nav="inbox"] [data-count="inbox"]').count() == 0
    page.goto(f"/gates/{v2_plan.pk}/")
    page.wait_for_selector(f'.gate-page[data-gate="{v2_plan.pk}"]')
    assert page.locator("[data-approve]").count() == 0
    assert "but not yours" in page.inner_text('[data-section="read-only"]')

    # Officer two, in a browser of their own.
    context_two = browser.new_context(base_url=live_server.url)
    try:
        page_two = context_two.new_page()
        page_two.set_viewport_size({"width": 1500, "height": 1000})
        problems_two = _watch(page_two)
        _log_in(page_two, two.username)
        assert page_two.inner_text('[data-nav="inbox"] [data-count="inbox"]') == "2"
        assert sorted(_inbox_gates(page_two)) == sorted([v2_plan.pk, v2_hold.pk])
        page_two.click(f'#inbox-table tr[data-gate="{v2_plan.pk}"] a[data-link="gate"]')
        page_two.wait_for_selector(f'.gate-page[data-gate="{v2_plan.pk}"]')
        assert "Plan gate: plan v2" in page_two.inner_text("h1")
        page_two.wait_for_selector("#dag svg g.node", timeout=30_000)
        effects = page_two.inner_text('[data-section="plan-effects"]')
        assert "place_payment_hold on INV-1042 — financial" in effects, effects
        _open_detail_and_check_the_button(page_two)
        steps = page_two.inner_text('#step-detail tr[data-step="check-totals"]')
        assert "second-auditor" in steps, steps  # the detail shows the edited plan
        _shot(page_two, tmp_path, "review-plan-gate.png")
        page_two.click("[data-approve]")
        page_two.wait_for_selector('.gate-page[data-status="approved"]')
        assert "Your approval is recorded; the gate is approved" in page_two.inner_text(".messages")
        assert "Oscar Osei" in page_two.inner_text('[data-section="decisions"]')
        case.refresh_from_db()
        assert case.status == CaseStatus.EXECUTING  # approved, and its first steps are ready

        # The payment hold: approving it is a signature.
        page_two.goto(f"/gates/{v2_hold.pk}/")
        page_two.wait_for_selector(f'.gate-page[data-gate="{v2_hold.pk}"]')
        assert "Step gate: place-hold" in page_two.inner_text("h1")
        meaning = (
            f"approval of step place-hold (place_payment_hold) in plan version 2 of case #{case.pk}"
        )
        assert meaning in page_two.inner_text(".signature-note")
        assert page_two.inner_text("[data-approve]") == "Sign and approve"
        _open_detail_and_check_the_button(page_two)
        page_two.fill("#id_password", "not-my-password")
        page_two.click("[data-approve]")
        page_two.wait_for_selector("#password-error")
        assert "wrong password: the approval was not signed" in page_two.inner_text(
            "#password-error"
        )
        assert page_two.get_attribute("#id_password", "aria-invalid") == "true"
        assert "No decision yet" in page_two.inner_text('[data-section="decisions"]')
        assert not GateDecision.objects.filter(gate=v2_hold).exists()

        # The refused page keeps the gate's URL, the step detail open and Sign enabled.
        assert page_two.url.endswith(f"/gates/{v2_hold.pk}/"), page_two.url
        assert page_two.is_enabled("[data-approve]")
        assert page_two.input_value("[data-detail-flag]") == "1"
        page_two.fill("#id_password", personas.PASSWORD)
        page_two.click("[data-approve]")
        page_two.wait_for_selector('.gate-page[data-status="approved"]')
        decision = GateDecision.objects.get(gate=v2_hold)
        assert decision.decider_id == two.pk and decision.signature_hash
        signature = page_two.inner_text("[data-signature]")
        assert "Signed by\nOscar Osei" in signature, signature
        shown_at = dateformat.format(timezone.localtime(decision.time), "Y-m-d H:i:s e")
        assert f"Signed at\n{shown_at}" in signature, signature
        assert f"Meaning\n{meaning}" in signature, signature
        assert re.fullmatch(r"[0-9a-f]{64}", decision.signature_hash)
        assert f"Hash\n{decision.signature_hash}" in signature, signature
        _shot(page_two, tmp_path, "review-signed-step-gate.png")
    finally:
        context_two.close()

    edit_url = f"{live_server.url}/cases/{case.pk}/nodes/{totals.pk}/edit/"
    decide_url = f"{live_server.url}/gates/{v2_hold.pk}/decide"
    assert [p for p in problems if p != f"422 {edit_url}"] == []
    assert problems.count(f"422 {edit_url}") == 1
    assert [p for p in problems_two if p != f"403 {decide_url}"] == []
    assert problems_two.count(f"403 {decide_url}") == 1
