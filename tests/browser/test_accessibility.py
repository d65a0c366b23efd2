"""Every page a reviewer, an auditor and an admin use, checked in a real browser: axe-core finds
no WCAG 2.2 AA violation, and at 390 px (a phone) no page scrolls sideways, the navigation
collapses behind a menu button and the forms fit. Screenshots land under the var dir's screens/."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from oversight.actions.policies import propose_policy
from oversight.actions.whatif import request_whatif, run_whatif
from oversight.models import Gate, GateKind
from planning.catalogue import sync_packs
from tests import personas
from tests.browser.a11y import PHONE, assert_fits_phone, axe_violations, describe, shot
from tests.browser.test_case_flow import _log_in, _watch_console
from tests.cases import planned_invoice_case
from tests.quality.test_quality import executed_case, reviewed_case

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


MISSING_CASE = "/cases/999999/"  # the 404 page, in the site's layout


@dataclass(frozen=True, slots=True, kw_only=True)
class Visit:
    """A page to check: who looks, where, and what shows it is fully drawn."""

    name: str
    user: str | None
    url: str
    ready: str


def _visits() -> list[Visit]:
    """Build the cases every page needs and return the pages to visit, grouped by user."""
    sync_packs()
    analyst, officer = personas.analyst(), personas.officer()
    second, auditor, admin = personas.second_officer(), personas.auditor(), personas.admin()
    done = executed_case(analyst, officer)
    edited = reviewed_case(analyst, officer, second)
    live = planned_invoice_case(analyst, goal="Verify invoice INV-1042 before it is paid")
    plan_gate = Gate.objects.get(case=live, kind=GateKind.PLAN)
    hold_gate = Gate.objects.get(case=live, kind=GateKind.STEP, node__key="place-hold")
    hold_node = hold_gate.node
    assert hold_node is not None
    # A pending, looser policy version and its finished what-if (the payment hold ungated).
    looser = {"gated_risks": ["write", "external", "destructive"], "signature_risks": []}
    pending = propose_policy(personas.admin("alice"), looser, "threshold-review", "fewer gates")
    whatif = run_whatif(request_whatif(admin, pending).pk)
    return [
        Visit(name="login", user=None, url="/login/", ready="#id_username"),
        Visit(name="home", user=officer.username, url="/", ready="[data-landing]"),
        Visit(name="inbox", user=officer.username, url="/inbox/", ready="#inbox-table"),
        Visit(
            name="plan-gate",
            user=officer.username,
            url=f"/gates/{plan_gate.pk}/",
            ready="#dag svg g.node",
        ),
        Visit(
            name="signature-gate",
            user=officer.username,
            url=f"/gates/{hold_gate.pk}/",
            ready="#dag svg g.node",
        ),
        Visit(
            name="case-live",
            user=officer.username,
            url=f"/cases/{live.pk}/",
            ready='#case-gates[data-loaded="true"]',
        ),
        Visit(
            name="case-done",
            user=officer.username,
            url=f"/cases/{done.pk}/",
            ready="#dag svg g.node",
        ),
        Visit(
            name="diff",
            user=officer.username,
            url=f"/cases/{edited.pk}/versions/diff/",
            ready="main h1",
        ),
        Visit(
            name="versions",
            user=officer.username,
            url=f"/cases/{edited.pk}/versions/",
            ready="main h1",
        ),
        Visit(
            name="step-page",
            user=officer.username,
            url=f"/cases/{live.pk}/nodes/{hold_node.pk}/",
            ready="main h1",
        ),
        Visit(
            name="plan-edit",
            user=officer.username,
            url=f"/cases/{live.pk}/nodes/{hold_node.pk}/edit/",
            ready="main h1",
        ),
        Visit(
            name="plan-add-step",
            user=officer.username,
            url=f"/cases/{live.pk}/nodes/{hold_node.pk}/add-after/",
            ready="#plan-add-form",
        ),
        Visit(name="notifications", user=officer.username, url="/notifications/", ready="main h1"),
        Visit(name="work-items", user=officer.username, url="/work-items/", ready="main h1"),
        Visit(name="not-found", user=officer.username, url=MISSING_CASE, ready="main h1"),
        Visit(name="cases", user=officer.username, url="/cases/", ready="main h1"),
        Visit(name="case-new", user=analyst.username, url="/cases/new/", ready="#case-form"),
        Visit(
            name="quality", user=officer.username, url="/quality/", ready='[data-page="quality"]'
        ),
        Visit(
            name="quality-plans",
            user=officer.username,
            url="/quality/plans/",
            ready='[data-page="plan-evaluation"]',
        ),
        Visit(
            name="case-quality",
            user=officer.username,
            url=f"/cases/{done.pk}/quality/",
            ready='[data-page="case-quality"]',
        ),
        Visit(
            name="trail",
            user=auditor.username,
            url=f"/audit/cases/{done.pk}/",
            ready="[data-integrity]",
        ),
        Visit(name="audit", user=auditor.username, url="/audit/", ready="main h1"),
        Visit(name="execution-control", user=admin.username, url="/execution/", ready="main h1"),
        Visit(name="lockouts", user=admin.username, url="/sign-in-lockouts/", ready="main h1"),
        Visit(name="methods", user=admin.username, url="/methods/", ready="main h1"),
        Visit(name="account", user=admin.username, url="/account/", ready="main h1"),
        Visit(
            name="policy-whatif",
            user=admin.username,
            url=f"/policy/versions/{pending.pk}/what-if/",
            ready="#whatif-form",
        ),
        Visit(
            name="whatif-report",
            user=admin.username,
            url=f"/policy/what-if/{whatif.pk}/",
            ready='#whatif-report[data-status="done"]',
        ),
        # The admin site's pages for CaseHub's own models and its password page.
        Visit(name="admin-index", user=admin.username, url="/admin/", ready="#content"),
        Visit(
            name="admin-policies",
            user=admin.username,
            url="/admin/oversight/policyversion/",
            ready="#content",
        ),
        Visit(
            name="admin-pending-policy",
            user=admin.username,
            url=f"/admin/oversight/policyversion/{pending.pk}/change/",
            ready='[data-whatif-status="done"]',
        ),
        Visit(
            name="admin-trust",
            user=admin.username,
            url="/admin/execution/trustscore/",
            ready="#content",
        ),
        Visit(
            name="admin-reason-codes",
            user=admin.username,
            url="/admin/oversight/reasoncode/",
            ready="#content",
        ),
        Visit(
            name="admin-user",
            user=admin.username,
            url=f"/admin/auth/user/{analyst.pk}/change/",
            ready="#content",
        ),
        Visit(
            name="admin-oidc-mappings",
            user=admin.username,
            url="/admin/accounts/oidcgroupmapping/",
            ready="#content",
        ),
        Visit(
            name="admin-oidc-mapping-requests",
            user=admin.username,
            url="/admin/accounts/oidcmappingrequest/",
            ready="#content",
        ),
        Visit(
            name="admin-oidc-mapping-add",
            user=admin.username,
            url="/admin/accounts/oidcgroupmapping/add/",
            ready="#content",
        ),
        Visit(
            name="admin-password",
            user=admin.username,
            url=f"/admin/auth/user/{analyst.pk}/password/",
            ready="#content",
        ),
    ]


def _walk(page: Any, visits: list[Visit], check: Any) -> list[str]:
    """Open every page as its user and collect what `check` reports about each."""
    failures: list[str] = []
    current: str | None = None
    for visit in visits:
        if visit.user != current:
            page.context.clear_cookies()
            if visit.user is not None:
                _log_in(page, visit.user)
            current = visit.user
        page.goto(visit.url)
        page.wait_for_selector(visit.ready, timeout=30_000)
        page.wait_for_load_state("networkidle")
        problem = check(page, visit)
        if problem:
            failures.append(f"{visit.name} ({visit.url}): {problem}")
    return failures


def _axe(page: Any, visit: Visit) -> str:
    shot(page, f"axe-{visit.name}")
    violations = axe_violations(page)
    return "\n" + describe(violations) if violations else ""


def test_every_page_passes_axe_core_at_wcag_22_aa(page: Any) -> None:
    visits = _visits()
    problems = _watch_console(page)
    page.set_viewport_size({"width": 1300, "height": 900})
    failures = _walk(page, visits, _axe)
    assert not failures, "\n".join(failures)
    assert [p for p in problems if not p.endswith(MISSING_CASE)] == []


def _phone(page: Any, visit: Visit) -> str:
    """Report sideways scrolling, controls cut off at the right edge and axe violations."""
    problems: list[str] = []
    try:
        assert_fits_phone(page, visit.name)
    except AssertionError as error:
        problems.append(str(error))
    cut = page.evaluate(CUT_CONTROLS)
    if cut:
        problems.append(f"controls cut off at an edge: {cut}")
    violations = axe_violations(page)
    if violations:
        problems.append("\n" + describe(violations))
    return "; ".join(problems)


# Visible form controls and buttons cut off at either edge, except those inside a box that
# scrolls sideways (a wide table's). Their size is axe-core's target-size rule (WCAG 2.5.8).
CUT_CONTROLS = """
() => {
  const limit = document.documentElement.clientWidth;
  const out = [];
  const controls = "input:not([type=hidden]), select, textarea, button";
  for (const el of document.querySelectorAll(controls)) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || el.closest("[hidden]")) continue;
    if (el.closest(".table-scroll, .table-box, .dag")) continue;
    if (box.left < 0 || box.right > limit + 0.5) {
      const name = `${el.tagName.toLowerCase()}[name=${el.name || ""}]`;
      out.push(`${name} ${Math.round(box.left)}..${Math.round(box.right)}`);
    }
  }
  return out;
}
"""


def test_every_page_fits_a_phone_and_passes_axe_core_there(page: Any) -> None:
    visits = _visits()
    problems = _watch_console(page)
    page.set_viewport_size(PHONE)
    failures = _walk(page, visits, _phone)
    assert not failures, "\n".join(failures)
    assert [p for p in problems if not p.endswith(MISSING_CASE)] == []


def test_the_menu_folds_on_a_phone_and_opens_from_the_keyboard(page: Any) -> None:
    officer = personas.officer()
    problems = _watch_console(page)
    page.set_viewport_size(PHONE)
    _log_in(page, officer.username)
    toggle = page.locator("[data-menu-toggle]")
    assert toggle.is_visible()
    assert toggle.get_attribute("aria-expanded") == "false"
    assert page.get_by_role("button", name="Menu", exact=True).count() == 1  # no icon in its name
    assert not page.is_visible('nav[aria-label="Main"]')
    shot(page, "phone-menu-closed")

    # The skip link comes first, then the brand, then the menu button.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip-link"
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.hasAttribute('data-menu-toggle')")
    page.keyboard.press("Enter")
    assert toggle.get_attribute("aria-expanded") == "true"
    assert page.is_visible('[data-nav="inbox"]')
    shot(page, "phone-menu-open")
    assert_fits_phone(page, "menu-open")
    page.keyboard.press("Escape")
    assert toggle.get_attribute("aria-expanded") == "false"
    assert page.evaluate("document.activeElement.hasAttribute('data-menu-toggle')")
    page.keyboard.press("Space")
    assert toggle.get_attribute("aria-expanded") == "true"
    page.keyboard.press("Tab")  # the first item of the menu
    assert page.evaluate("document.activeElement.dataset.nav") == "home"
    while page.evaluate("document.activeElement.dataset.nav") != "inbox":
        page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.wait_for_url("**/inbox/")
    assert toggle.get_attribute("aria-expanded") == "false"  # a new page starts folded
    assert problems == []


def test_the_menu_stays_open_without_javascript(browser: Any, live_server: Any) -> None:
    personas.officer()
    context = browser.new_context(
        base_url=live_server.url, java_script_enabled=False, viewport=PHONE
    )
    page = context.new_page()
    try:
        page.goto("/login/")
        page.fill("#id_username", "olivia")
        page.fill("#id_password", personas.PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_selector("[data-landing]")
        assert not page.is_visible("[data-menu-toggle]")
        assert page.is_visible('[data-nav="inbox"]')
        assert_fits_phone(page, "menu-without-script")
    finally:
        context.close()


def _tab_to(page: Any, selector: str, *, limit: int = 120) -> None:
    """Press Tab until the focused element matches the selector (fail after `limit` presses)."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate("(s) => document.activeElement.matches(s)", selector):
            return
    pytest.fail(f"Tab never reached {selector}")


