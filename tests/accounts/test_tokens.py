"""API tokens: they expire, are listed and revoked by their owner, are few, and die with the
password, the account and the roles (RELIABILITY W6, O9)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts import tokens as api_tokens
from accounts import users
from accounts.models import ApiToken, PasswordResetRequest
from audit.models import AuditEvent
from tests import personas

pytestmark = pytest.mark.django_db

NEW_PASSWORD = "a-brand-new-passphrase-42"


def _user(user: Any) -> User:
    return cast(User, user)


def _api(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def _works(token: str) -> bool:
    status = _api(token).get("/api/auth/tokens").status_code
    assert status in (200, 401), status
    return status == 200


def _exchange(username: str, password: str = personas.PASSWORD) -> Any:
    return Client().post(
        "/api/auth/token",
        {"username": username, "password": password},
        content_type="application/json",
    )


@pytest.mark.scenario("W6")
def test_a_token_answers_with_its_expiry_and_dies_when_it_expires(settings: Any) -> None:
    settings.CASEHUB_API_TOKEN_TTL_HOURS = 2
    personas.analyst()
    response = _exchange("ana")
    assert response.status_code == 200
    token = response.json()["token"]
    stored = ApiToken.objects.get()
    assert response.json()["expires_at"].startswith(
        (stored.created_at + timedelta(hours=2)).isoformat()[:19]
    )
    assert _works(token)
    ApiToken.objects.filter(pk=stored.pk).update(
        created_at=timezone.now() - timedelta(hours=2, seconds=1)
    )
    assert not _works(token)


@pytest.mark.scenario("W6")
def test_the_owner_lists_their_live_tokens_without_secrets() -> None:
    ana = _user(personas.analyst())
    other = _user(personas.analyst("bea"))
    first = api_tokens.issue_api_token(ana)
    second = api_tokens.issue_api_token(ana)
    api_tokens.issue_api_token(other)
    response = _api(second).get("/api/auth/tokens")
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 2
    assert {item["id"] for item in body["items"]} == set(
        ApiToken.objects.filter(user=ana).values_list("pk", flat=True)
    )
    assert [item["current"] for item in body["items"]] == [True, False]  # newest first
    assert set(body["items"][0]) == {"id", "created_at", "last_used_at", "expires_at", "current"}
    assert first not in response.content.decode() and second not in response.content.decode()
    for item in body["items"]:
        assert all("hash" not in key for key in item)


@pytest.mark.scenario("W6")
def test_delete_revokes_the_presented_token_and_audits_it() -> None:
    ana = _user(personas.analyst())
    token = api_tokens.issue_api_token(ana)
    kept = api_tokens.issue_api_token(ana)
    response = _api(token).delete("/api/auth/token")
    assert response.status_code == 204
    assert not _works(token)
    assert _works(kept)
    event = AuditEvent.objects.filter(action="auth.token.revoked").get()
    assert event.actor_label == "ana" and event.data["tokens"] == 1


@pytest.mark.scenario("W6")
def test_a_token_is_revoked_by_id_but_only_by_its_owner() -> None:
    ana = _user(personas.analyst())
    bea = _user(personas.analyst("bea"))
    anas = api_tokens.issue_api_token(ana)
    beas = api_tokens.issue_api_token(bea)
    beas_id = ApiToken.objects.get(user=bea).pk
    assert _api(anas).delete(f"/api/auth/tokens/{beas_id}").status_code == 404
    assert _works(beas)
    assert _api(beas).delete(f"/api/auth/tokens/{beas_id}").status_code == 204
    assert not _works(beas)
    assert AuditEvent.objects.filter(action="auth.token.revoked", actor_label="bea").exists()


@pytest.mark.scenario("W6")
def test_a_sixth_token_revokes_the_oldest_and_says_so(settings: Any) -> None:
    settings.CASEHUB_API_TOKEN_MAX_PER_USER = 5
    ana = _user(personas.analyst())
    tokens = [api_tokens.issue_api_token(ana) for _ in range(6)]
    assert ApiToken.objects.filter(user=ana).count() == 5
    assert not _works(tokens[0])
    assert all(_works(token) for token in tokens[1:])
    event = AuditEvent.objects.get(action="auth.token.revoked")
    assert event.data["tokens"] == 1 and "oldest" in event.data["why"]


def test_an_expired_token_is_cleared_when_the_user_gets_a_new_one(settings: Any) -> None:
    ana = _user(personas.analyst())
    api_tokens.issue_api_token(ana)
    ApiToken.objects.update(created_at=timezone.now() - timedelta(days=365))
    api_tokens.issue_api_token(ana)
    assert ApiToken.objects.filter(user=ana).count() == 1
    assert AuditEvent.objects.filter(action="auth.token.expired", data__tokens=1).exists()


@pytest.mark.scenario("W6")
def test_tokens_die_when_the_user_changes_their_own_password() -> None:
    adam = _user(personas.admin())
    token = api_tokens.issue_api_token(adam)
    browser = Client()
    browser.force_login(adam)
    response = browser.post(
        reverse("admin:password_change"),
        {
            "old_password": personas.PASSWORD,
            "new_password1": NEW_PASSWORD,
            "new_password2": NEW_PASSWORD,
        },
    )
    assert response.status_code == 302
    assert not _works(token)
    assert AuditEvent.objects.filter(action="auth.token.revoked", data__user="adam").exists()


@pytest.mark.scenario("W6")
def test_tokens_die_when_an_admin_sets_a_new_password() -> None:
    ana = _user(personas.analyst())
    token = api_tokens.issue_api_token(ana)
    assert users.request_password_reset(_user(personas.admin()), ana, NEW_PASSWORD) is None
    assert not _works(token)
    revoked = AuditEvent.objects.get(action="auth.token.revoked")
    assert revoked.actor_label == "adam" and "password" in revoked.data["why"]


@pytest.mark.scenario("W6")
def test_tokens_die_when_a_second_admin_approves_a_password_reset() -> None:
    olivia = _user(personas.officer())
    token = api_tokens.issue_api_token(olivia)
    pending = users.request_password_reset(_user(personas.admin()), olivia, NEW_PASSWORD)
    assert isinstance(pending, PasswordResetRequest)
    assert _works(token), "a pending reset changes nothing yet"
    users.approve_password_reset(_user(personas.admin("alice")), pending)
    assert not _works(token)


@pytest.mark.scenario("O9")
def test_a_deactivated_and_reactivated_user_has_no_token_left() -> None:
    ana = _user(personas.analyst())
    adam = _user(personas.admin())
    token = api_tokens.issue_api_token(ana)
    users.deactivate_user(adam, ana)
    users.change_user(adam, ana, is_active=True)
    assert not _works(token)
    assert not ApiToken.objects.filter(user=ana).exists()


def test_logging_in_again_does_not_revive_a_revoked_token() -> None:
    ana = _user(personas.analyst())
    token = api_tokens.issue_api_token(ana)
    api_tokens.revoke_api_tokens(ana, actor=ana, why="test")
    assert _exchange("ana").status_code == 200
    assert not _works(token)
