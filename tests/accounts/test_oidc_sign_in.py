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
    first = User.objects.filter(username="adam").first() or personas.admin("adam")
    second = User.objects.filter(username="alma").first() or personas.admin("alma")
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


def _refusals() -> list[str]:
    return [event.data["reason"] for event in _events("auth.oidc.refused")]


def _assert_refused(client: Client, answer: Any, reason: str) -> None:
    assert answer.status_code == 302 and answer["Location"] == "/login/"
    assert _refusals() == [reason]
    assert "_auth_user_id" not in client.session
    page = client.get("/login/")
    assert b"Sign-in through the identity provider failed" in page.content or reason in {
        "inactive_user"
    }
    assert not _events("auth.oidc.signed_in")


def test_a_changed_group_on_the_next_sign_in_removes_the_role_and_audits_it(oidc: Any) -> None:
    _map("casehub-officers", OFFICER)
    _map("casehub-analysts", ANALYST)
    oidc.user("gina", ["casehub-officers"])
    _sign_in(Client(), "gina")
    user = User.objects.get(username="gina")
    assert [g.name for g in user.groups.all()] == [OFFICER]
    oidc.user("gina", ["casehub-analysts"])
    answer = _sign_in(Client(), "gina")
    assert answer.status_code == 302 and answer["Location"] == "/"
    assert [g.name for g in user.groups.all()] == [ANALYST]
    (removed,) = _events("auth.oidc.role_removed")
    assert removed.data["role"] == OFFICER
    assert removed.data["claim_values"] == ["casehub-analysts"]
    assert removed.data["granted_from"] == ["casehub-officers"]
    assert removed.data["before"]["roles"] == [OFFICER]
    assert removed.data["after"]["roles"] == [ANALYST]
    assert [e.data["role"] for e in _events("auth.oidc.role_granted")] == [OFFICER, ANALYST]
    # The demoted user's earlier session ended with the role.
    assert _events("security.sessions.ended")


def test_a_role_an_admin_granted_stays_when_the_group_is_gone(oidc: Any) -> None:
    _map("casehub-analysts", ANALYST)
    oidc.user("hugo", ["casehub-analysts"])
    _sign_in(Client(), "hugo")
    user = User.objects.get(username="hugo")
    from django.contrib.auth.models import Group

    user.groups.add(Group.objects.get(name=OFFICER))  # granted outside the claim
    oidc.user("hugo", [])
    _sign_in(Client(), "hugo")
    assert [g.name for g in user.groups.all()] == [OFFICER]
    assert [e.data["role"] for e in _events("auth.oidc.role_removed")] == [ANALYST]


def test_a_missing_group_claim_signs_in_without_claimed_roles_and_says_so(oidc: Any) -> None:
    _map("casehub-officers", OFFICER)
    oidc.user("ines", ["casehub-officers"])
    _sign_in(Client(), "ines")
    oidc.quirks(drop_groups=True)
    client = Client()
    answer = _sign_in(client, "ines")
    assert answer.status_code == 302 and answer["Location"] == "/"
    user = User.objects.get(username="ines")
    assert list(user.groups.all()) == []
    last = _events("auth.oidc.signed_in")[-1]
    assert last.data["claim_missing"] is True and last.data["claim_values"] is None
    (removed,) = _events("auth.oidc.role_removed")
    assert removed.data["role"] == OFFICER and removed.data["claim_values"] is None
    assert OidcIdentity.objects.get(user=user).groups is None


def test_an_id_token_from_another_issuer_is_refused(oidc: Any) -> None:
    oidc.user("jon", [])
    oidc.quirks(issuer="http://127.0.0.1:1/elsewhere")
    client = Client()
    _assert_refused(client, _sign_in(client, "jon"), "wrong_issuer")
    assert not User.objects.filter(username="jon").exists()


def test_an_expired_id_token_is_refused(oidc: Any) -> None:
    oidc.user("kim", [])
    oidc.quirks(expires_in=-120)
    client = Client()
    _assert_refused(client, _sign_in(client, "kim"), "expired")
    assert not OidcIdentity.objects.exists()


def test_an_id_token_signed_by_another_key_is_refused(oidc: Any) -> None:
    oidc.user("lena", [])
    oidc.quirks(other_key=True)
    client = Client()
    _assert_refused(client, _sign_in(client, "lena"), "bad_signature")
    assert not OidcIdentity.objects.exists()


