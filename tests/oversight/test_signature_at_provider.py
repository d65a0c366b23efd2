"""An e-signature by a user whose password sign-in is off: a fresh sign-in at the identity
provider (prompt=login, max_age=0) whose auth_time and sub the callback checks, against the real
test provider on loopback."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from accounts import oidc_mappings
from accounts.roles import OFFICER
from audit.models import AuditEvent
from oversight.models import GateDecision
from tests import personas
from tests.oidc_provider.provider import sign_in_at_provider
from tests.oversight.test_gate_pages import approve, hold_gate, invoice_case

pytestmark = pytest.mark.django_db


def _follow(client: Client, callback: str) -> Any:
    parts = urlsplit(callback)
    return client.get(f"{parts.path}?{parts.query}")


def _officer_through_provider(oidc: Any) -> tuple[Client, requests.Session, User]:
    proposal = oidc_mappings.map_group(personas.admin("adam"), "casehub-officers", OFFICER)
    oidc_mappings.approve_mapping(personas.admin("alma"), proposal)  # type: ignore[arg-type]
    oidc.user("fiona", ["casehub-officers"])
    client, browser = Client(), requests.Session()
    start = client.get(reverse("accounts:oidc-sign-in"))["Location"]
    _follow(client, sign_in_at_provider(start, "fiona", session=browser))
    return client, browser, User.objects.get(username="fiona")


def _reauthenticate(client: Client, gate_url: str) -> str:
    page = client.get(gate_url).content.decode()
    link = page.split("data-reauthenticate-link", 1)[0].rsplit('href="', 1)[1].split('"', 1)[0]
    answer = client.get(link.replace("&amp;", "&"))
    assert answer.status_code == 302
    return str(answer["Location"])


def test_a_signature_needs_a_fresh_sign_in_at_the_provider(oidc: Any, analyst: Any) -> None:
    client, browser, fiona = _officer_through_provider(oidc)
    gate = hold_gate(invoice_case(analyst))
    gate_url = reverse("oversight:gate-detail", args=[gate.pk])
    refused = approve(client, gate, password=personas.PASSWORD)
    assert refused.status_code == 403
    assert "sign in again at the identity provider" in refused.content.decode()
    authorize = _reauthenticate(client, gate_url)
    query = parse_qs(urlsplit(authorize).query)
    assert query["prompt"] == ["login"] and query["max_age"] == ["0"]
    # The provider asks for the password although its session is alive (prompt=login).
    callback = sign_in_at_provider(authorize, "fiona", session=browser)
    back = _follow(client, callback)
    assert back.status_code == 302 and back["Location"] == gate_url
    assert "You signed in again at Test IdP" in client.get(gate_url).content.decode()
    assert approve(client, gate).status_code == 302
    decision = GateDecision.objects.get(gate=gate)
    assert decision.is_signed and decision.decider == fiona
    event = AuditEvent.objects.get(action="oversight.gate.decided")
    assert event.data["signature"]["reauthenticated_at"]
    reauth = AuditEvent.objects.filter(action="auth.oidc.signed_in").last()
    assert reauth is not None and reauth.data["reauthentication"] is True
    # One fresh sign-in, one signature.
    assert "data-reauthenticated" not in client.get(gate_url).content.decode()


def test_a_provider_answer_without_a_fresh_auth_time_signs_nothing(oidc: Any, analyst: Any) -> None:
    client, browser, _ = _officer_through_provider(oidc)
    gate = hold_gate(invoice_case(analyst))
    authorize = _reauthenticate(client, reverse("oversight:gate-detail", args=[gate.pk]))
    oidc.quirks(auth_age=3600)
    back = _follow(client, sign_in_at_provider(authorize, "fiona", session=browser))
    assert back["Location"] == "/login/"
    refusal = AuditEvent.objects.get(action="auth.oidc.refused")
    assert refusal.data["reason"] == "reauthentication_not_fresh"
    assert approve(client, gate).status_code == 403
    assert not GateDecision.objects.exists()


def test_a_fresh_sign_in_as_someone_else_signs_nothing(oidc: Any, analyst: Any) -> None:
    client, _, _ = _officer_through_provider(oidc)
    oidc.user("gina", ["casehub-officers"])
    gate = hold_gate(invoice_case(analyst))
    authorize = _reauthenticate(client, reverse("oversight:gate-detail", args=[gate.pk]))
    back = _follow(client, sign_in_at_provider(authorize, "gina", session=requests.Session()))
    assert back["Location"] == "/login/"
    refusal = AuditEvent.objects.get(action="auth.oidc.refused")
    assert refusal.data["reason"] == "reauthentication_by_another_user"
    assert approve(client, gate).status_code == 403
    assert not GateDecision.objects.exists()
    assert not User.objects.filter(username="gina").exists()
