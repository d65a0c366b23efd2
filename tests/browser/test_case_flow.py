"""The analyst's flow in a real browser: submit an invoice case, watch it planned live, read the
DAG drawn by the vendored Graphviz build, and open a step's panel."""

from __future__ import annotations

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
        # Failed loads are judged by their responses below (the browser's favicon probe 404s).
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            problems.append(message.text)

    def response(answer: Any) -> None:
        if answer.status >= 400 and not answer.url.endswith("/favicon.ico"):
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


def test_analyst_submits_an_invoice_case_and_watches_it_planned(
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
    page.select_option("select[name=domain]", "invoice")
    page.wait_for_selector("#domain-inputs input[name=input_invoice_id]")
    page.fill("input[name=title]", "Check invoice INV-1042")
    page.fill("input[name=goal]", "Verify invoice INV-1042 before it is paid")
    page.fill("textarea[name=description]", "Supplier says it was never paid.")
    page.fill("input[name=input_invoice_id]", "INV-1042")

    page.select_option("select[name=strategy]", "llm")
    page.fill("input[name=max_depth]", "3")
    page.wait_for_selector("#llm-estimate >> text=Up to 31 LLM calls (b = 5, depth 3)")
    page.select_option("select[name=strategy]", "static")
    page.wait_for_selector("#llm-estimate >> text=No LLM calls")
    page.click("button.primary[type=submit]")

    page.wait_for_selector('#case-live[data-status="planning"]')
    case = Case.objects.get()
    assert page.url.endswith(f"/cases/{case.pk}/")
    assert case.status == CaseStatus.PLANNING
    page.evaluate("window.__notReloaded = true")

    worker = _start_worker_keeping_the_queue()
    try:
        page.wait_for_selector('#case-live[data-status="awaiting_approval"]', timeout=60_000)
    finally:
        worker.stop()
    assert page.evaluate("window.__notReloaded") is True  # htmx polling, not a reload
    assert page.get_attribute("#case-live", "hx-trigger") is None  # polling has stopped

    drawn = _drawn_steps(page)
    assert drawn >= INVOICE_STEPS, drawn
    clusters = page.eval_on_selector_all(
        "#dag svg g.cluster text", "els => els.map(e => e.textContent)"
    )
    assert "verify-invoice" in clusters, clusters  # the root compound, drawn as a cluster
    rows = page.eval_on_selector_all("#task-table tbody tr", "els => els.map(e => e.dataset.key)")
    assert set(rows) == INVOICE_STEPS

    page.click('#dag svg g.node:has(text:text-is("check-duplicate")) a')
    page.wait_for_selector('#node-panel[data-node="check-duplicate"]')
    panel = page.inner_text("#node-panel")
    assert "payments-auditor" in panel
    assert "check_duplicate_payment" in panel
    assert "lookup-supplier" in panel  # its dependency
    assert page.url.endswith(f"/cases/{case.pk}/")
    assert page.evaluate("window.__notReloaded") is True
    assert page.locator("#dag svg g.node.selected").count() == 1

    out = ROOT / "test-results" / request.node.name
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / "case-page.png"), full_page=True)
    assert problems == []


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
