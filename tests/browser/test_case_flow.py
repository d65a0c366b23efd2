"""The analyst's flow in a real browser: submit the form's defaults, watch the case planned live,
read the DAG drawn by the vendored Graphviz build, open steps by URL; the form's refreshes keep
texts out of URLs; refusals in plain words; error pages in the site's layout."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from planning.catalogue import sync_packs
from planning.models import Case, CaseStatus
from tests import personas
from tests.planning.factories import make_case, make_plan

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
INVOICE_STEPS = {
    "extract-fields",
    "lookup-supplier",
    "check-duplicate",
    "check-totals",
    "check-po",
    "audit-report",
    "place-hold",
}


def _log_in(page: Any, username: str) -> None:
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", personas.PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("[data-landing]")


def _watch_console(page: Any) -> list[str]:
    problems: list[str] = []

    def console(message: Any) -> None:
        # Failed loads are judged by their responses below.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            problems.append(message.text)

    def response(answer: Any) -> None:
        if answer.status >= 400:
            problems.append(f"{answer.status} {answer.url}")

    page.on("console", console)
    page.on("response", response)
    page.on("pageerror", lambda e: problems.append(f"pageerror: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    return problems


def _drawn_steps(page: Any) -> set[str]:
    page.wait_for_selector("#dag svg g.node", timeout=30_000)
    texts = page.eval_on_selector_all("#dag svg g.node text", "els => els.map(e => e.textContent)")
    return set(texts)


def _start_worker_keeping_the_queue() -> Any:
    # The case was queued before any worker ran (so the page could be seen planning first),
    # so this worker must not purge the queue on start.
    from tests.conftest import running_worker

    return running_worker({"OPENAI_BASE_URL": "", "OPENAI_API_KEY": ""}, purge=False)


def _selected_step(page: Any) -> str:
    """Return the step highlighted in the graph; assert the table and the panel agree."""
    # Read in one task: what a user sees at one moment.
    drawn, rows, panel = page.evaluate(
        """() => [
            [...document.querySelectorAll("#dag svg g.node.selected text:first-of-type")]
                .map(e => e.textContent),
            [...document.querySelectorAll("#task-table tr.selected[aria-current=true]")]
                .map(e => e.dataset.key),
            document.getElementById("node-panel").getAttribute("data-node"),
        ]"""
    )
    assert len(drawn) == 1 and rows == drawn and panel == drawn[0], (drawn, rows, panel)
    return str(panel)


def test_analyst_submits_the_forms_defaults_and_watches_the_case_planned(
    page: Any, request: pytest.FixtureRequest
) -> None:
    from celery import current_app

    current_app.control.purge()
    sync_packs()
    analyst = personas.analyst()
    problems = _watch_console(page)
    page.set_viewport_size({"width": 1600, "height": 1000})
    _log_in(page, analyst.username)

    page.click('[data-nav="case-new"]')
    page.wait_for_selector("#case-form")
    # Only what a new user must type: the domain, strategy and depth stay as offered.
    assert page.input_value("select[name=domain]") == "invoice"
    assert page.input_value("select[name=strategy]") == "static"
    assert page.locator("select[name=strategy] option[value=llm]").is_disabled()
    page.fill("input[name=title]", "Check invoice INV-1042")
    page.fill("input[name=goal]", "Verify invoice INV-1042 before it is paid")
    page.fill("textarea[name=description]", "Supplier says it was never paid.")
    page.fill("input[name=input_invoice_id]", "INV-1042")
    page.click("button.primary[type=submit]")

    page.wait_for_selector('#case-live[data-status="planning"]')
    case = Case.objects.get()
    assert page.url.endswith(f"/cases/{case.pk}/")
    assert (case.domain, case.strategy, case.max_depth) == ("invoice", "static", 2)
    assert case.status == CaseStatus.PLANNING
    assert "INV-1042" in page.inner_text(".case-inputs")
    page.evaluate("window.__notReloaded = true")

    worker = _start_worker_keeping_the_queue()
    try:
        page.wait_for_selector('#case-live[data-status="awaiting_approval"]', timeout=60_000)
    finally:
        worker.stop()
    assert page.evaluate("window.__notReloaded") is True  # htmx polling, not a reload
    # Still polling: the officer's decision is what moves it on, and the page shows it (#21).
    assert page.get_attribute("#case-live", "hx-trigger") == "every 2s"
    assert "nothing runs until a compliance officer approves the plan" in page.inner_text(
        "#case-live"
    )

    drawn = _drawn_steps(page)
    assert drawn >= INVOICE_STEPS, drawn
    clusters = page.eval_on_selector_all(
        "#dag svg g.cluster text", "els => els.map(e => e.textContent)"
    )
    assert "verify-invoice" in clusters, clusters  # the root compound, drawn as a cluster
    rows = page.eval_on_selector_all("#task-table tbody tr", "els => els.map(e => e.dataset.key)")
    assert set(rows) == INVOICE_STEPS

    # A step clicked in the graph: its panel opens, its URL is pushed, the table follows.
    page.click('#dag svg g.node:has(text:text-is("check-duplicate")) a')
    page.wait_for_selector('#node-panel[data-node="check-duplicate"]')
    panel = page.inner_text("#node-panel")
    assert "payments-auditor" in panel
    assert "check_duplicate_payment" in panel
    assert "lookup-supplier" in panel  # its dependency
    assert re.search(rf"/cases/{case.pk}/nodes/\d+/$", page.url), page.url
    assert page.evaluate("window.__notReloaded") is True
    assert _selected_step(page) == "check-duplicate"
    step_url = page.url

    # A step opened from the table is highlighted in the graph too, in the swap's own task: no
    # moment in which the panel shows one step and the graph or the table another.
    # Only the step panel's swap counts: the page's own poll (every 2 s) swaps too, and under load
    # it can land between this listener and the click.
    page.evaluate(
        """() => document.addEventListener("htmx:afterSwap", (event) => {
            if (window.__atSwap || event.detail.target.id !== "node-panel") return;
            window.__atSwap = [
                [...document.querySelectorAll("#dag svg g.node.selected text:first-of-type")]
                    .map(e => e.textContent).join(),
                [...document.querySelectorAll("#task-table tr.selected")]
                    .map(e => e.dataset.key).join(),
                document.getElementById("node-panel").getAttribute("data-node"),
            ];
        })"""
    )
    page.click('#task-table a:text-is("check-totals")')
    page.wait_for_selector('#node-panel[data-node="check-totals"]')
    assert page.evaluate("window.__atSwap") == ["check-totals"] * 3
    assert _selected_step(page) == "check-totals"

    # Back shows the previous step again; reload keeps it, in graph, table and panel.
    page.go_back()
    page.wait_for_url(step_url)
    page.wait_for_selector('#node-panel[data-node="check-duplicate"]')
    page.reload()
    page.wait_for_selector("#dag svg g.node.selected")
    assert _selected_step(page) == "check-duplicate"

    # Closing the panel returns to the case's own URL with nothing selected.
    page.click("#node-panel a.close")
    page.wait_for_url(f"**/cases/{case.pk}/")
    page.wait_for_selector("#node-panel:not([data-node])")
    assert page.locator("#dag svg g.node.selected, #task-table tr.selected").count() == 0

    out = ROOT / "test-results" / request.node.name
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / "case-page.png"), full_page=True)
    assert problems == []


def test_refreshing_the_form_never_puts_the_texts_or_the_token_in_a_url(page: Any) -> None:
    sync_packs()
    analyst = personas.analyst()
    problems = _watch_console(page)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    _log_in(page, analyst.username)
    page.goto("/cases/new/")
    description = "Long notes. " * 6_000  # 72 KB: more than any URL may carry
    page.fill("input[name=title]", "Keep this title")
    page.fill("input[name=goal]", "Keep this goal")
    page.fill("textarea[name=description]", description)

    page.select_option("select[name=domain]", "fraud")
    page.wait_for_selector("#domain-inputs input[name=input_account_id]")
    page.select_option("select[name=domain]", "invoice")
    page.wait_for_selector("#domain-inputs input[name=input_invoice_id]")
    page.fill("input[name=input_invoice_id]", "INV-1042")
    page.uncheck("input[name=input_hold_on_findings]")
    page.select_option("select[name=strategy]", "hybrid")
    page.wait_for_selector("#llm-estimate >> text=static methods only")
    page.fill("input[name=max_depth]", "3")
    page.select_option("select[name=strategy]", "static")
    page.wait_for_selector("#llm-estimate >> text=No LLM calls")

    refreshes = [url for url in requests if "/cases/new/?" in url]
    assert refreshes, requests
    token = page.input_value("input[name=csrfmiddlewaretoken]")
    for url in requests:
        assert len(url) < 2_000, url[:200]
        assert "Long+notes" not in url and "Long%20notes" not in url
        assert "Keep" not in url and "csrfmiddlewaretoken" not in url and token not in url
    # Nothing typed was lost on the way.
    assert page.input_value("input[name=title]") == "Keep this title"
    assert page.input_value("textarea[name=description]") == description
    assert page.input_value("input[name=max_depth]") == "3"
    assert page.input_value("input[name=input_invoice_id]") == "INV-1042"
    assert not page.is_checked("input[name=input_hold_on_findings]")

    # The form refuses the over-long description with the count, and keeps everything.
    page.click("button.primary[type=submit]")
    page.wait_for_selector('[data-field="description"] .errorlist')
    error = page.inner_text('[data-field="description"] .errorlist')
    assert f"this has {len(description.strip()):,}" in error
    assert page.input_value("textarea[name=description]") == description
    assert not Case.objects.exists()
    assert [p for p in problems if not p.startswith("422 ")] == []


def test_an_invoice_the_erp_does_not_hold_is_refused_in_plain_words(page: Any) -> None:
    sync_packs()
    analyst = personas.analyst()
    _log_in(page, analyst.username)
    page.goto("/cases/new/")
    page.fill("input[name=title]", "Check INV-9999")
    page.fill("input[name=goal]", "Verify it")
    page.fill("input[name=input_invoice_id]", "INV-9999")
    page.click("button.primary[type=submit]")
    page.wait_for_selector('[data-field="input_invoice_id"] .errorlist')
    error = page.inner_text('[data-field="input_invoice_id"] .errorlist')
    assert "INV-9999" in error and "not in the ERP" in error, error
    assert not re.search(r"pattern|regex|\^|\$|Traceback|Error:", error), error
    assert page.input_value("input[name=input_invoice_id]") == "INV-9999"
    assert not Case.objects.exists()


def test_error_pages_are_styled_pages_and_htmx_notices(
    page: Any, request: pytest.FixtureRequest
) -> None:
    analyst = personas.analyst()
    mine = make_case(analyst, title="Mine")
    make_plan(mine, leaves=2)
    theirs = make_case(personas.analyst("bea"), title="Theirs")
    make_plan(theirs, leaves=2)
    problems = _watch_console(page)
    _log_in(page, analyst.username)

    answer = page.goto(f"/cases/{theirs.pk}/")
    assert answer is not None and answer.status == 404
    assert page.locator(".topbar [data-nav=cases]").count() == 1  # the site's layout
    assert page.eval_on_selector(".error-page", "e => getComputedStyle(e).borderRadius") == "8px"
    assert "not yours to see" in page.inner_text("[data-error='404']")
    assert "Theirs" not in page.content()
    out = ROOT / "test-results" / request.node.name
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / "404.png"), full_page=True)
    page.click("[data-error='404'] a:text-is('Cases')")
    page.wait_for_url("**/cases/")

    # A partial request for something not the user's: a notice, the page stays as it was.
    page.goto(f"/cases/{mine.pk}/")
    page.wait_for_selector("#dag svg g.node")
    foreign = f"/cases/{theirs.pk}/nodes/{first_leaf_pk(theirs)}/"
    page.evaluate(
        "url => htmx.ajax('GET', url, {target: '#node-panel', swap: 'outerHTML'})", foreign
    )
    page.wait_for_selector("#htmx-error [data-error-notice='404']")
    assert page.locator("#node-panel").count() == 1
    assert page.locator("#htmx-error a[href='/cases/']").count() == 1
    assert page.url.endswith(f"/cases/{mine.pk}/")

    outsider = personas.outsider()
    page.click("text=Log out")
    page.wait_for_url("**/login/")
    page.fill("#id_username", outsider.username)
    page.fill("#id_password", personas.PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_selector("[data-landing]")
    answer = page.goto("/cases/")
    assert answer is not None and answer.status == 403
    assert "read cases" in page.inner_text("[data-error='403']")
    assert page.eval_on_selector(".error-page", "e => getComputedStyle(e).borderRadius") == "8px"
    page.screenshot(path=str(out / "403.png"), full_page=True)
    unexpected = [p for p in problems if not re.match(r"(403|404) ", p)]
    assert unexpected == []


def first_leaf_pk(case: Case) -> int:
    from planning.models import PlanNode

    return PlanNode.objects.filter(version=case.current_version, kind="leaf").first().pk  # type: ignore[union-attr]


def test_hostile_step_text_is_drawn_as_text(page: Any, request: pytest.FixtureRequest) -> None:
    analyst = personas.analyst()
    case = make_case(analyst, title="Hostile labels")
    hostile = '"}; <script>alert(1)</script> <img src=x onerror=alert(2)> \\N {'
    make_plan(case, leaves=2, labels={0: {"task": hostile, "key": 'evil"}{key'}})
    problems = _watch_console(page)
    _log_in(page, analyst.username)
    page.goto(f"/cases/{case.pk}/")
    drawn = _drawn_steps(page)
    assert 'evil"}{key' in drawn
    assert any("<script>alert(1)</script>" in text for text in drawn)
    assert page.locator("#dag script, #dag img, #dag foreignObject").count() == 0
    assert page.locator("#dag svg g.node").count() == 2
    page.locator("#dag svg g.node a").first.click()
    page.wait_for_selector("#node-panel[data-node]")
    assert "<script>alert(1)</script>" in page.inner_text("#node-panel")
    out = ROOT / "test-results" / request.node.name
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / "hostile.png"), full_page=True)
    assert problems == []


def test_the_form_shows_the_servers_messages_at_once_and_clears_one_when_corrected(
    page: Any,
) -> None:
    sync_packs()
    analyst = personas.analyst()
    _log_in(page, analyst.username)
    page.goto("/cases/new/")
    page.fill("input[name=goal]", "Verify it")
    page.fill("input[name=input_invoice_id]", "abc")
    page.fill("textarea[name=description]", "x" * 10_001)
    page.click("button.primary[type=submit]")
    # The browser does not stop the form with its own generic words: every field's error is
    # the server's, in one round.
    page.wait_for_selector('[data-field="title"] .errorlist', timeout=5_000)

    def error(name: str) -> str:
        return page.inner_text(f'[data-field="{name}"] .errorlist').strip()

    assert error("input_invoice_id") == "An invoice number looks like INV-1042."
    assert error("description") == "At most 10,000 characters (this has 10,001)."
    assert error("title") == "A title is required."
    page.screenshot(path=str(ROOT / "var" / "screens" / "case-form-errors.png"), full_page=True)
    page.fill("input[name=input_invoice_id]", "INV-1042")
    assert page.locator('[data-field="input_invoice_id"] .errorlist').count() == 0
    assert page.get_attribute("input[name=input_invoice_id]", "aria-invalid") is None
    assert page.locator('[data-field="title"] .errorlist').count() == 1
    assert not Case.objects.exists()


def test_step_keys_and_method_descriptions_keep_their_case(page: Any) -> None:
    sync_packs()
    officer = personas.officer()
    _log_in(page, officer.username)
    page.goto("/methods/")
    row_header = page.locator(".methods-table tbody th").first
    assert row_header.evaluate("e => getComputedStyle(e).textTransform") == "none"
    assert (
        page.locator(".methods-table thead th").first.evaluate(
            "e => getComputedStyle(e).textTransform"
        )
        == "uppercase"
    )  # the column titles stay small capitals
    page.screenshot(path=str(ROOT / "var" / "screens" / "methods.png"))
