"""Schemathesis fuzzes every operation of /api/openapi.json through the real WSGI stack.

Each operation gets schema-valid and schema-invalid requests, authenticated with a real token of
an analyst who has a planned case. No answer may be a 500, and every answer must be documented:
its status code, its content type and its body. Generation is derandomized so that CI sees the
same requests on every run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from ninja.responses import NinjaJSONEncoder
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from accounts import tokens as api_tokens
from casehub.api import api
from planning import actions
from planning.models import CaseStatus
from tests import personas

pytestmark = pytest.mark.django_db

EXAMPLES_PER_OPERATION = 40
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES_PER_OPERATION,
    derandomize=True,
    database=None,
    deadline=None,
    # The fixtures are set up once per operation on purpose: one analyst, one token, one plan.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


# Loaded at collection so that each operation is a test of its own: straight from the API object,
# since /api/openapi.json wants a signed-in caller and there is no database yet to sign one in.
SCHEMA = schemathesis.openapi.from_dict(
    json.loads(json.dumps(api.get_openapi_schema(), cls=NinjaJSONEncoder))
)
SCHEMA.app = WSGIHandler()
SCHEMA.location = "/api/openapi.json"
SCHEMA.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    # The token is the test's own; a missing or broken one is tested in tests/planning/test_api.py.
    with_security_parameters=False,
    # Unknown query parameters are ignored by design (cache busters, tracking parameters); the
    # unknown body fields that must be refused are tested in test_api_input.py.
    allow_extra_parameters=False,
)
# A query string the fuzzer makes longer than the API reads is refused with the documented 414.
SCHEMA.config.checks.negative_data_rejection.expected_statuses = [
    *SCHEMA.config.checks.negative_data_rejection.expected_statuses,
    "414",
]
OPERATIONS = sorted(result.ok().label for result in SCHEMA.get_all_operations())


@pytest.fixture
def wsgi_in_test_transaction() -> Iterator[None]:
    # A WSGI server closes "old" connections around each request; inside the test's transaction
    # that would drop it. Django's test client skips this the same way.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def analyst_with_a_plan(django_capture_on_commit_callbacks: Any) -> tuple[dict[str, str], int]:
    """Return the bearer header of an analyst (a real token) and the id of their planned case."""
    analyst = personas.analyst()
    with django_capture_on_commit_callbacks(execute=False):
        case = actions.submit_case(
            submitter=analyst,
            title="Check INV-1042",
            goal="Verify invoice INV-1042 before it is paid",
            inputs={"invoice_id": "INV-1042"},
            domain="invoice",
            strategy="static",
        )
    actions.materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    return {"Authorization": f"Bearer {api_tokens.issue_api_token(analyst)}"}, case.pk


def test_every_documented_operation_is_fuzzed() -> None:
    assert set(OPERATIONS) >= {
        "POST /api/auth/token",
        "GET /api/agents",
        "GET /api/cases",
        "POST /api/cases",
        "GET /api/cases/{case_id}",
        "GET /api/cases/{case_id}/plan",
    }


@pytest.mark.scenario("W10")
@SCHEMA.parametrize()
@FUZZ_SETTINGS
def test_generated_requests_get_documented_answers_and_never_a_500(
    case: schemathesis.Case,
    analyst_with_a_plan: tuple[dict[str, str], int],
    wsgi_in_test_transaction: None,
) -> None:
    # Phases: boundary values and type mutations of every parameter (coverage), then schema-valid
    # and schema-invalid requests drawn by Hypothesis (fuzzing).
    headers, _ = analyst_with_a_plan
    case.call_and_validate(headers=headers, checks=CHECKS)


@pytest.mark.parametrize("label", [label for label in OPERATIONS if "{case_id}" in label])
def test_a_real_case_and_its_plan_conform_to_their_schemas(
    label: str, analyst_with_a_plan: tuple[dict[str, str], int], wsgi_in_test_transaction: None
) -> None:
    # Random ids almost never exist: read the analyst's planned case through the same checks.
    headers, case_id = analyst_with_a_plan
    operation = SCHEMA.find_operation_by_label(label)
    assert operation is not None
    statuses: list[int] = []

    @settings(max_examples=5, derandomize=True, database=None, deadline=None)
    @given(case=operation.as_strategy(path_parameters={"case_id": case_id}))
    def read(case: schemathesis.Case) -> None:
        statuses.append(case.call_and_validate(headers=headers, checks=CHECKS).status_code)

    read()
    if label.startswith("POST "):
        # An analyst may not edit plans: refused (403), or invalid before that (422).
        assert statuses and set(statuses) <= {403, 422}, statuses
    elif label.endswith("/plan"):
        # A random ?version= names no version of the case: 404, else 200.
        assert 200 in statuses and set(statuses) <= {200, 404}, statuses
    elif label.endswith("/plan/diff"):
        # The case has one version: there is nothing before it to compare with.
        assert statuses and set(statuses) <= {200, 404}, statuses
    else:
        assert statuses and set(statuses) == {200}, statuses
