"""An officer opens the planning-quality page in a real browser: every plot is drawn (its canvas
has ink), nothing breaks the strict CSP and the console stays clean. Screenshots land under
the var dir (quality-shots/)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from planning.core.llm.pricing import PriceTable
from tests.browser.test_case_flow import _log_in, _watch_console
from tests.quality.test_quality import executed_case, reviewed_case

pytestmark = [pytest.mark.browser]

CHARTS = (
    "chart-series",
    "chart-tokens",
    "chart-shape",
    "chart-times",
    "chart-gates",
    "chart-ratio",
)
# Collects CSP violations as the page reports them (besides the console message).
WATCH_CSP = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""
INKED_PIXELS = """
(id) => {
  const canvas = document.getElementById(id);
  const { width, height } = canvas;
  const pixels = canvas.getContext("2d").getImageData(0, 0, width, height).data;
  let inked = 0;
  for (let i = 3; i < pixels.length; i += 4) { if (pixels[i] !== 0) inked++; }
  return inked;
}
"""


def test_the_officer_sees_every_quality_plot_drawn_without_csp_violations(
    page: Any,
    transactional_db: None,
    settings: Any,
    analyst: Any,
    officer: Any,
    second_officer: Any,
) -> None:
    settings.CASEHUB_LLM_PRICE_TABLE = PriceTable.parse("gpt-4o-mini=0.15/0.60")
    for _ in range(2):
        executed_case(analyst, officer)
        reviewed_case(analyst, officer, second_officer)
    shots = Path(os.environ.get("CASEHUB_QUALITY_SHOTS", django_settings.VAR_DIR / "quality-shots"))
    shots.mkdir(parents=True, exist_ok=True)
    problems = _watch_console(page)
    page.add_init_script(WATCH_CSP)
    page.set_viewport_size({"width": 1300, "height": 1000})
    _log_in(page, officer.username)
    page.click('a[data-nav="quality"]')
    page.wait_for_selector('[data-page="quality"]')
    for chart in CHARTS:
        page.wait_for_selector(f'#{chart}[data-drawn="true"]')
    page.wait_for_timeout(300)
    for chart in CHARTS:
        assert page.evaluate(INKED_PIXELS, chart) > 500, chart
    assert page.evaluate("window.__cspViolations") == []
    assert problems == []
    assert page.locator('[data-figure="cases"]').inner_text() == "4"
    assert page.locator('details[data-table="cases"] tbody tr').count() == 4
    page.screenshot(path=str(shots / "quality.png"), full_page=True)
    page.screenshot(path=str(shots / "quality-top.png"))
    page.locator('section[aria-labelledby="case-title"]').screenshot(
        path=str(shots / "quality-cases.png")
    )
    page.locator('details[data-table="cases"] tbody th a').first.click()
    page.wait_for_selector('[data-page="case-quality"]')
    page.screenshot(path=str(shots / "case-quality.png"), full_page=True)
    assert page.evaluate("window.__cspViolations") == []
    assert problems == []


def test_the_officer_sees_the_plan_evaluation_plot_drawn_without_csp_violations(
    page: Any, transactional_db: None, officer: Any
) -> None:
    shots = Path(os.environ.get("CASEHUB_QUALITY_SHOTS", django_settings.VAR_DIR / "quality-shots"))
    shots.mkdir(parents=True, exist_ok=True)
    problems = _watch_console(page)
    page.add_init_script(WATCH_CSP)
    page.set_viewport_size({"width": 1300, "height": 1000})
    _log_in(page, officer.username)
    page.click('a[data-nav="quality"]')
    page.click('a[data-link="plan-evaluation"]')
    page.wait_for_selector('[data-page="plan-evaluation"]')
    # the committed results of the fake model (eval/results/fake-model.json)
    page.wait_for_selector('#chart-model-1[data-drawn="true"]')
    page.wait_for_timeout(300)
    assert page.evaluate(INKED_PIXELS, "chart-model-1") > 500
    assert page.evaluate("window.__cspViolations") == []
    assert problems == []
    assert page.locator('section[data-model="fake-model"] tr[data-strategy]').count() == 7
    page.screenshot(path=str(shots / "plan-evaluation.png"), full_page=True)
