"""An officer whose account is disabled or whose role is revoked while signed in (O9)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from accounts import tokens as api_tokens
from accounts import users
from accounts.models import ApiToken
from audit.models import AuditEvent
from oversight.actions import gates
from oversight.actions.gates import DecisionInput
from oversight.models import Gate, GateDecision, GateKind
from tests import personas
from tests.cases import planned_invoice_case

pytestmark = pytest.mark.django_db


def _plan_gate() -> Gate:
    case = planned_invoice_case(personas.analyst())
    return Gate.objects.get(case=case, kind=GateKind.PLAN)


def _signed_in(user: Any) -> tuple[Client, Client]:
    browser = Client()
    browser.force_login(user)
    api = Client(headers={"Authorization": f"Bearer {api_tokens.issue_api_token(user)}"})
    return browser, api


def _decide(api: Client, gate: Gate) -> Any:
    return api.post(
        f"/api/gates/{gate.pk}/decision", {"decision": "approve"}, content_type="application/json"
    )


@pytest.mark.scenario("O9")
def test_a_disabled_officer_is_signed_out_and_their_tokens_die_on_the_next_request() -> None:
    gate = _plan_gate()
    officer = personas.officer()
    browser, api = _signed_in(officer)
    assert browser.get(reverse("oversight:inbox")).status_code == 200
    users.deactivate_user(personas.admin(), officer)
    page = browser.get(reverse("oversight:inbox"))
    assert page.status_code == 302 and page["Location"].startswith(reverse("login"))
    assert _decide(api, gate).status_code == 401
    assert not ApiToken.objects.filter(user=officer).exists()
    assert AuditEvent.objects.filter(action="auth.token.revoked", data__user=officer.username)
    assert AuditEvent.objects.filter(action="security.sessions.ended", data__user=officer.username)
    assert not GateDecision.objects.exists()


@pytest.mark.scenario("O9")
def test_an_officer_whose_role_is_revoked_decides_nothing_from_the_next_request_on() -> None:
    gate = _plan_gate()
    officer = personas.officer()
    browser, api = _signed_in(officer)
    users.set_roles(personas.admin(), officer, [])
    officer.refresh_from_db()
    assert _decide(api, gate).status_code == 401  # the token died with the role
    response = browser.post(
        reverse("oversight:gate-decide", args=[gate.pk]),
        {"decision": "approve", "detail_opened": "1"},
    )
    # The session died with the role: sent to sign in again, where no role waits.
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    with pytest.raises(gates.DecisionDenied):
        gates.decide_gate(gate_id=gate.pk, user=officer, decision=DecisionInput(decision="approve"))
    assert not GateDecision.objects.exists()
    revoked = AuditEvent.objects.get(action="auth.token.revoked")
    assert "compliance officer" in revoked.data["why"]
