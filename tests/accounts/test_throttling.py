"""Sign-in throttling on /login/ and POST /api/auth/token (RELIABILITY W5).

Wrong passwords are counted per account and per client address (django-axes); past the limit
the next attempts get 429 with Retry-After before any password is checked, with one message
whatever the username. An unknown username runs the password hasher like a wrong password, so
the answer's timing tells nothing; that is checked by counting hasher calls, not by a clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.hashers import MD5PasswordHasher
from django.test import Client, RequestFactory

from accounts.models import ApiToken
from audit.models import AuditEvent
from tests import personas
from web.http import client_ip

pytestmark = pytest.mark.django_db

LIMIT = 5


@pytest.fixture(autouse=True)
def _small_limit(settings: Any) -> None:
    # axes reads its limit from its own setting; CASEHUB_LOGIN_FAILURE_LIMIT feeds it at start.
    settings.AXES_FAILURE_LIMIT = LIMIT


def _login(client: Client, username: str, password: str, **extra: Any) -> Any:
    return client.post("/login/", {"username": username, "password": password}, **extra)


def _token(client: Client, username: str, password: str, **extra: Any) -> Any:
    return client.post(
        "/api/auth/token",
        {"username": username, "password": password},
        content_type="application/json",
        **extra,
    )


def _signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.mark.scenario("W5")
def test_200_wrong_passwords_on_one_account_are_throttled_with_retry_after() -> None:
    personas.analyst()
    statuses = [_login(Client(), "ana", f"guess-{i}").status_code for i in range(200)]
    assert statuses[: LIMIT - 1] == [200] * (LIMIT - 1)  # the form again, with its error
    assert set(statuses[LIMIT - 1 :]) == {429}
    refused = _login(Client(), "ana", personas.PASSWORD)
    assert refused.status_code == 429, "even the right password waits out the lockout"
    assert 0 < int(refused["Retry-After"]) <= 15 * 60
    assert AuditEvent.objects.filter(action="security.login.throttled").count() == 1
    throttled = AuditEvent.objects.get(action="security.login.throttled")
    assert throttled.data["username"] == "ana" and throttled.data["failures"] == LIMIT


@pytest.mark.scenario("W5")
def test_wrong_passwords_across_accounts_from_one_address_are_throttled() -> None:
    for name in ("ana", "bea", "cid"):
        personas.analyst(name)
    client = Client()
    statuses = [
        _login(client, ("ana", "bea", "cid", f"nobody-{i}")[i % 4], "wrong").status_code
        for i in range(200)
    ]
    assert statuses.index(429) == LIMIT - 1
    assert set(statuses[LIMIT - 1 :]) == {429}
    other_address = _login(Client(REMOTE_ADDR="10.0.0.9"), "dan", "wrong")
    assert other_address.status_code == 200, "another address with an unknown name may try"


@pytest.mark.scenario("W5")
def test_the_api_throttles_in_json_with_retry_after_and_issues_no_token() -> None:
    personas.analyst()
    statuses = [_token(Client(), "ana", "wrong").status_code for _ in range(20)]
    assert statuses[: LIMIT - 1] == [401] * (LIMIT - 1)
    assert set(statuses[LIMIT - 1 :]) == {429}
    refused = _token(Client(), "ana", personas.PASSWORD)
    assert refused.status_code == 429
    assert refused["Content-Type"] == "application/json"
    assert refused.json()["message"].startswith("Too many failed sign-in attempts")
    assert int(refused["Retry-After"]) > 0
    assert not ApiToken.objects.exists()
    assert AuditEvent.objects.filter(action="security.login.throttled").count() == 1


@pytest.mark.scenario("W5")
def test_the_web_and_the_api_count_failures_together() -> None:
    personas.analyst()
    for _ in range(LIMIT - 1):
        _login(Client(), "ana", "wrong")
    assert _token(Client(), "ana", "wrong").status_code == 429


def _normalised(response: Any, username: str) -> str:
    # The page echoes the username typed and carries a fresh CSRF token and CSP nonce; nothing
    # else may differ.
    page = response.content.decode().replace(f'value="{username}"', 'value="NAME"')
    page = re.sub(r'nonce="[^"]+"', "NONCE", page)
    page = re.sub(r'"x-csrftoken": "[^"]+"', "CSRF", page)
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "CSRF", page)


@pytest.mark.scenario("W5")
def test_unknown_users_and_wrong_passwords_get_identical_answers() -> None:
    personas.analyst()
    unknown = _login(Client(REMOTE_ADDR="10.0.0.1"), "nobody", "wrong")
    wrong = _login(Client(REMOTE_ADDR="10.0.0.2"), "ana", "wrong")
    assert unknown.status_code == wrong.status_code == 200
    assert _normalised(unknown, "nobody") == _normalised(wrong, "ana")
    assert "match. Please try again" in unknown.content.decode()
    api_unknown = _token(Client(REMOTE_ADDR="10.0.0.3"), "nobody", "wrong")
    api_wrong = _token(Client(REMOTE_ADDR="10.0.0.4"), "ana", "wrong")
    assert (api_unknown.status_code, api_unknown.json()) == (
        api_wrong.status_code,
        api_wrong.json(),
    )


@pytest.mark.scenario("W5")
def test_a_locked_out_unknown_user_and_a_locked_out_real_one_read_the_same() -> None:
    personas.analyst()
    for name, address in (("nobody", "10.0.1.1"), ("ana", "10.0.2.1")):
        for i in range(LIMIT):
            _token(Client(REMOTE_ADDR=f"{address[:-1]}{i + 1}"), name, "wrong")
    unknown = _token(Client(REMOTE_ADDR="10.0.3.1"), "nobody", "wrong")
    real = _token(Client(REMOTE_ADDR="10.0.4.1"), "ana", "wrong")
    assert unknown.status_code == real.status_code == 429, "locked per account, any address"
    assert unknown.json() == real.json()


@pytest.fixture
def hasher_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    calls: list[str] = []
    encode = MD5PasswordHasher.encode

    def spy(self: MD5PasswordHasher, password: str, salt: str) -> str:
        calls.append(password)
        return encode(self, password, salt)

    monkeypatch.setattr(MD5PasswordHasher, "encode", spy)
    yield calls


@pytest.mark.scenario("W5")
def test_an_unknown_username_runs_the_password_hasher_like_a_wrong_password(
    hasher_calls: list[str],
) -> None:
    personas.analyst()
    personas.make_user("ida", None).__class__.objects.filter(username="ida").update(is_active=False)
    counts = {}
    for name in ("ana", "nobody", "ida"):
        hasher_calls.clear()
        assert (
            _login(Client(REMOTE_ADDR=f"10.1.0.{len(counts) + 1}"), name, "wrong").status_code
            == 200
        )
        counts[name] = len(hasher_calls)
    assert counts["ana"] >= 1
    assert counts == {"ana": counts["ana"], "nobody": counts["ana"], "ida": counts["ana"]}
    hasher_calls.clear()
    assert _token(Client(REMOTE_ADDR="10.1.1.1"), "nobody", "wrong").status_code == 401
    assert len(hasher_calls) == counts["ana"]


def test_a_successful_sign_in_before_the_limit_still_works() -> None:
    personas.analyst()
    client = Client()
    for _ in range(LIMIT - 2):
        _login(client, "ana", "wrong")
    assert _login(client, "ana", personas.PASSWORD).status_code == 302
    assert _signed_in(client)


def _request(remote: str, forwarded: str | None = None) -> Any:
    extra = {"REMOTE_ADDR": remote}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return RequestFactory().post("/login/", **extra)


def test_the_client_address_is_remote_addr_unless_proxies_are_trusted(settings: Any) -> None:
    settings.CASEHUB_TRUSTED_PROXY_COUNT = 0
    assert client_ip(_request("10.0.0.1", "6.6.6.6")) == "10.0.0.1", "a forged header is ignored"
    settings.CASEHUB_TRUSTED_PROXY_COUNT = 1
    assert client_ip(_request("10.0.0.1", "6.6.6.6, 203.0.113.7")) == "203.0.113.7"
    assert client_ip(_request("10.0.0.1")) == "10.0.0.1"
    settings.CASEHUB_TRUSTED_PROXY_COUNT = 2
    assert client_ip(_request("10.0.0.1", "6.6.6.6, 203.0.113.7, 10.0.0.2")) == "203.0.113.7"
    assert client_ip(_request("10.0.0.1", "203.0.113.7")) == "10.0.0.1"


def test_behind_a_proxy_addresses_are_throttled_by_the_forwarded_address(settings: Any) -> None:
    settings.CASEHUB_TRUSTED_PROXY_COUNT = 1
    proxy = "10.0.0.1"
    for i in range(LIMIT):
        _login(Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="203.0.113.7"), f"n{i}", "x")
    attacker = _login(Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="203.0.113.7"), "z", "x")
    assert attacker.status_code == 429
    other = _login(Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR="198.51.100.4"), "y", "x")
    assert other.status_code == 200
