"""Sign-in through the identity provider in a real browser, against the real test provider on
loopback: CaseHub's button, the provider's login page, back to CaseHub with the mapped role, and
out again through the provider's end-session endpoint."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from accounts import oidc_mappings
from accounts.models import OidcIdentity
from accounts.roles import OFFICER
from audit.models import AuditEvent
from oversight.models import Gate, GateDecision, GateKind
from planning.catalogue import sync_packs
from tests import personas
from tests.browser.a11y import axe_violations, describe
from tests.cases import planned_invoice_case
from tests.oidc_provider.provider import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SHOTS = Path(os.environ.get("CASEHUB_OIDC_SHOTS", "/tmp"))


def _map_officers() -> None:
    proposal = oidc_mappings.map_group(personas.admin("adam"), "casehub-officers", OFFICER)
    oidc_mappings.approve_mapping(personas.admin("alma"), proposal)  # type: ignore[arg-type]


def _sign_in_at_provider(page: Any, oidc: Any, username: str) -> None:
    page.click("[data-oidc-sign-in]")
    page.wait_for_url(f"http://127.0.0.1:{oidc.port}/accounts/login/**")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("#provider-sign-in")


def test_an_officer_signs_in_through_the_provider_and_out_again(page: Any, oidc: Any) -> None:
    _map_officers()
    oidc.user("fiona", ["casehub-officers"])
    page.goto("/")
    assert "/login/" in page.url
    assert page.text_content("[data-oidc-sign-in]") == "Sign in with Test IdP"
    violations = axe_violations(page)
    assert violations == [], describe(violations)
    page.screenshot(path=str(SHOTS / "oidc-sign-in.png"), full_page=True)
    _sign_in_at_provider(page, oidc, "fiona")
    page.wait_for_selector('[data-landing="compliance officer"]')
    assert page.text_content(".role-badge") == OFFICER
    user = User.objects.get(username="fiona")
    assert OidcIdentity.objects.get(user=user).issuer == oidc.issuer
    assert AuditEvent.objects.filter(action="auth.oidc.role_granted", data__role=OFFICER).exists()
    # Out through the provider's end-session endpoint, back on CaseHub's sign-in page.
    page.click("text=Log out")
    page.wait_for_url("**/login/")
    assert page.url.startswith(page.evaluate("location.origin"))
    page.goto("/")
    assert "/login/" in page.url
    # The provider's session ended too: signing in again asks for the password there.
    page.click("[data-oidc-sign-in]")
    page.wait_for_url(f"http://127.0.0.1:{oidc.port}/accounts/login/**")


def test_a_refused_id_token_leaves_the_visitor_on_the_sign_in_page(page: Any, oidc: Any) -> None:
    oidc.user("kim", [])
    oidc.quirks(expires_in=-120)
    page.goto("/login/")
    _sign_in_at_provider(page, oidc, "kim")
    page.wait_for_selector("text=Sign-in through the identity provider failed")
    assert "/login/" in page.url
    assert not User.objects.filter(username="kim").exists()


def test_admins_map_groups_to_roles_in_the_admin(page: Any, oidc: Any) -> None:
    admin = personas.admin("adam")
    oidc_mappings.map_group(admin, "casehub-analysts", "analyst")
    oidc_mappings.map_group(personas.admin("alma"), "casehub-auditors", "auditor")
    page.goto("/login/")
    page.fill("#id_username", "adam")
    page.fill("#id_password", personas.PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_selector('[data-landing="admin"]')
    page.goto("/admin/accounts/oidcgroupmapping/add/")
    page.fill("#id_group", "casehub-officers")
    page.select_option("#id_role", OFFICER)
    page.click("input[name=_save]")
    page.wait_for_selector("text=waits for a second admin")
    page.screenshot(path=str(SHOTS / "oidc-mappings-admin.png"), full_page=True)
    page.goto("/admin/accounts/oidcmappingrequest/")
    page.screenshot(path=str(SHOTS / "oidc-mapping-proposals-admin.png"), full_page=True)
    # adam cannot approve his own proposal.
    page.check("input[name=_selected_action] >> nth=0")
    page.select_option("select[name=action]", "approve_selected")
    page.click("button[name=index]")
    page.wait_for_selector("text=cannot approve their own group mapping")


def test_an_officer_signs_a_step_with_a_fresh_sign_in_at_the_provider(page: Any, oidc: Any) -> None:
    sync_packs()
    _map_officers()
    oidc.user("fiona", ["casehub-officers"])
    case = planned_invoice_case(personas.analyst())
    hold = Gate.objects.get(case=case, kind=GateKind.STEP, node__key="place-hold")
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto("/login/")
    _sign_in_at_provider(page, oidc, "fiona")
    page.wait_for_selector('[data-landing="compliance officer"]')
    page.goto(f"/gates/{hold.pk}/")
    assert page.locator("#id_password").count() == 0
    page.click("[data-reauthenticate-link]")
    # prompt=login: the provider asks for the password although its session is alive.
    page.wait_for_url(f"http://127.0.0.1:{oidc.port}/accounts/login/**")
    page.fill("#id_username", "fiona")
    page.fill("#id_password", PASSWORD)
    page.click("#provider-sign-in")
    page.wait_for_url(f"**/gates/{hold.pk}/")
    page.wait_for_selector("[data-reauthenticated]")
    page.click("#step-detail summary")
    page.wait_for_selector("[data-approve]:not([disabled])")
    page.screenshot(path=str(SHOTS / "oidc-signature.png"), full_page=True)
    page.click("[data-approve]")
    page.wait_for_selector('.gate-page[data-status="approved"]')
    decision = GateDecision.objects.get(gate=hold)
    assert decision.is_signed and decision.decider.username == "fiona"
