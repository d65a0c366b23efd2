"""Another user's objects by id are 404, like objects that do not exist, and audited (W4).

Bob, a second analyst, asks for the case, step, gates, versions, plan, trail and token of Ana's
case by id, through the pages and the API. Each answer is the 404 a missing id gets (the same
body: nothing tells "not yours" from "no such thing"), each attempt counts as an access denial,
and an id scan stays one audit event a minute plus one summary.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client

from accounts import tokens as api_tokens
from accounts.denials import DENIED, SUMMARY, flush_denials
from accounts.models import AccessDenial, ApiToken
from audit.chain import SYSTEM_CHAIN
from audit.models import AuditEvent
from oversight.models import Gate, GateDecision, GateKind, Notification
from planning.models import PlanNode
from tests import personas
from tests.cases import planned_invoice_case

pytestmark = [pytest.mark.django_db, pytest.mark.scenario("W4")]

MISSING = 987654
# The masked CSRF token and the CSP nonce differ on every page: no part of what a 404 says.
VARYING = re.compile(rb'("x-csrftoken": "|name="csrfmiddlewaretoken" value="|nonce=")[^"]+')

# (how the URL is asked for, the path with {case}, {node}, {gate} or {token})
OBJECT_ROUTES = [
    ("GET", "/cases/{case}/"),
    ("GET", "/cases/{case}/nodes/{node}/"),
    ("GET", "/cases/{case}/gates/"),
    ("GET", "/cases/{case}/versions/"),
    ("GET", "/cases/{case}/versions/diff/"),
    ("GET", "/cases/{case}/nodes/{node}/edit/"),
    ("GET", "/gates/{gate}/"),
    ("POST", "/gates/{gate}/decide"),
    ("POST", "/account/tokens/{token}/revoke"),
    ("GET", "/api/cases/{case}"),
    ("GET", "/api/cases/{case}/plan"),
    ("GET", "/api/cases/{case}/plan/diff"),
    ("GET", "/api/cases/{case}/audit"),
    ("POST", "/api/cases/{case}/plan/edits"),
    ("GET", "/api/gates/{gate}"),
    ("POST", "/api/gates/{gate}/decision"),
    ("DELETE", "/api/auth/tokens/{token}"),
]


@pytest.fixture
def anas_case(db: None) -> Any:
    return planned_invoice_case(personas.analyst("ana"))


def _ids(case: Any, missing: bool = False) -> dict[str, int]:
    if missing:
        return {"case": MISSING, "node": MISSING, "gate": MISSING, "token": MISSING}
    node = PlanNode.objects.filter(version=case.current_version, kind="leaf").first()
    gate = Gate.objects.get(case=case, kind=GateKind.PLAN)
    api_tokens.issue_api_token(case.submitter)
    token = ApiToken.objects.filter(user=case.submitter).first()
    assert node is not None and token is not None
    return {"case": case.pk, "node": node.pk, "gate": gate.pk, "token": token.pk}


def _as_bob(path: str) -> Client:
    bob = personas.analyst("bob")
    if path.startswith("/api/"):
        return Client(headers={"Authorization": f"Bearer {api_tokens.issue_api_token(bob)}"})
    client = Client()
    client.force_login(bob)
    return client


# A body the API would take from whoever may use the route: the refusal is for who asks.
API_BODIES = {
    "/plan/edits": {
        "node": "check-totals",
        "changes": {"task": "x"},
        "reason_code": "other",
        "reason": "x",
    },
    "/decision": {"decision": "approve"},
}


def _ask(client: Client, method: str, path: str) -> Any:
    if path.startswith("/api/") and method != "GET":
        body = next((b for end, b in API_BODIES.items() if path.endswith(end)), {})
        return client.generic(method, path, json.dumps(body), "application/json")
    return client.generic(method, path)


def _counted_as_denials(requests: int) -> list[AccessDenial]:
    """Assert that the requests were counted, with one event per counter row (one a minute)."""
    rows = list(AccessDenial.objects.order_by("minute"))
    assert sum(row.count for row in rows) == requests
    assert AuditEvent.objects.filter(chain=SYSTEM_CHAIN, action=DENIED).count() == len(rows)
    assert len(rows) in (1, 2)  # two when the requests straddle a minute
    return rows


def _said(response: Any, ids: dict[str, int]) -> bytes:
    body = VARYING.sub(rb"\1", response.content)
    if response["Content-Type"].startswith("application/json"):
        for value in ids.values():  # a JSON message may name the id it was asked for
            body = re.sub(rb"\b%d\b" % value, b"ID", body)
    return body


@pytest.mark.parametrize(("method", "template"), OBJECT_ROUTES)
def test_another_users_object_by_id_is_the_404_of_a_missing_one_and_audited(
    method: str, template: str, anas_case: Any
) -> None:
    theirs = _ids(anas_case)
    missing = _ids(anas_case, missing=True)
    path = template.format(**theirs)
    client = _as_bob(path)
    decisions = GateDecision.objects.count()

    response = _ask(client, method, path)
    absent = _ask(client, method, template.format(**missing))

    assert response.status_code == 404, response.content[:500]
    assert absent.status_code == 404
    assert _said(response, theirs) == _said(absent, missing), "the 404 tells theirs from none"
    assert GateDecision.objects.count() == decisions
    first, *_ = AuditEvent.objects.filter(chain=SYSTEM_CHAIN, action=DENIED).order_by("seq")
    assert (first.data["kind"], first.data["user"], first.data["path"]) == (
        "not_found",
        "bob",
        path,
    )
    _counted_as_denials(2)


def test_someone_elses_notification_is_404_and_stays_unread(anas_case: Any) -> None:
    olivia = personas.officer("olivia")
    notice = Notification.objects.create(user=olivia, kind="gate", message="A gate waits")
    bob = _as_bob("/notifications/")
    assert bob.post(f"/notifications/{notice.pk}/read").status_code == 404
    notice.refresh_from_db()
    assert notice.read_at is None
    _counted_as_denials(1)


@pytest.mark.parametrize("who", ["bob", "admin"])
def test_bulk_approval_of_a_gate_the_user_cannot_read_is_404_and_decides_nothing(
    who: str, anas_case: Any
) -> None:
    gate = Gate.objects.filter(case=anas_case, kind=GateKind.STEP).first()
    assert gate is not None
    user = personas.analyst("bob") if who == "bob" else personas.admin("adam")
    client = Client()
    client.force_login(user)
    response = client.post("/inbox/approve", {"gate": [gate.pk]})
    assert response.status_code == 404
    assert client.post("/inbox/approve", {"gate": [MISSING]}).status_code == 404
    assert not GateDecision.objects.exists()
    _counted_as_denials(2)


def test_an_analysts_export_is_refused_alike_for_their_case_anothers_and_none(
    anas_case: Any,
) -> None:
    # Exporting is the auditor's: the refusal comes before any lookup, so it says nothing of ids.
    bob = _as_bob("/audit/")
    answers = {
        bob.post(f"/audit/cases/{case_id}/export").status_code
        for case_id in (anas_case.pk, MISSING)
    }
    assert answers == {403}


def test_an_id_scan_stays_404_and_is_one_event_and_one_summary(anas_case: Any) -> None:
    bob = _as_bob("/cases/")
    scanned = [anas_case.pk, *range(anas_case.pk + 1, anas_case.pk + 30)]
    for case_id in scanned:
        assert bob.get(f"/cases/{case_id}/").status_code == 404
        assert (
            bob.get(f"/cases/{case_id}/gates/", headers={"HX-Request": "true"}).status_code == 404
        )

    rows = _counted_as_denials(2 * len(scanned))
    assert rows[-1].last_path == f"/cases/{scanned[-1]}/gates/"
    flush_denials(now=rows[-1].minute + timedelta(minutes=2))
    summaries = AuditEvent.objects.filter(chain=SYSTEM_CHAIN, action=SUMMARY)
    assert sum(summary.data["count"] for summary in summaries) == 2 * len(scanned)
    assert {summary.data["user"] for summary in summaries} == {"bob"}