def test_an_officer_reads_signs_and_approves_gates_with_the_keyboard_only(page: Any) -> None:
    from oversight.models import GateDecision

    sync_packs()
    officer = personas.officer()
    live = planned_invoice_case(personas.analyst())
    plan_gate = Gate.objects.get(case=live, kind=GateKind.PLAN)
    hold_gate = Gate.objects.get(case=live, kind=GateKind.STEP, node__key="place-hold")
    problems = _watch_console(page)
    page.set_viewport_size({"width": 1300, "height": 900})
    _log_in(page, officer.username)

    # The plan gate: open the plan detail from the keyboard, then approve.
    page.goto(f"/gates/{plan_gate.pk}/")
    page.wait_for_selector("#dag svg g.node", timeout=30_000)
    assert page.is_disabled("[data-approve]")
    _tab_to(page, "#step-detail > summary")
    page.keyboard.press("Enter")
    assert page.evaluate("document.getElementById('step-detail').open")
    _tab_to(page, "[data-approve]")
    page.keyboard.press("Enter")
    page.wait_for_selector('.gate-page[data-status="approved"]')
    assert GateDecision.objects.filter(gate=plan_gate, decider=officer).count() == 1

    # The signature gate: the step detail opened with Space, the password typed, Enter signs.
    page.goto(f"/gates/{hold_gate.pk}/")
    page.wait_for_selector("#dag svg g.node", timeout=30_000)
    _tab_to(page, "#step-detail > summary")
    page.keyboard.press("Space")
    _tab_to(page, "#id_password")
    page.keyboard.type(personas.PASSWORD)
    _tab_to(page, "[data-approve]")
    shot(page, "keyboard-signature-gate")
    page.keyboard.press("Enter")
    page.wait_for_selector('.gate-page[data-status="approved"]')
    decision = GateDecision.objects.get(gate=hold_gate, decider=officer)
    assert decision.decision == "approve"
    assert page.is_visible("[data-signature]")
    assert problems == []


def test_the_graph_names_itself_and_links_its_text_alternative(page: Any) -> None:
    sync_packs()
    officer = personas.officer()
    live = planned_invoice_case(personas.analyst())
    plan_gate = Gate.objects.get(case=live, kind=GateKind.PLAN)
    _log_in(page, officer.username)
    for url, table in ((f"/cases/{live.pk}/", "#task-table"), (f"/gates/{plan_gate.pk}/", None)):
        page.goto(url)
        page.wait_for_selector("#dag svg g.node", timeout=30_000)
        graph = page.locator("#dag")
        assert graph.get_attribute("role") == "group"
        assert graph.get_attribute("aria-label", timeout=1000).startswith("Plan graph")
        described = page.locator(f"#{graph.get_attribute('aria-describedby')}")
        if table:
            assert described.locator(f'a[href="{table}"]').count() == 1
            assert page.locator(f"{table} tbody tr").count() == 7  # every step, as text
        else:
            described.locator('a[href="#step-detail"]').click()
            assert page.evaluate("document.getElementById('step-detail').open")
            assert page.locator("table.plan-steps tbody tr").count() == 7
