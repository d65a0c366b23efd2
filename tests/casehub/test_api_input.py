"""The API refuses hostile input cleanly: 400, 413, 414 or 422 in JSON, fast, never a 500.

Bodies are sent as raw JSON text so that what reaches the server is exactly what an attacker
would send: `\\udfff` and `\\u0000` escapes, `NaN`, `1e400`, deep nesting, huge lists.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from accounts import tokens as api_tokens
from audit.models import AuditEvent
from casehub.api import QUERY_MAX_LENGTH, TEXT_PATTERN
from planning import rules
from planning.models import Case
from tests import personas

pytestmark = pytest.mark.django_db

# Generous for two shared cores; a request that parses or walks without bound takes far longer.
FAST_S = 2.0

LLM_CASE: dict[str, Any] = {
    "title": "Outage",
    "goal": "Find why checkout is slow",
    "strategy": "hybrid",
    "inputs": {"region": "eu"},
}
INVOICE_CASE: dict[str, Any] = {
    "title": "Check INV-1042",
    "goal": "Verify invoice INV-1042 before it is paid",
    "inputs": {"invoice_id": "INV-1042"},
    "domain": "invoice",
    "strategy": "static",
}


def _client(user: Any | None = None) -> Client:
    if user is None:
        return Client()
    return Client(headers={"Authorization": f"Bearer {api_tokens.issue_api_token(user)}"})


def _analyst() -> Client:
    return _client(personas.analyst())


def _post_raw(client: Client, url: str, body: str | bytes) -> Any:
    started = time.monotonic()
    response = client.post(url, body, content_type="application/json")
    response.elapsed = time.monotonic() - started
    return response


def _body(base: dict[str, Any], **raw: str) -> str:
    """Return `base` as JSON text with the given fields replaced by raw JSON fragments."""
    text = json.dumps({key: value for key, value in base.items() if key not in raw})
    extra = ", ".join(f"{json.dumps(key)}: {fragment}" for key, fragment in raw.items())
    return text[:-1] + (", " + extra if extra else "") + "}"


def _assert_refused(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["message"], str) and body["message"]
    assert response.elapsed < FAST_S, response.elapsed
    return body


def _assert_nothing_written(cases: int, events: int) -> None:
    assert Case.objects.count() == cases
    assert AuditEvent.objects.filter(action="planning.case.submitted").count() == events


# Body size ------------------------------------------------------------------------------------


@pytest.mark.scenario("W10")
@pytest.mark.parametrize("megabytes", [3, 20])
@pytest.mark.parametrize("url", ["/api/cases", "/api/auth/token"])
def test_a_body_over_the_upload_limit_is_a_413_in_json(megabytes: int, url: str) -> None:
    client = _analyst()
    body = json.dumps({**LLM_CASE, "description": "x" * (megabytes * 1024 * 1024)})
    response = _post_raw(client, url, body)
    message = _assert_refused(response, 413)["message"]
    assert "too large" in message
    assert not Case.objects.exists()
    # The server stays responsive.
    assert client.get("/api/cases").status_code == 200


@pytest.mark.scenario("W10")
def test_a_large_body_without_a_token_is_refused_before_it_is_read() -> None:
    body = json.dumps({**LLM_CASE, "description": "x" * (3 * 1024 * 1024)})
    _assert_refused(_post_raw(Client(), "/api/cases", body), 401)


# Text that cannot be stored ----------------------------------------------------------------

BAD_TEXT = [
    pytest.param({"title": r'"Lone \udfff surrogate"'}, "title", id="surrogate in title"),
    pytest.param({"goal": r'"NUL \u0000 byte"'}, "goal", id="NUL in goal"),
    pytest.param({"description": r'"\ud800"'}, "description", id="surrogate in description"),
    pytest.param({"domain": r'"inv\u0000oice"'}, "domain", id="NUL in domain"),
    pytest.param({"inputs": r'{"region": "\udfff"}'}, "inputs.region", id="surrogate in input"),
    pytest.param({"inputs": r'{"region": "a\u0000"}'}, "inputs.region", id="NUL in input"),
    pytest.param({"inputs": r'{"a": [{"b": "\udc00"}]}'}, "inputs.a.0.b", id="nested input"),
    pytest.param({"inputs": r'{"bad\udfffkey": 1}'}, "inputs", id="surrogate in input key"),
    pytest.param({"inputs": r'{"bad\u0000key": 1}'}, "inputs", id="NUL in input key"),
]


@pytest.mark.scenario("W10")
@pytest.mark.parametrize(("raw", "field"), BAD_TEXT)
def test_text_with_nul_bytes_or_lone_surrogates_is_a_422_naming_the_field(
    raw: dict[str, str], field: str
) -> None:
    client = _analyst()
    body = _assert_refused(_post_raw(client, "/api/cases", _body(LLM_CASE, **raw)), 422)
    assert field in body["fields"], body
    assert all(body["fields"][field])
    _assert_nothing_written(0, 0)


@pytest.mark.scenario("W10")
@pytest.mark.parametrize(
    "raw",
    [r'{"username": "ana\u0000", "password": "x"}', r'{"username": "ana", "password": "\udfff"}'],
    ids=["NUL in username", "surrogate in password"],
)
def test_token_credentials_with_unstorable_text_are_a_422(raw: str) -> None:
    personas.analyst()
    body = _assert_refused(_post_raw(Client(), "/api/auth/token", raw), 422)
    assert set(body["fields"]) <= {"username", "password"}
    assert body["fields"]


@pytest.mark.scenario("W10")
def test_a_nul_byte_in_a_query_parameter_is_a_422_naming_it() -> None:
    response = _client(personas.officer()).get("/api/cases?domain=inv%00oice")
    assert response.status_code == 422
    assert list(response.json()["fields"]) == ["domain"]


def test_the_schema_says_which_text_is_refused_in_the_username_and_every_string() -> None:
    schema = _analyst().get("/api/openapi.json").json()
    ref = schema["paths"]["/api/auth/token"]["post"]["requestBody"]["content"]["application/json"]
    token_in = schema["components"]["schemas"][ref["schema"]["$ref"].rsplit("/", 1)[-1]]
    for name in ("username", "password"):
        pattern = re.compile(token_in["properties"][name]["pattern"])
        assert pattern.search("ana") and pattern.search("ünïcode ✓")
        assert not pattern.search("ana\x00") and not pattern.search("ana\udfff"), name
    strings = [
        node
        for node in _schema_nodes(schema)
        if node.get("type") == "string" and "format" not in node and "enum" not in node
    ]
    assert len(strings) > 20 and all(node.get("pattern") == TEXT_PATTERN for node in strings)
    cases = schema["paths"]["/api/cases"]
    assert "NUL" in cases["post"]["responses"]["422"]["description"]
    assert "NUL" in cases["get"]["responses"]["422"]["description"]


def _schema_nodes(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for child in node.values():
            yield from _schema_nodes(child)
    elif isinstance(node, list):
        for child in node:
            yield from _schema_nodes(child)


# Long query strings ---------------------------------------------------------------------------

LIST_URLS = ["/api/cases", "/api/gates", "/api/work-items", "/api/auth/tokens"]


@pytest.mark.scenario("W10")
@pytest.mark.parametrize("url", LIST_URLS)
def test_an_over_long_query_string_is_a_414_in_json_and_one_at_the_limit_answers(
    url: str,
) -> None:
    client = _client(personas.officer())
    at_limit = "status=" + "x" * (QUERY_MAX_LENGTH - len("status="))
    assert client.get(f"{url}?{at_limit}").status_code in {200, 422}
    body = _assert_refused(_timed_get(client, f"{url}?{at_limit}y"), 414)
    assert body["message"] == f"The query string is longer than {QUERY_MAX_LENGTH:,} characters."


def test_a_long_query_string_is_refused_before_the_token_is_checked() -> None:
    _assert_refused(_timed_get(Client(), "/api/cases?q=" + "x" * QUERY_MAX_LENGTH), 414)


def _timed_get(client: Client, url: str) -> Any:
    started = time.monotonic()
    response = client.get(url)
    response.elapsed = time.monotonic() - started
    return response


# Numbers ------------------------------------------------------------------------------------


@pytest.mark.scenario("W10")
@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
@pytest.mark.parametrize("base", [LLM_CASE, INVOICE_CASE], ids=["no domain", "invoice"])
def test_non_finite_numbers_in_inputs_are_a_422_naming_the_field(
    number: str, base: dict[str, Any]
) -> None:
    inputs = json.dumps(base["inputs"])[:-1] + f', "amount": [1, {number}]}}'
    raw = _body(base, inputs=inputs)
    body = _assert_refused(_post_raw(_analyst(), "/api/cases", raw), 422)
    assert "inputs.amount.1" in body["fields"], body
    assert "finite" in body["fields"]["inputs.amount.1"][0]
    _assert_nothing_written(0, 0)


@pytest.mark.scenario("W10")
@pytest.mark.parametrize(
    "value", ["true", "false", '"2"', "2.0", "2.5", "NaN", "null", "[2]", "1e400"]
)
def test_max_depth_must_be_a_json_integer(value: str) -> None:
    body = _assert_refused(
        _post_raw(_analyst(), "/api/cases", _body(LLM_CASE, max_depth=value)), 422
    )
    assert list(body["fields"]) == ["max_depth"], body
    _assert_nothing_written(0, 0)


@pytest.mark.scenario("W10")
@pytest.mark.parametrize("url", ["/api/cases", "/api/agents"])
@pytest.mark.parametrize(
    ("query", "field"),
    [
        (f"offset={2**63}", "offset"),
        (f"offset={2**64}", "offset"),
        (f"offset={10**40}", "offset"),
        ("offset=-1", "offset"),
        ("offset=1e3", "offset"),
        ("limit=0", "limit"),
        (f"limit={10**30}", "limit"),
        ("limit=201", "limit"),
        ("limit=true", "limit"),
    ],
)
def test_absurd_limits_and_offsets_are_a_422_naming_them(url: str, query: str, field: str) -> None:
    client = _client(personas.officer())
    started = time.monotonic()
    response = client.get(f"{url}?{query}")
    response.elapsed = time.monotonic() - started
    body = _assert_refused(response, 422)
    assert list(body["fields"]) == [field], body


def test_the_largest_page_and_offset_still_answer() -> None:
    client = _client(personas.officer())
    body = client.get("/api/cases?limit=200&offset=2147483647").json()
    assert body == {"items": [], "count": 0}


# Mass assignment ------------------------------------------------------------------------------


@pytest.mark.scenario("W8")
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("status", "approved"),
        ("submitter", "olivia"),
        ("risk", "low"),
        ("id", 1),
        ("current_version", 1),
        ("created_at", "2020-01-01T00:00:00Z"),
        ("error", ""),
    ],
)
def test_fields_the_server_owns_are_refused_by_name_and_nothing_changes(
    field: str, value: Any
) -> None:
    client = _analyst()
    personas.officer()
    events = AuditEvent.objects.count()
    response = client.post(
        "/api/cases", {**LLM_CASE, field: value}, content_type="application/json"
    )
    assert response.status_code == 422
    assert list(response.json()["fields"]) == [field]
    assert not Case.objects.exists()
    assert AuditEvent.objects.count() == events


@pytest.mark.scenario("W8")
def test_an_extra_field_on_the_token_request_is_refused() -> None:
    personas.analyst()
    response = Client().post(
        "/api/auth/token",
        {"username": "ana", "password": personas.PASSWORD, "is_superuser": True},
        content_type="application/json",
    )
    assert response.status_code == 422
    assert list(response.json()["fields"]) == ["is_superuser"]


# Shape: nesting and size ----------------------------------------------------------------------


@pytest.mark.scenario("W10")
@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("[" * 10_000 + "]" * 10_000, id="10k nested arrays as the body"),
        pytest.param('{"a":' * 10_000 + "1" + "}" * 10_000, id="10k nested objects as the body"),
        pytest.param(
            _body(LLM_CASE, inputs='{"a": ' + "[" * 10_000 + "]" * 10_000 + "}"),
            id="10k nested arrays in inputs",
        ),
        pytest.param(
            _body(INVOICE_CASE, inputs='{"a": ' + "[" * 900 + "]" * 900 + "}"),
            id="900 nested arrays in pack inputs",
        ),
        pytest.param("[" + ",".join(["0"] * 100_000) + "]", id="100k-item list as the body"),
        pytest.param(
            _body(LLM_CASE, inputs='{"a": [' + ",".join(["0"] * 100_000) + "]}"),
            id="100k-item list in inputs",
        ),
        pytest.param(
            _body(
                INVOICE_CASE,
                inputs='{"invoice_id": "INV-1", "x": [' + ",".join(['"a"'] * 100_000) + "]}",
            ),
            id="100k-item list in pack inputs",
        ),
    ],
)
def test_deep_or_huge_json_is_refused_fast(raw: str) -> None:
    client = _analyst()
    response = _post_raw(client, "/api/cases", raw)
    assert 400 <= response.status_code < 500
    _assert_refused(response, response.status_code)
    _assert_nothing_written(0, 0)
    assert client.get("/api/cases").status_code == 200


DOMAINLESS_BOUNDS = [
    pytest.param(
        '{"a": ' + '{"b": ' * rules.INPUTS_MAX_NESTING + "1" + "}" * rules.INPUTS_MAX_NESTING + "}",
        "inputs.a" + ".b" * rules.INPUTS_MAX_NESTING,
        id="nested too deep",
    ),
    pytest.param(
        json.dumps({"k" * (rules.INPUTS_MAX_KEY_LENGTH + 1): 1}), "inputs", id="key too long"
    ),
    pytest.param(
        json.dumps({"a": list(range(rules.INPUTS_MAX_ITEMS))}), "inputs", id="too many values"
    ),
    pytest.param(
        json.dumps({"a": "x" * rules.INPUTS_MAX_CHARS}), "inputs", id="too many characters"
    ),
]


@pytest.mark.scenario("W10")
@pytest.mark.parametrize(("inputs", "field"), DOMAINLESS_BOUNDS)
def test_domainless_inputs_over_their_bounds_are_a_422_with_the_field_path(
    inputs: str, field: str
) -> None:
    body = _assert_refused(_post_raw(_analyst(), "/api/cases", _body(LLM_CASE, inputs=inputs)), 422)
    assert field in body["fields"], body
    _assert_nothing_written(0, 0)


def test_domainless_inputs_at_their_bounds_are_accepted(
    django_capture_on_commit_callbacks: Any, settings: Any
) -> None:
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"  # configured; nothing is planned here
    nested: Any = 1
    for _ in range(rules.INPUTS_MAX_NESTING - 1):
        nested = {"b": nested}
    inputs = {"k" * rules.INPUTS_MAX_KEY_LENGTH: nested}
    with django_capture_on_commit_callbacks(execute=False):
        response = _analyst().post(
            "/api/cases", {**LLM_CASE, "inputs": inputs}, content_type="application/json"
        )
    assert response.status_code == 201, response.json()


@pytest.mark.scenario("W10")
@pytest.mark.parametrize(
    "raw",
    ["{not json", "", "null", '"a string"', "[1, 2]", "\xff\xfe", '{"title": "x"} trailing'],
    ids=["broken", "empty", "null", "string", "array", "not utf-8", "trailing data"],
)
def test_bodies_that_are_not_a_json_object_are_refused_in_json(raw: str) -> None:
    response = _post_raw(_analyst(), "/api/cases", raw.encode("latin-1"))
    assert response.status_code in {400, 422}
    _assert_refused(response, response.status_code)
    _assert_nothing_written(0, 0)


# Unexpected errors ----------------------------------------------------------------------------


@pytest.mark.scenario("W9")
def test_an_unexpected_error_is_a_generic_500_with_an_error_id_that_is_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from planning import api

    def broken(user: Any) -> Any:
        raise RuntimeError("secret detail: database on fire")

    monkeypatch.setattr(api, "visible_cases", broken)
    with caplog.at_level(logging.ERROR):
        response = _client(personas.officer()).get("/api/cases")
    assert response.status_code == 500
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"message", "error_id"}
    error_id = body["error_id"]
    assert len(error_id) >= 8
    assert error_id in body["message"]
    assert "secret detail" not in response.content.decode()
    assert "Traceback" not in response.content.decode()
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert logged, [r.getMessage() for r in caplog.records]
    assert logged[0].exc_info is not None
    assert "secret detail" in str(logged[0].exc_info[1])
    # Two failures get two ids.
    with caplog.at_level(logging.ERROR):
        again = _client(personas.officer("olga")).get("/api/cases").json()["error_id"]
    assert again != error_id


# The OpenAPI document -------------------------------------------------------------------------


def test_every_operation_documents_its_refusals() -> None:
    schema = _analyst().get("/api/openapi.json").json()
    operations = [
        (path, method, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
    ]
    assert len(operations) >= 6
    for path, method, operation in operations:
        codes = set(operation["responses"])
        where = f"{method.upper()} {path}"
        assert "500" in codes, where
        if "requestBody" in operation:
            assert {"400", "413", "422"} <= codes, where
        if operation.get("parameters"):
            assert "422" in codes, where
        if operation.get("security"):
            assert "401" in codes, where
        assert "414" in codes, where
    paths = schema["paths"]
    assert "413" in paths["/api/cases"]["post"]["responses"]
    assert "413" not in paths["/api/cases"]["get"]["responses"]
    limit = next(p for p in paths["/api/cases"]["get"]["parameters"] if p["name"] == "limit")
    assert limit["schema"]["maximum"] == 200
    body_ref = paths["/api/cases"]["post"]["requestBody"]["content"]["application/json"]
    case_in = schema["components"]["schemas"][body_ref["schema"]["$ref"].rsplit("/", 1)[-1]]
    assert case_in["additionalProperties"] is False
    assert case_in["properties"]["max_depth"]["maximum"] == rules.MAX_DEPTH_LIMIT
    assert case_in["properties"]["title"]["maxLength"] == rules.TITLE_MAX_LENGTH


@pytest.mark.scenario("W9")
def test_an_error_outside_an_operation_is_a_json_500_with_an_error_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from casehub.api import api

    def broken(**kwargs: Any) -> Any:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(api, "get_openapi_schema", broken)
    response = _analyst().get("/api/openapi.json")
    assert response.status_code == 500
    body = response.json()
    assert set(body) == {"message", "error_id"}
    assert "secret detail" not in response.content.decode()
