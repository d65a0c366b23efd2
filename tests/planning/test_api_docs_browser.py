"""The API docs page renders and works in a real browser under the project's strict CSP."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from accounts import tokens as api_tokens
from tests import personas
from tests.browser.test_case_flow import _log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Registered before any page script runs (init scripts are not subject to the page's CSP).
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(event.violatedDirective + " " + event.blockedURI);
});
"""


def test_the_api_docs_render_from_local_assets_and_call_the_api_under_the_csp(
    page: Any, live_server: Any
) -> None:
    analyst = personas.analyst()
    token = api_tokens.issue_api_token(analyst)
    messages: list[str] = []
    requests: list[str] = []
    page.add_init_script(RECORD_VIOLATIONS)
    page.on("console", lambda message: messages.append(f"{message.type}: {message.text}"))
    page.on("pageerror", lambda error: messages.append(f"pageerror: {error}"))
    page.on("request", lambda request: requests.append(request.url))

    _log_in(page, analyst.username)  # the docs are for signed-in users
    response = page.goto("/api/docs")
    assert response is not None
    assert response.status == 200
    page.wait_for_selector(".swagger-ui .info .title", timeout=15_000)
    assert "CaseHub API" in page.text_content(".swagger-ui .info .title")
    page.wait_for_selector('[data-path="/api/cases/{case_id}/plan"]')

    # Enter the bearer token through the Authorize dialog, then call GET /api/agents.
    page.click(".swagger-ui .auth-wrapper .authorize")
    page.fill(".swagger-ui .modal-ux input", token)
    page.click(".swagger-ui .modal-ux .auth-btn-wrapper .authorize")
    page.click(".swagger-ui .modal-ux .btn-done")
    operation = page.locator("#operations-agents-execution_api_list_agents")
    operation.locator(".opblock-summary").click()
    operation.locator(".try-out__btn").click()
    operation.locator(".execute").click()
    result = operation.locator(".live-responses-table tr.response .response-col_status")
    result.wait_for()
    assert (result.text_content() or "").strip() == "200"
    assert "erp-connector" in (operation.locator(".live-responses-table").text_content() or "")

    host = urlsplit(live_server.url).netloc
    assert all(urlsplit(url).netloc == host for url in requests if url.startswith("http")), requests
    assert any(urlsplit(url).path == "/static/ninja/swagger-ui-bundle.js" for url in requests)
    assert page.evaluate("window.__cspViolations") == []
    assert [m for m in messages if "Content Security Policy" in m or "pageerror" in m] == []
