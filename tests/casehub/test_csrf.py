"""State changes need a POST with the CSRF token from the same origin (RELIABILITY W2).

The client enforces CSRF checks as a browser would meet them. htmx sends the token in the
`X-CSRFToken` header that `<body hx-headers>` carries on every page; a POST without it, or with
a forged `Origin`, is refused with 403 and changes nothing. The API takes no CSRF token: it is
authenticated by bearer tokens only, so a session cookie (what a forged cross-site request
would carry) opens nothing there. GET on a route that changes state is 405 (the authorization
matrix checks that no GET anywhere writes a row).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import AbstractUser
from django.test import Client

from accounts import tokens as api_tokens
from accounts.models import AccessDenial
from oversight.models import Gate, GateDecision, GateKind
from planning.models import Case
from tests import personas
from tests.cases import planned_invoice_case
from tests.routes import MUTATING, all_routes

pytestmark = [pytest.mark.django_db, pytest.mark.scenario("W2")]

HX_HEADERS = re.compile(r"<body hx-headers='([^']+)'>")
FORGED_ORIGIN = "http://forged.invalid"


def _browser(user: AbstractUser) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def _htmx_headers(client: Client, page: str) -> dict[str, str]:
    """Return the headers htmx sends from `page`: the body's hx-headers, and HX-Request."""
    html = client.get(page).content.decode()
    match = HX_HEADERS.search(html)
    assert match is not None, f"{page} has no <body hx-headers>: htmx would send no CSRF token"
    return {**json.loads(match[1]), "HX-Request": "true"}


def _decision(gate: Gate) -> dict[str, str]:
    return {
        "decision": "approve",
        "version": str(gate.version.number),
        "content_hash": gate.content_hash,
        "detail_opened": "1",
    }


@pytest.fixture
def plan_gate(db: None) -> Gate:
    case = planned_invoice_case(personas.analyst())
    return Gate.objects.get(case=case, kind=GateKind.PLAN)


def test_an_htmx_post_with_the_pages_token_decides_the_gate(plan_gate: Gate) -> None:
    officer = _browser(personas.officer())
    headers = _htmx_headers(officer, f"/gates/{plan_gate.pk}/")
    response = officer.post(f"/gates/{plan_gate.pk}/decide", _decision(plan_gate), headers=headers)
    assert response.status_code == 302
    assert GateDecision.objects.filter(gate=plan_gate).count() == 1


def test_an_htmx_post_without_the_token_is_refused_and_decides_nothing(plan_gate: Gate) -> None:
    officer = _browser(personas.officer())
    officer.get(f"/gates/{plan_gate.pk}/")  # the CSRF cookie is set; the header is not sent
    response = officer.post(
        f"/gates/{plan_gate.pk}/decide", _decision(plan_gate), headers={"HX-Request": "true"}
    )
    assert response.status_code == 403
    assert not GateDecision.objects.exists()


def test_a_post_with_the_token_but_a_forged_origin_is_refused(plan_gate: Gate) -> None:
    officer = _browser(personas.officer())
    headers = {**_htmx_headers(officer, f"/gates/{plan_gate.pk}/"), "Origin": FORGED_ORIGIN}
    response = officer.post(f"/gates/{plan_gate.pk}/decide", _decision(plan_gate), headers=headers)
    assert response.status_code == 403
    assert not GateDecision.objects.exists()


def _page_posts() -> dict[str, str]:
    """{key: URL} of every route outside the API that may take a POST (the admin's all may).

    Any value does for the URL's parameters: the CSRF check runs before the view looks.
    """
    urls = {}
    for route in all_routes():
        if route.route.startswith("api/"):
            continue
        if route.methods is not None and not route.methods & MUTATING:
            continue
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"\1", route.route)
        path = re.sub(r"<(?:\w+:)?\w+>", "1", path)
        urls[route.key] = "/" + path.replace("^", "").replace("$", "")
    return urls


def test_every_page_and_admin_post_without_the_token_is_refused() -> None:
    admin = _browser(personas.admin())
    admin.get("/")  # the CSRF cookie is set; no token goes with the posts below
    answers = {key: admin.post(url, {}).status_code for key, url in _page_posts().items()}
    assert len(answers) > 20
    assert {key: status for key, status in answers.items() if status != 403} == {}


def test_get_on_a_route_that_changes_state_is_405_and_changes_nothing(plan_gate: Gate) -> None:
    officer = _browser(personas.officer())
    query = "&".join(f"{k}={v}" for k, v in _decision(plan_gate).items())
    assert officer.get(f"/gates/{plan_gate.pk}/decide?{query}").status_code == 405
    assert officer.get("/inbox/approve?gate=1").status_code == 405
    assert not GateDecision.objects.exists()


# The API ------------------------------------------------------------------------------------

CASE = {
    "title": "Verify INV-1042",
    "goal": "Verify invoice INV-1042",
    "domain": "invoice",
    "strategy": "static",
    "inputs": {"invoice_id": "INV-1042"},
}


def _json(client: Client, path: str, data: dict[str, Any], **headers: str) -> Any:
    return client.post(path, json.dumps(data), content_type="application/json", headers=headers)


def test_a_session_without_csrf_opens_nothing_in_the_api() -> None:
    # What a forged cross-site POST carries: the victim's session cookie, no token of any kind.
    browser = _browser(personas.analyst())
    response = _json(browser, "/api/cases", CASE)
    assert response.status_code == 401
    assert not Case.objects.exists()
    assert AccessDenial.objects.filter(kind=AccessDenial.Kind.BAD_TOKEN).exists()


def test_a_session_with_its_csrf_token_still_opens_nothing_in_the_api() -> None:
    browser = _browser(personas.analyst())
    token = _htmx_headers(browser, "/")["x-csrftoken"]
    response = _json(browser, "/api/cases", CASE, **{"X-CSRFToken": token})
    assert response.status_code == 401
    assert not Case.objects.exists()


def test_a_bearer_token_needs_no_csrf_token() -> None:
    analyst = personas.analyst()
    client = Client(
        enforce_csrf_checks=True,
        headers={"Authorization": f"Bearer {api_tokens.issue_api_token(analyst)}"},  # type: ignore[arg-type]
    )
    response = _json(client, "/api/cases", CASE, Origin=FORGED_ORIGIN)
    assert response.status_code < 300, response.content
    assert Case.objects.filter(submitter=analyst).count() == 1
