"""Sign-in through the identity provider against a real OpenID provider on loopback
(django-oauth-toolkit in its own process): the real redirect, sign-in at the provider, code
exchange with PKCE, ID-token signature, issuer, audience, expiry, nonce and state checks."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client

from accounts import oidc_mappings
from accounts.models import OidcIdentity, OidcRoleClaim, PasswordSignInOff
from accounts.roles import ANALYST, OFFICER
from audit.models import AuditEvent
from tests import personas
from tests.oidc_provider.provider import sign_in_at_provider

pytestmark = pytest.mark.django_db


def _start(client: Client, path: str = "/oidc/sign-in/") -> str:
    answer = client.get(path)
    assert answer.status_code == 302, answer
    return str(answer["Location"])


def _sign_in(client: Client, username: str) -> Any:
    """Sign in through the provider; return CaseHub's answer to the callback."""
    callback = sign_in_at_provider(_start(client), username)
    parts = urlsplit(callback)
    return client.get(f"{parts.path}?{parts.query}")


def _events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action).order_by("seq"))


def _map(group: str, role: str) -> None:
    first, second = personas.admin("adam"), personas.admin("alma")
    proposal = oidc_mappings.map_group(first, group, role)
    if role != ANALYST:
        oidc_mappings.approve_mapping(second, proposal)  # type: ignore[arg-type]


def test_the_authorization_request_uses_pkce_state_and_nonce(oidc: Any) -> None:
    query = parse_qs(urlsplit(_start(Client())).query)
    assert query["response_type"] == ["code"]
    assert query["code_challenge_method"] == ["S256"]
    assert query["state"] and query["nonce"] and query["code_challenge"]
    assert query["client_id"] == ["casehub-tests"]


def test_first_sign_in_creates_the_user_with_the_mapped_role_and_stores_sub(oidc: Any) -> None:
    _map("casehub-officers", OFFICER)
    oidc.user("fiona", ["casehub-officers", "staff"])
    client = Client()
    answer = _sign_in(client, "fiona")
    assert answer.status_code == 302 and answer["Location"] == "/"
    user = User.objects.get(username="fiona")
    assert [g.name for g in user.groups.all()] == [OFFICER]
    identity = OidcIdentity.objects.get(user=user)
    assert identity.issuer == oidc.issuer and identity.sub
    assert identity.groups == ["casehub-officers", "staff"]
    assert not user.has_usable_password()
    assert PasswordSignInOff.objects.filter(user=user).exists()
    assert client.get("/").status_code == 200
    (signed_in,) = _events("auth.oidc.signed_in")
    assert signed_in.data["sub"] == identity.sub and signed_in.data["created"] is True
    assert signed_in.data["claim_values"] == ["casehub-officers", "staff"]
    (granted,) = _events("auth.oidc.role_granted")
    assert granted.data["role"] == OFFICER
    assert granted.data["granted_from"] == ["casehub-officers"]
    assert granted.data["claim"] == "groups"
    assert OidcRoleClaim.objects.get(user=user).groups == ["casehub-officers"]