def test_a_replayed_id_token_is_refused(oidc: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from accounts.oidc import OidcBackend

    oidc.user("max", [])
    answers: list[dict[str, Any]] = []
    real_get_token = OidcBackend.get_token

    def recording(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = real_get_token(self, payload)
        answers.append(answer)
        return answer

    monkeypatch.setattr(OidcBackend, "get_token", recording)
    _sign_in(Client(), "max")
    assert len(_events("auth.oidc.signed_in")) == 1
    # The next sign-in runs for real up to the code exchange, whose answer is the old ID token.
    monkeypatch.setattr(OidcBackend, "get_token", lambda self, payload: answers[0])
    client = Client()
    answer = _sign_in(client, "max")
    assert answer.status_code == 302 and answer["Location"] == "/login/"
    assert _refusals() == ["replayed"]
    assert "_auth_user_id" not in client.session


def test_a_callback_with_another_state_is_refused(oidc: Any) -> None:
    oidc.user("nina", [])
    client = Client()
    callback = sign_in_at_provider(_start(client), "nina")
    parts = urlsplit(callback)
    query = parse_qs(parts.query)
    answer = client.get(parts.path, {"code": query["code"][0], "state": "forged-state"})
    _assert_refused(client, answer, "state_mismatch")
    # Another browser cannot use this browser's code and state either.
    stranger = Client()
    answer = stranger.get(f"{parts.path}?{parts.query}")
    assert answer.status_code == 302 and answer["Location"] == "/login/"
    assert _refusals() == ["state_mismatch", "state_mismatch"]


def test_a_forged_code_fails_at_the_token_exchange(oidc: Any) -> None:
    oidc.user("omar", [])
    client = Client()
    callback = sign_in_at_provider(_start(client), "omar")
    parts = urlsplit(callback)
    query = parse_qs(parts.query)
    answer = client.get(parts.path, {"code": "not-the-code", "state": query["state"][0]})
    _assert_refused(client, answer, "token_exchange_failed")


def test_a_deactivated_user_is_refused(oidc: Any) -> None:
    oidc.user("pia", [])
    _sign_in(Client(), "pia")
    User.objects.filter(username="pia").update(is_active=False)
    client = Client()
    answer = _sign_in(client, "pia")
    assert answer.status_code == 302 and answer["Location"] == "/login/"
    assert _refusals() == ["inactive_user"]
    assert _events("auth.oidc.refused")[0].data["sub"] == OidcIdentity.objects.get().sub
    assert b"deactivated" in client.get("/login/").content


def test_the_sign_in_page_offers_the_provider_only_when_configured(
    oidc: Any, settings: Any
) -> None:
    assert b"Sign in with Test IdP" in Client().get("/login/").content
    settings.CASEHUB_OIDC_ISSUER = ""
    assert b"Sign in with" not in Client().get("/login/").content
    assert Client().get("/oidc/sign-in/").status_code == 404
    assert Client().get("/oidc/callback/?code=x&state=y").status_code == 404


def test_sign_out_ends_the_session_at_the_provider(oidc: Any) -> None:
    import requests

    from tests.oidc_provider.provider import PASSWORD

    oidc.user("quinn", [])
    client = Client()
    browser = requests.Session()
    callback = sign_in_at_provider(_start(client), "quinn", PASSWORD, session=browser)
    parts = urlsplit(callback)
    client.get(f"{parts.path}?{parts.query}")
    id_token = client.session["oidc_id_token"]
    answer = client.post("/logout/")
    assert answer.status_code == 302
    location = urlsplit(answer["Location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == f"{oidc.issuer}/logout/"
    query = parse_qs(location.query)
    assert query["id_token_hint"] == [id_token]
    assert query["post_logout_redirect_uri"] == ["http://testserver/login/"]
    assert "_auth_user_id" not in client.session
    assert [e.action for e in AuditEvent.objects.filter(action="auth.logout")]
    # The provider ends its own session and sends the browser back to CaseHub's sign-in page.
    assert "provider_sessionid" in browser.cookies
    ended = browser.get(answer["Location"], allow_redirects=False, timeout=10)
    assert ended.status_code == 302 and ended.headers["Location"] == "http://testserver/login/"
    again = browser.get(_start(Client()), allow_redirects=False, timeout=10)
    assert "/accounts/login/" in again.headers["Location"]


def test_a_password_sign_out_stays_in_casehub(oidc: Any) -> None:
    user = personas.analyst()
    client = Client()
    client.force_login(user)
    answer = client.post("/logout/")
    assert answer.status_code == 302 and answer["Location"] == "/login/"


def test_an_id_token_for_another_client_is_refused(oidc: Any) -> None:
    oidc.user("rhea", [])
    oidc.quirks(audience="another-client")
    client = Client()
    _assert_refused(client, _sign_in(client, "rhea"), "wrong_audience")


def test_a_discovery_document_naming_another_issuer_stops_the_sign_in(
    oidc: Any, settings: Any
) -> None:
    # The same provider under another name: its document names http://127.0.0.1:<port>/o.
    settings.CASEHUB_OIDC_ISSUER = oidc.issuer.replace("127.0.0.1", "localhost")
    client = Client()
    answer = client.get("/oidc/sign-in/")
    assert answer.status_code == 302 and answer["Location"] == "/login/"
    assert b"cannot be reached" in client.get("/login/").content
    assert "oidc_states" not in client.session
