"""Every kind of answer carries the security and caching headers (RELIABILITY W7), and an
unexpected error is a generic page or notice with an error id that the log names (W9).

This module is also the urlconf of its tests: CaseHub's routes plus one view that raises.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from accounts import tokens as api_tokens
from casehub import urls as root_urls
from tests import personas
from tests.cases import planned_invoice_case

pytestmark = pytest.mark.django_db

SECRET_DETAIL = "the database password is hunter2"


def _boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError(SECRET_DETAIL)


urlpatterns = [path("test-only/boom/", _boom), *root_urls.urlpatterns]
handler400 = root_urls.handler400
handler403 = root_urls.handler403
handler404 = root_urls.handler404
handler500 = root_urls.handler500

HTMX = {"HX-Request": "true"}


def _signed_in(user: Any) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def _csp(response: HttpResponse) -> dict[str, list[str]]:
    policy = response["Content-Security-Policy"]
    return {
        name: values
        for name, *values in (part.split() for part in policy.split(";") if part.strip())
    }


def _assert_security_headers(response: HttpResponse, *, html: bool) -> None:
    csp = _csp(response)
    assert csp["object-src"] == ["'none'"]
    assert csp["base-uri"] == ["'none'"]
    assert csp["frame-ancestors"] == ["'none'"]
    assert "'unsafe-inline'" not in response["Content-Security-Policy"]
    assert "'unsafe-eval'" not in response["Content-Security-Policy"]
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"
    assert "no-store" in response["Cache-Control"]
    assert "private" in response["Cache-Control"]
    if html:
        vary = {value.strip().lower() for value in response["Vary"].split(",")}
        assert {"hx-request", "hx-target"} <= vary


def _kinds_of_answer() -> list[tuple[str, HttpResponse, int, bool]]:
    analyst = personas.analyst()
    case = planned_invoice_case(analyst)
    page_client = _signed_in(analyst)
    token = api_tokens.issue_api_token(analyst)
    api = Client(raise_request_exception=False, headers={"Authorization": f"Bearer {token}"})
    return [
        ("login page", Client().get("/login/"), 200, True),
        ("case page", page_client.get(f"/cases/{case.pk}/"), 200, True),
        (
            "htmx partial",
            page_client.get("/cases/", headers={**HTMX, "HX-Target": "case-table"}),
            200,
            True,
        ),
        ("API JSON", api.get(f"/api/cases/{case.pk}"), 200, False),
        ("API 404", api.get("/api/cases/987654"), 404, False),
        ("404 page", page_client.get("/cases/987654/"), 404, True),
        ("403 page", page_client.get("/audit/"), 403, True),
        ("403 notice", page_client.get("/audit/", headers=HTMX), 403, True),
        ("500 page", page_client.get("/test-only/boom/"), 500, True),
        ("500 notice", page_client.get("/test-only/boom/", headers=HTMX), 500, True),
    ]


@pytest.mark.scenario("W7")
@override_settings(ROOT_URLCONF=__name__)
def test_every_kind_of_answer_carries_the_security_and_caching_headers() -> None:
    for name, response, status, html in _kinds_of_answer():
        assert response.status_code == status, name
        try:
            _assert_security_headers(response, html=html)
        except (AssertionError, KeyError) as exc:
            raise AssertionError(f"{name}: {exc!r} in {dict(response.headers)}") from exc


@pytest.mark.scenario("W7")
def test_each_page_has_its_own_nonce_and_every_script_carries_it() -> None:
    analyst = personas.analyst()
    case = planned_invoice_case(analyst)
    client = _signed_in(analyst)
    nonces = []
    for _ in range(2):
        response = client.get(f"/cases/{case.pk}/")
        found = re.search(r"'nonce-([^']+)'", _csp(response)["script-src"][1])
        assert found is not None
        nonce = found.group(1)
        scripts = re.findall(r"<script\b[^>]*>", response.content.decode())
        assert len(scripts) >= 3  # htmx, the Graphviz renderer and the DAG script
        assert all(f'nonce="{nonce}"' in tag for tag in scripts), scripts
        nonces.append(nonce)
    assert nonces[0] != nonces[1]


@pytest.mark.scenario("W7")
def test_htmx_may_neither_eval_nor_run_script_tags_it_swaps_in() -> None:
    html = _signed_in(personas.analyst()).get("/cases/").content.decode()
    found = re.search(r"<meta name=\"htmx-config\" content='([^']+)'>", html)
    assert found is not None
    config = json.loads(found.group(1))
    assert config["allowEval"] is False
    assert config["allowScriptTags"] is False


@pytest.mark.scenario("W7")
def test_the_api_docs_and_document_need_a_signed_in_user() -> None:
    anonymous = Client()
    docs = anonymous.get("/api/docs")
    assert docs.status_code == 302
    assert docs["Location"].startswith("/login/?next=/api/docs")
    document = anonymous.get("/api/openapi.json")
    assert document.status_code == 401
    assert document["WWW-Authenticate"] == "Bearer"
    assert "paths" not in document.json()
    bad_token = Client(headers={"Authorization": "Bearer not-a-token"})
    assert bad_token.get("/api/openapi.json").status_code == 401

    analyst = personas.analyst()
    assert _signed_in(analyst).get("/api/docs").status_code == 200
    assert "/api/cases" in _signed_in(analyst).get("/api/openapi.json").json()["paths"]
    token = api_tokens.issue_api_token(analyst)
    with_token = Client(headers={"Authorization": f"Bearer {token}"})
    assert "/api/cases" in with_token.get("/api/openapi.json").json()["paths"]


# Errors ---------------------------------------------------------------------------------------


def _error_id(html: str) -> str:
    found = re.search(r"<code data-error-id>([0-9a-f]{16})</code>", html)
    assert found is not None, html
    return found.group(1)


def _assert_logged(caplog: pytest.LogCaptureFixture, error_id: str) -> None:
    records = [r for r in caplog.records if error_id in r.getMessage()]
    assert records, [r.getMessage() for r in caplog.records]
    assert records[0].levelno == logging.ERROR
    assert records[0].exc_info is not None and SECRET_DETAIL in str(records[0].exc_info[1])


@pytest.mark.scenario("W9")
@override_settings(ROOT_URLCONF=__name__)
def test_an_error_in_a_page_is_a_generic_page_with_an_error_id_that_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    response = _signed_in(personas.analyst()).get("/test-only/boom/")
    assert response.status_code == 500
    html = response.content.decode()
    assert "Something went wrong" in html and "<html" in html
    assert SECRET_DETAIL not in html and "Traceback" not in html and "RuntimeError" not in html
    _assert_logged(caplog, _error_id(html))


@pytest.mark.scenario("W9")
@override_settings(ROOT_URLCONF=__name__)
def test_an_error_in_a_partial_is_a_notice_in_the_error_region_with_an_error_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    response = _signed_in(personas.analyst()).get(
        "/test-only/boom/", headers={**HTMX, "HX-Target": "case-table"}
    )
    assert response.status_code == 500
    assert response["HX-Retarget"] == "#htmx-error"
    assert response["HX-Reswap"] == "innerHTML"
    html = response.content.decode()
    assert "<html" not in html and 'data-error-notice="500"' in html
    assert SECRET_DETAIL not in html and "Traceback" not in html
    _assert_logged(caplog, _error_id(html))


@pytest.mark.scenario("W9")
def test_htmx_swaps_a_500_notice_into_the_page_instead_of_dropping_it() -> None:
    html = _signed_in(personas.analyst()).get("/cases/").content.decode()
    found = re.search(r"<meta name=\"htmx-config\" content='([^']+)'>", html)
    assert found is not None
    rules = json.loads(found.group(1))["responseHandling"]
    first = next(rule for rule in rules if re.search(rule["code"], "500"))
    assert first["swap"] is True


@override_settings(ALLOWED_HOSTS=["casehub.example"], DEBUG=False)
@pytest.mark.parametrize("hx", [False, True])
def test_a_host_header_not_allowed_is_a_400_page_not_a_500(hx: bool) -> None:
    client = Client(raise_request_exception=False)
    headers = {"HX-Request": "true"} if hx else {}
    response = client.get("/", HTTP_HOST="attacker.example", headers=headers)
    assert response.status_code == 400
    assert b"Traceback" not in response.content
