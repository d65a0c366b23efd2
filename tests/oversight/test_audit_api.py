"""The audit API: a case's trail for its readers, export and verification for auditors only."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

import casehub_verify
from accounts import tokens as api_tokens
from audit import signing
from audit.chain import SYSTEM_CHAIN, append_event, case_chain
from audit.models import AuditEvent
from planning.models import Case, Strategy
from tests import personas
from tests.audit.test_export import tamper
from tests.casehub.test_api_schemathesis import (  # noqa: F401 (a fixture, used by name)
    CHECKS,
    SCHEMA,
    wsgi_in_test_transaction,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _key_dir(settings: Any, tmp_path: Path) -> None:
    settings.CASEHUB_SIGNING_KEY_DIR = tmp_path / "signing-keys"


def _client(user: Any) -> Client:
    return Client(headers={"Authorization": f"Bearer {api_tokens.issue_api_token(user)}"})


def _case(submitter: Any, events: int = 3) -> Case:
    case = Case.objects.create(
        title="A case", goal="Find out", strategy=Strategy.STATIC, domain="", submitter=submitter
    )
    for n in range(events):
        append_event("case.step", actor=submitter, chain=case_chain(case.pk), data={"n": n})
    return case


# The trail -----------------------------------------------------------------------------------


def test_the_submitter_and_an_auditor_read_the_case_trail_oldest_first() -> None:
    analyst = personas.analyst()
    case = _case(analyst)
    for reader in (analyst, personas.auditor()):
        response = _client(reader).get(f"/api/cases/{case.pk}/audit")
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["count"] == 3
        first = body["items"][0]
        stored = AuditEvent.objects.get(chain=case_chain(case.pk), seq=1)
        assert first == {
            "seq": 1,
            "time": first["time"],
            "actor_kind": "user",
            "actor": "ana",
            "action": "case.step",
            "data": {"n": 0},
            "prev_hash": casehub_verify.GENESIS_HASH,
            "hash": stored.hash,
        }
        assert [item["seq"] for item in body["items"]] == [1, 2, 3]


def test_the_trail_is_paginated() -> None:
    analyst = personas.analyst()
    case = _case(analyst, events=5)
    body = _client(analyst).get(f"/api/cases/{case.pk}/audit?limit=2&offset=2").json()
    assert (body["count"], [item["seq"] for item in body["items"]]) == (5, [3, 4])


def test_another_analyst_and_an_outsider_get_404_for_a_case_trail() -> None:
    case = _case(personas.analyst())
    for stranger in (personas.analyst("bea"), personas.outsider()):
        response = _client(stranger).get(f"/api/cases/{case.pk}/audit")
        assert response.status_code == 404
        assert "message" in response.json()
    assert _client(personas.auditor()).get("/api/cases/999999/audit").status_code == 404


# Export --------------------------------------------------------------------------------------


def test_an_auditor_downloads_a_bundle_that_verifies_and_the_export_is_audited() -> None:
    case = _case(personas.analyst(), events=4)
    auditor = personas.auditor()
    response = _client(auditor).get(f"/api/audit/export?case={case.pk}")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    assert f"casehub-case-{case.pk}-audit.zip" in response["Content-Disposition"]
    raw = b"".join(response.streaming_content)
    report = casehub_verify.verify_bundle(
        io.BytesIO(raw), trusted_keys=[signing.current_key().public_key]
    )
    assert (report.ok, report.events, report.authenticated) == (True, 4, True)
    exported = AuditEvent.objects.get(chain=SYSTEM_CHAIN, action="oversight.audit.exported")
    assert (exported.actor_label, exported.data["scope"]["case"]) == ("audrey", case.pk)


@pytest.mark.parametrize("make", [personas.analyst, personas.officer, personas.admin])
def test_only_auditors_export_and_verify(make: Any) -> None:
    user = make()
    case = _case(user if make is personas.analyst else personas.analyst("bea"))
    client = _client(user)
    for url in (f"/api/audit/export?case={case.pk}", f"/api/audit/verify?case={case.pk}"):
        response = client.get(url)
        assert response.status_code == 403, url
        assert "auditor" in response.json()["message"]
    assert not AuditEvent.objects.filter(action="oversight.audit.exported").exists()


def test_export_and_verify_of_an_unknown_case_are_404_and_a_bad_id_is_422() -> None:
    client = _client(personas.auditor())
    for path in ("/api/audit/export", "/api/audit/verify"):
        assert client.get(f"{path}?case=424242").status_code == 404
        assert client.get(f"{path}?case=abc").status_code == 422
        assert client.get(f"{path}?case={2**70}").status_code == 422
        assert client.get(path).status_code == 422


# Verification --------------------------------------------------------------------------------


def test_an_intact_case_chain_verifies() -> None:
    case = _case(personas.analyst(), events=5)
    response = _client(personas.auditor()).get(f"/api/audit/verify?case={case.pk}")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "events": 5, "problems": []}


@pytest.mark.scenario("A4")
def test_an_edited_event_makes_verification_fail_at_its_seq() -> None:
    case = _case(personas.analyst(), events=5)
    tamper(
        f"UPDATE {AuditEvent._meta.db_table} SET data = %s WHERE chain = %s AND seq = 2",  # noqa: S608
        ['{"n": "edited"}', case_chain(case.pk)],
    )
    body = _client(personas.auditor()).get(f"/api/audit/verify?case={case.pk}").json()
    assert (body["ok"], body["events"]) == (False, 5)
    assert [(p["seq"], p["problem"].split(":")[0]) for p in body["problems"]] == [(2, "changed")]


# The OpenAPI document ------------------------------------------------------------------------


@pytest.mark.usefixtures("wsgi_in_test_transaction")
@pytest.mark.parametrize("label", ["GET /api/audit/export", "GET /api/audit/verify"])
def test_an_auditors_export_and_verification_answer_as_documented(label: str) -> None:
    # The fuzzer signs in as an analyst, who gets 403 here: check the auditor's 200 as well.
    case = _case(personas.analyst())
    headers = {"Authorization": f"Bearer {api_tokens.issue_api_token(personas.auditor())}"}
    operation = SCHEMA.find_operation_by_label(label)
    assert operation is not None
    response = operation.Case(query={"case": case.pk}).call_and_validate(
        headers=headers, checks=CHECKS
    )
    assert response.status_code == 200


# Keys ----------------------------------------------------------------------------------------


@pytest.mark.scenario("A11")
def test_auditors_and_admins_see_the_key_in_use_and_the_retired_ones() -> None:
    old = signing.current_key()
    _, new = signing.rotate_signing_key()
    for user in (personas.auditor(), personas.admin()):
        response = _client(user).get("/api/audit/keys")
        assert response.status_code == 200
        assert response.json() == [
            {"key_id": new.key_id, "public_key": new.public_key.hex(), "current": True},
            {"key_id": old.key_id, "public_key": old.public_key.hex(), "current": False},
        ]
    for user in (personas.analyst(), personas.officer()):
        assert _client(user).get("/api/audit/keys").status_code == 403
