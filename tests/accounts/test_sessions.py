"""Sessions: cookie flags, a new key at sign-in, logout and inactivity end them, log out
everywhere, and an admin's change of a user ends the user's sessions (RELIABILITY W6, O9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts import tokens as api_tokens
from accounts import users
from audit.models import AuditEvent
from tests import personas

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
COOKIE = django_settings.SESSION_COOKIE_NAME


def _user(user: Any) -> User:
    return cast(User, user)


def _signed_in_browser(username: str = "ana") -> Client:
    client = Client()
    response = client.post("/login/", {"username": username, "password": personas.PASSWORD})
    assert response.status_code == 302, response.content[:500]
    return client


def _with_cookie(key: str) -> Client:
    client = Client()
    client.cookies[COOKIE] = key
    return client


def _is_signed_in(client: Client) -> bool:
    response = client.get(reverse("accounts:account"))
    if response.status_code == 302:
        assert response["Location"].startswith(reverse("login"))
        return False
    assert response.status_code == 200
    return True


@pytest.mark.scenario("W6")
def test_production_cookies_are_secure_http_only_and_same_site(tmp_path: Path) -> None:
    # A fresh process with production's environment: no DEBUG, no demo mode, no test settings.
    env = {
        **{k: v for k, v in os.environ.items() if k not in {"DEBUG", "CASEHUB_DEMO"}},
        "SECRET_KEY": "k" * 50,
        "CASEHUB_VAR_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "casehub.settings",
    }
    env.pop("SECURE_COOKIES", None)
    names = [
        "SESSION_COOKIE_SECURE",
        "SESSION_COOKIE_HTTPONLY",
        "SESSION_COOKIE_SAMESITE",
        "CSRF_COOKIE_SECURE",
        "SESSION_COOKIE_AGE",
        "SESSION_SAVE_EVERY_REQUEST",
    ]
    code = (
        "import json; from django.conf import settings as s; "
        f"print(json.dumps({{n: getattr(s, n) for n in {names!r}}}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    conf = json.loads(result.stdout)
    assert conf == {
        "SESSION_COOKIE_SECURE": True,
        "SESSION_COOKIE_HTTPONLY": True,
        "SESSION_COOKIE_SAMESITE": "Lax",
        "CSRF_COOKIE_SECURE": True,
        "SESSION_COOKIE_AGE": 30 * 60,
        "SESSION_SAVE_EVERY_REQUEST": False,  # the idle middleware refreshes once a minute
    }


@pytest.mark.scenario("W6")
def test_the_session_cookie_is_sent_with_its_flags(settings: Any) -> None:
    settings.SESSION_COOKIE_SECURE = True
    personas.analyst()
    client = Client()
    client.post("/login/", {"username": "ana", "password": personas.PASSWORD})
    cookie = client.cookies[COOKIE]
    assert cookie["secure"] is True
    assert cookie["httponly"] is True
    assert cookie["samesite"] == "Lax"
    assert int(cookie["max-age"]) == settings.SESSION_COOKIE_AGE


@pytest.mark.scenario("W6")
def test_signing_in_gives_the_session_a_new_key_and_the_old_one_dies() -> None:
    personas.analyst()
    client = Client()
    session = client.session
    session["visited"] = True
    session.save()
    before = session.session_key
    assert before is not None
    client.post("/login/", {"username": "ana", "password": personas.PASSWORD})
    after = client.cookies[COOKIE].value
    assert after != before
    assert not Session.objects.filter(session_key=before).exists()
    assert _is_signed_in(client)


@pytest.mark.scenario("W6")
def test_logging_out_kills_the_session_and_its_old_cookie() -> None:
    personas.analyst()
    client = _signed_in_browser()
    stolen = client.cookies[COOKIE].value
    assert _is_signed_in(_with_cookie(stolen))
    assert client.post(reverse("logout")).status_code == 302
    assert not Session.objects.filter(session_key=stolen).exists()
    assert not _is_signed_in(_with_cookie(stolen))


@pytest.mark.scenario("W6")
def test_a_session_idle_past_the_timeout_is_dead_and_each_request_moves_it_on() -> None:
    personas.analyst()
    client = _signed_in_browser()
    key = client.cookies[COOKIE].value
    session = client.session
    session["_casehub_seen"] = int(time.time()) - 61  # last used over a minute ago
    session.save()
    soon = timezone.now() + timedelta(minutes=1)
    Session.objects.filter(session_key=key).update(expire_date=soon)
    assert _is_signed_in(client)
    moved = Session.objects.get(session_key=key).expire_date
    assert moved > soon + timedelta(minutes=10), "a request restarts the idle timeout"
    Session.objects.filter(session_key=key).update(expire_date=timezone.now() - timedelta(1))
    assert not _is_signed_in(client)


@pytest.mark.scenario("W6")
def test_requests_within_a_minute_refresh_the_session_once_then_again_after_it() -> None:
    from web.middleware import SESSION_REFRESH_S

    personas.analyst()
    client = _signed_in_browser()
    key = client.cookies[COOKIE].value
    assert _is_signed_in(client)
    first = Session.objects.get(session_key=key).expire_date
    assert _is_signed_in(client)
    assert Session.objects.get(session_key=key).expire_date == first, "no write within a minute"
    session = client.session
    session["_casehub_seen"] = int(time.time()) - SESSION_REFRESH_S
    session.save()
    Session.objects.filter(session_key=key).update(expire_date=timezone.now() + timedelta(1))
    assert _is_signed_in(client)
    assert Session.objects.get(session_key=key).expire_date < timezone.now() + timedelta(hours=1)


@pytest.mark.scenario("W6")
def test_log_out_everywhere_ends_other_sessions_and_tokens_but_not_this_one() -> None:
    ana = _user(personas.analyst())
    here = _signed_in_browser()
    elsewhere = _signed_in_browser()
    other_user = _signed_in_browser_of_bea()
    token = api_tokens.issue_api_token(ana)
    old_key = here.cookies[COOKIE].value
    page = here.get(reverse("accounts:account"))
    assert b"Log out everywhere" in page.content
    assert b"2 sessions" in page.content
    response = here.post(reverse("accounts:account-log-out-everywhere"))
    assert response.status_code == 302
    assert _is_signed_in(here)
    assert here.cookies[COOKIE].value != old_key, "this session gets a new key too"
    assert not _is_signed_in(_with_cookie(old_key))
    assert not _is_signed_in(elsewhere)
    assert _is_signed_in(other_user)
    assert _api_status(token) == 401
    event = AuditEvent.objects.get(action="security.sessions.ended")
    assert (event.actor_label, event.data["sessions"], event.data["tokens"]) == ("ana", 1, 1)
    assert AuditEvent.objects.filter(action="auth.token.revoked", data__user="ana").exists()


def _signed_in_browser_of_bea() -> Client:
    personas.analyst("bea")
    return _signed_in_browser("bea")


def _api_status(token: str) -> int:
    client = Client(headers={"Authorization": f"Bearer {token}"})
    return client.get("/api/auth/tokens").status_code


@pytest.mark.scenario("W6")
def test_the_account_page_lists_tokens_and_revokes_only_the_users_own() -> None:
    ana = _user(personas.analyst())
    bea = _user(personas.analyst("bea"))
    token = api_tokens.issue_api_token(ana)
    api_tokens.issue_api_token(bea)
    anas_id = ana.api_tokens.get().pk
    beas_id = bea.api_tokens.get().pk
    browser = _signed_in_browser()
    page = browser.get(reverse("accounts:account")).content.decode()
    assert f'data-token="{anas_id}"' in page and f'data-token="{beas_id}"' not in page
    assert token not in page
    assert browser.post(reverse("accounts:account-token-revoke", args=[beas_id])).status_code == 404
    assert bea.api_tokens.exists()
    assert browser.post(reverse("accounts:account-token-revoke", args=[anas_id])).status_code == 302
    assert _api_status(token) == 401
    assert AuditEvent.objects.filter(action="auth.token.revoked", actor_label="ana").exists()


@pytest.mark.scenario("W6")
def test_changing_ones_password_ends_the_other_sessions() -> None:
    personas.admin()
    here = _signed_in_browser("adam")
    elsewhere = _signed_in_browser("adam")
    here.post(
        reverse("admin:password_change"),
        {
            "old_password": personas.PASSWORD,
            "new_password1": "a-brand-new-passphrase-42",
            "new_password2": "a-brand-new-passphrase-42",
        },
    )
    assert _is_signed_in(here)
    assert not _is_signed_in(elsewhere)


@pytest.mark.scenario("O9")
def test_a_deactivated_user_stays_signed_out_after_reactivation() -> None:
    ana = _user(personas.analyst())
    adam = _user(personas.admin())
    browser = _signed_in_browser()
    users.deactivate_user(adam, ana)
    assert not _is_signed_in(browser)
    users.change_user(adam, ana, is_active=True)
    assert not _is_signed_in(browser), "the old session does not come back"
    ended = AuditEvent.objects.get(action="security.sessions.ended")
    assert ended.actor_label == "adam" and ended.data["sessions"] == 1
    assert _is_signed_in(_signed_in_browser()), "signing in again works"


@pytest.mark.scenario("O9")
def test_removing_a_role_ends_the_users_sessions_at_once() -> None:
    olivia = _user(personas.officer())
    browser = _signed_in_browser("olivia")
    assert browser.get(reverse("oversight:inbox")).status_code == 200
    users.set_roles(_user(personas.admin()), olivia, [])
    response = browser.get(reverse("oversight:inbox"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    ended = AuditEvent.objects.get(action="security.sessions.ended")
    assert "compliance officer" in ended.data["why"]


@pytest.mark.scenario("O9")
def test_an_admin_set_password_ends_the_users_sessions() -> None:
    ana = _user(personas.analyst())
    browser = _signed_in_browser()
    users.request_password_reset(_user(personas.admin()), ana, "a-brand-new-passphrase-42")
    assert not _is_signed_in(browser)
