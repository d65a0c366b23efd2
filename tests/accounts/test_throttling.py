"""Sign-in throttling on /login/ and POST /api/auth/token (RELIABILITY W5).

Three limits (accounts.throttling), none of which one client can turn against another user:
failures of a username from one address lock that pair only; an address failing over many
usernames (spraying) is refused; a username failing from many addresses is slowed to a rate,
never locked, and not held back at an address someone signed in from. Every refusal is 429
with Retry-After and one message saying when to try again, the same whatever the username, and
counted as an access denial. An unknown username runs the password hasher like a wrong
password, so the answer's timing tells nothing; that is checked by counting hasher calls, not
by a clock. The web sign-in and the API token endpoint behave the same: most tests run on both.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from axes.models import AccessAttempt, AccessLog
from django.contrib.auth.hashers import MD5PasswordHasher
from django.db.models import F, Sum
from django.test import Client, RequestFactory

from accounts.models import AccessDenial, ApiToken
from accounts.throttling import current_lockouts
from audit.models import AuditEvent
from tests import personas
from web.http import client_ip

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent.parent
LIMIT = 5  # failures of one username from one address
ADDRESS_LIMIT = 12  # failures from one address over all usernames
USERNAME_LIMIT = 8  # failures of one username over all addresses, within WINDOW
WINDOW = 60
ENDPOINTS = ("web", "api")
# What each endpoint answers a wrong password and the right one.
WRONG = {"web": 200, "api": 401}
RIGHT = {"web": 302, "api": 200}


@pytest.fixture(autouse=True)
def _small_limits(settings: Any) -> None:
    # axes reads its limit from its own setting; CASEHUB_LOGIN_FAILURE_LIMIT feeds it at start.
    settings.AXES_FAILURE_LIMIT = LIMIT
    settings.CASEHUB_LOGIN_ADDRESS_FAILURE_LIMIT = ADDRESS_LIMIT
    settings.CASEHUB_LOGIN_USERNAME_FAILURE_LIMIT = USERNAME_LIMIT
    settings.CASEHUB_LOGIN_USERNAME_WINDOW_SECONDS = WINDOW


def _login(client: Client, username: str, password: str, **extra: Any) -> Any:
    return client.post("/login/", {"username": username, "password": password}, **extra)


def _token(client: Client, username: str, password: str, **extra: Any) -> Any:
    return client.post(
        "/api/auth/token",
        {"username": username, "password": password},
        content_type="application/json",
        **extra,
    )


def _sign_in(endpoint: str, username: str, password: str, address: str = "127.0.0.1") -> Any:
    send = _login if endpoint == "web" else _token
    return send(Client(REMOTE_ADDR=address), username, password)


def _message(response: Any) -> str:
    if response["Content-Type"] == "application/json":
        return str(response.json()["message"])
    found = re.search(r'data-error="throttled">([^<]+)<', response.content.decode())
    assert found, "the page says why"
    return found.group(1)


def _signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def _age(seconds: int) -> None:
    """Let time pass for the counters: every failure moves `seconds` into the past."""
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(seconds=seconds))


def _throttled_denials(source: str = "127.0.0.1") -> int:
    rows = AccessDenial.objects.filter(kind=AccessDenial.Kind.THROTTLED, source=source)
    return int(rows.aggregate(n=Sum("count"))["n"] or 0)


# The pair: a username from one address ---------------------------------------------------------


@pytest.mark.scenario("W5")
def test_200_wrong_passwords_on_one_account_are_throttled_with_retry_after() -> None:
    personas.analyst()
    statuses = [_login(Client(), "ana", f"guess-{i}").status_code for i in range(200)]
    assert statuses[: LIMIT - 1] == [200] * (LIMIT - 1)  # the form again, with its error
    assert set(statuses[LIMIT - 1 :]) == {429}
    refused = _login(Client(), "ana", personas.PASSWORD)
    assert refused.status_code == 429, "even the right password waits out the lockout"
    assert 0 < int(refused["Retry-After"]) <= 15 * 60
    assert _message(refused) == "Too many failed sign-in attempts. Try again in 15 minutes."
    throttled = AuditEvent.objects.get(action="security.login.throttled")
    assert throttled.data["username"] == "ana" and throttled.data["failures"] == LIMIT
    assert throttled.data["limit"] == "pair" and throttled.data["ip"] == "127.0.0.1"
    # Only the attempts whose password was checked are failed sign-ins; each refusal (the one
    # that reached the limit included) is an access denial, one event a minute.
    assert AuditEvent.objects.filter(action="auth.login.failed").count() == LIMIT
    assert _throttled_denials() == 200 - (LIMIT - 1) + 1
    denied = AuditEvent.objects.filter(action="security.access.denied", data__kind="throttled")
    assert 1 <= denied.count() <= 2  # the run may cross a minute
    assert AccessAttempt.objects.get().failures_since_start == LIMIT, "refusals are not counted"


@pytest.mark.scenario("W5")
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_one_pairs_failures_lock_neither_another_user_there_nor_the_user_elsewhere(
    endpoint: str,
) -> None:
    personas.analyst()
    personas.analyst("bea")
    statuses = [_sign_in(endpoint, "ana", f"guess-{i}").status_code for i in range(30)]
    assert statuses[LIMIT - 1 :] == [429] * (30 - LIMIT + 1)
    assert _sign_in(endpoint, "bea", personas.PASSWORD).status_code == RIGHT[endpoint]
    assert _sign_in(endpoint, "ana", personas.PASSWORD, "10.0.0.9").status_code == RIGHT[endpoint]
    assert _sign_in(endpoint, "ana", personas.PASSWORD).status_code == 429, "the pair stays locked"
    assert [(t.limit, t.username, t.ip_address) for t in current_lockouts()] == [
        ("pair", "ana", "127.0.0.1")
    ]


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
    assert _throttled_denials() == 20 - (LIMIT - 1) + 1


@pytest.mark.scenario("W5")
def test_the_web_and_the_api_count_failures_together() -> None:
    personas.analyst()
    for _ in range(LIMIT - 1):
        _login(Client(), "ana", "wrong")
    assert _token(Client(), "ana", "wrong").status_code == 429
    assert _login(Client(), "ana", personas.PASSWORD).status_code == 429


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_successful_sign_in_clears_the_pairs_failures(endpoint: str) -> None:
    personas.analyst()
    for _ in range(LIMIT - 1):
        _sign_in(endpoint, "ana", "wrong")
    assert _sign_in(endpoint, "ana", personas.PASSWORD).status_code == RIGHT[endpoint]
    assert not AccessAttempt.objects.exists()
    statuses = [_sign_in(endpoint, "ana", "wrong").status_code for _ in range(LIMIT - 1)]
    assert statuses == [WRONG[endpoint]] * (LIMIT - 1)


def test_a_pair_lockout_ends_after_the_cool_off() -> None:
    personas.analyst()
    for _ in range(LIMIT):
        _login(Client(), "ana", "wrong")
    assert _login(Client(), "ana", personas.PASSWORD).status_code == 429
    _age(15 * 60 - 5)
    assert 0 < int(_login(Client(), "ana", personas.PASSWORD)["Retry-After"]) <= 5
    _age(5)
    client = Client()
    assert _login(client, "ana", personas.PASSWORD).status_code == 302
    assert _signed_in(client)


# The address: password spraying ---------------------------------------------------------------


@pytest.mark.scenario("W5")
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_spraying_from_one_address_is_refused_with_retry_after_and_recorded(
    endpoint: str,
) -> None:
    personas.analyst()
    sprayer = "10.6.6.6"
    statuses = [
        _sign_in(endpoint, f"user-{i}", "Winter2026!", sprayer).status_code for i in range(40)
    ]
    assert statuses[: ADDRESS_LIMIT - 1] == [WRONG[endpoint]] * (ADDRESS_LIMIT - 1)
    assert set(statuses[ADDRESS_LIMIT - 1 :]) == {429}
    refused = _sign_in(endpoint, "ana", personas.PASSWORD, sprayer)
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 15 * 60
    assert _message(refused) == "Too many failed sign-in attempts. Try again in 15 minutes."
    throttled = AuditEvent.objects.get(action="security.login.throttled")
    assert throttled.data["limit"] == "address" and throttled.data["ip"] == sprayer
    assert throttled.data["failures"] == ADDRESS_LIMIT
    assert _throttled_denials(sprayer) == 40 - (ADDRESS_LIMIT - 1) + 1
    denied = AuditEvent.objects.filter(action="security.access.denied", data__source=sprayer)
    assert [event.data["kind"] for event in denied][:1] == ["throttled"]
    assert AccessAttempt.objects.aggregate(n=Sum("failures_since_start"))["n"] == ADDRESS_LIMIT
    # Nobody elsewhere is refused, not even for the usernames sprayed.
    assert _sign_in(endpoint, "user-1", "wrong", "10.0.0.2").status_code == WRONG[endpoint]
    assert _sign_in(endpoint, "ana", personas.PASSWORD, "10.0.0.2").status_code == RIGHT[endpoint]
    _age(15 * 60)
    assert _sign_in(endpoint, "ana", personas.PASSWORD, sprayer).status_code == RIGHT[endpoint]


@pytest.mark.scenario("W5")
def test_a_sprayer_behind_a_known_address_is_refused_there_whoever_signs_in_next() -> None:
    # Sparing the users who signed in there would tell the sprayer which usernames exist.
    personas.analyst()
    personas.analyst("bea")
    office = "192.0.2.10"
    assert _sign_in("web", "ana", personas.PASSWORD, office).status_code == 302
    for i in range(ADDRESS_LIMIT + 5):
        _sign_in("web", f"user-{i}", "wrong", office)
    for name in ("ana", "bea", "nobody"):
        refused = _sign_in("api", name, personas.PASSWORD, office)
        assert refused.status_code == 429, name
        assert _message(refused) == "Too many failed sign-in attempts. Try again in 15 minutes."
    assert _sign_in("web", "bea", personas.PASSWORD, "192.0.2.11").status_code == 302


# The username: a distributed attack -----------------------------------------------------------


@pytest.mark.scenario("W5")
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_distributed_attack_on_one_username_slows_it_but_never_locks_the_owner_out(
    endpoint: str, settings: Any
) -> None:
    settings.CASEHUB_LOGIN_USERNAME_FAILURE_LIMIT = 3
    personas.analyst()
    for wave in range(3):  # three minutes of attack from ever new addresses
        if wave:
            _age(WINDOW)
        bots = [f"198.51.{wave}.{i}" for i in range(1, 40)]
        statuses = [_sign_in(endpoint, "ana", "guess", bot).status_code for bot in bots]
        assert statuses[:2] == [WRONG[endpoint]] * 2
        assert set(statuses[2:]) == {429}, "3 failures a minute, over all addresses"
    failures = AccessAttempt.objects.aggregate(n=Sum("failures_since_start"))["n"]
    assert failures == 9 > LIMIT, "more than would lock a pair: a username lock would hold"
    # The owner, from an address of their own, is delayed, told for how long ...
    owner = "203.0.113.5"
    delayed = _sign_in(endpoint, "ana", personas.PASSWORD, owner)
    assert delayed.status_code == 429
    assert 0 < int(delayed["Retry-After"]) <= WINDOW
    assert re.fullmatch(
        r"Too many failed sign-in attempts\. Try again in (\d+ seconds?|1 minute)\.",
        _message(delayed),
    )
    # ... and gets in once the delay is over, though the attack went on all along.
    _age(WINDOW)
    assert _sign_in(endpoint, "ana", personas.PASSWORD, owner).status_code == RIGHT[endpoint]
    assert not [t for t in current_lockouts() if t.limit == "pair"], "nothing was locked"
    throttled = AuditEvent.objects.filter(action="security.login.throttled")
    assert {(event.data["limit"], event.data["username"]) for event in throttled} == {
        ("username", "ana")
    }
    assert throttled.count() == 3, "one a wave: the failure that reached the limit"


@pytest.mark.scenario("W5")
def test_during_a_distributed_attack_the_owner_signs_in_at_once_from_a_known_address() -> None:
    personas.analyst()
    home = "203.0.113.7"
    assert _sign_in("api", "ana", personas.PASSWORD, home).status_code == 200
    for i in range(1, USERNAME_LIMIT + 20):
        _sign_in("web", "ana", "guess", f"198.51.100.{i}")
    assert _sign_in("web", "ana", "guess", "198.51.100.200").status_code == 429
    client = Client(REMOTE_ADDR=home)
    assert _login(client, "ana", personas.PASSWORD).status_code == 302
    assert _signed_in(client)
    assert AccessLog.objects.filter(username="ana", ip_address=home).count() == 2


def test_known_addresses_are_forgotten_after_the_configured_days(settings: Any) -> None:
    settings.CASEHUB_LOGIN_USERNAME_FAILURE_LIMIT = 2
    personas.analyst()
    home = "203.0.113.7"
    assert _sign_in("web", "ana", personas.PASSWORD, home).status_code == 302
    AccessLog.objects.update(attempt_time=F("attempt_time") - timedelta(days=31))
    for bot in ("198.51.100.1", "198.51.100.2"):
        _sign_in("web", "ana", "guess", bot)
    assert _sign_in("web", "ana", personas.PASSWORD, home).status_code == 429
    _age(WINDOW)
    assert _sign_in("web", "ana", personas.PASSWORD, home).status_code == 302
    assert AccessLog.objects.filter(username="ana").count() == 1, "the old row is pruned"


# One answer whatever the username ------------------------------------------------------------


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
@pytest.mark.parametrize("spread", [False, True], ids=["one-address", "many-addresses"])
def test_a_throttled_unknown_user_and_a_throttled_real_one_read_the_same(spread: bool) -> None:
    personas.analyst()
    failures = LIMIT if not spread else USERNAME_LIMIT
    # Interleaved, so that each one's failures end at about the same time however slow the
    # machine is: the waits are counted from them.
    for i in range(failures):
        for name, net in (("nobody", "10.0.1"), ("ana", "10.0.2")):
            _token(Client(REMOTE_ADDR=f"{net}.{i + 1 if spread else 1}"), name, "wrong")
    last = f"{failures + 1}" if spread else "1"
    unknown = _token(Client(REMOTE_ADDR=f"10.0.1.{last}"), "nobody", "wrong")
    real = _token(Client(REMOTE_ADDR=f"10.0.2.{last}"), "ana", "wrong")
    assert unknown.status_code == real.status_code == 429
    # The wait is counted from each one's own failures: a second apart at most.
    assert abs(int(unknown["Retry-After"]) - int(real["Retry-After"])) <= 1
    assert re.sub(r"\d+", "N", unknown.json()["message"]) == re.sub(
        r"\d+", "N", real.json()["message"]
    )


def _answer(response: Any) -> tuple[int, str, bool]:
    """Return a sign-in's status, message (digits as N) and whether it says when to retry."""
    message = re.sub(r"\d+", "N", _message(response)) if response.status_code == 429 else ""
    return response.status_code, message, response.has_header("Retry-After")


@pytest.mark.scenario("W5")
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_at_an_address_the_account_signed_in_from_an_unknown_username_reads_the_same(
    endpoint: str, settings: Any
) -> None:
    # The defaults: the username limit (5) comes before the pair's (10), the address's far after.
    settings.AXES_FAILURE_LIMIT = 10
    settings.CASEHUB_LOGIN_USERNAME_FAILURE_LIMIT = 5
    settings.CASEHUB_LOGIN_ADDRESS_FAILURE_LIMIT = 100
    personas.analyst()
    offices = ("192.0.2.20", "192.0.2.21")  # two of the account's addresses, one for each name
    for office in offices:
        assert _sign_in(endpoint, "ana", personas.PASSWORD, office).status_code == RIGHT[endpoint]
    real, unknown = [], []
    for i in range(11):  # interleaved, so that the waits count from the same moments
        real.append(_answer(_sign_in(endpoint, "ana", f"guess-{i}", offices[0])))
        unknown.append(_answer(_sign_in(endpoint, "nobody", f"guess-{i}", offices[1])))
    assert real == unknown
    assert [status for status, _, _ in real].count(WRONG[endpoint]) < 11, "the limit held"
    real_wait = int(_sign_in(endpoint, "ana", "guess", offices[0])["Retry-After"])
    unknown_wait = int(_sign_in(endpoint, "nobody", "guess", offices[1])["Retry-After"])
    assert abs(real_wait - unknown_wait) <= 1


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


def test_a_refused_attempt_checks_no_password(hasher_calls: list[str]) -> None:
    personas.analyst()
    for _ in range(LIMIT):
        _login(Client(), "ana", "wrong")
    hasher_calls.clear()
    assert _login(Client(), "ana", personas.PASSWORD).status_code == 429
    assert _token(Client(), "ana", personas.PASSWORD).status_code == 429
    assert hasher_calls == []


def test_a_successful_sign_in_before_the_limit_still_works() -> None:
    personas.analyst()
    client = Client()
    for _ in range(LIMIT - 2):
        _login(client, "ana", "wrong")
    assert _login(client, "ana", personas.PASSWORD).status_code == 302
    assert _signed_in(client)


# The client's address --------------------------------------------------------------------------


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


@pytest.mark.scenario("W5")
def test_behind_a_proxy_the_limits_hold_the_forwarded_address(settings: Any) -> None:
    settings.CASEHUB_TRUSTED_PROXY_COUNT = 1
    personas.analyst()
    proxy = "10.0.0.1"

    def via(forwarded: str) -> Client:
        return Client(REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR=forwarded)

    for i in range(ADDRESS_LIMIT):
        _login(via("203.0.113.7"), f"n{i}", "x")
    attacker = _login(via("203.0.113.7"), "z", "x")
    assert attacker.status_code == 429
    assert _throttled_denials("203.0.113.7") == 2 and _throttled_denials(proxy) == 0
    assert _login(via("6.6.6.6, 198.51.100.4"), "ana", personas.PASSWORD).status_code == 302
    for _ in range(LIMIT):
        _token(via("198.51.100.4"), "ana", "wrong")
    assert _token(via("198.51.100.4"), "ana", personas.PASSWORD).status_code == 429
    assert _token(via("198.51.100.5"), "ana", personas.PASSWORD).status_code == 200


# Settings --------------------------------------------------------------------------------------


def test_a_username_window_longer_than_the_cool_off_is_refused_at_start(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "casehub.settings",
        "SECRET_KEY": "tests-only",
        "CASEHUB_VAR_DIR": str(tmp_path),
        "CASEHUB_LOGIN_COOLOFF_MINUTES": "1",
        "CASEHUB_LOGIN_USERNAME_WINDOW_SECONDS": "61",
    }
    done = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; settings.AXES_HANDLER"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "CASEHUB_LOGIN_USERNAME_WINDOW_SECONDS cannot be longer than" in done.stderr


LIMIT_SETTINGS = {
    "CASEHUB_LOGIN_FAILURE_LIMIT": ("10", "7"),
    "CASEHUB_LOGIN_COOLOFF_MINUTES": ("15", "20"),
    "CASEHUB_LOGIN_ADDRESS_FAILURE_LIMIT": ("100", "300"),
    "CASEHUB_LOGIN_USERNAME_FAILURE_LIMIT": ("5", "3"),
    "CASEHUB_LOGIN_USERNAME_WINDOW_SECONDS": ("180", "120"),
    "CASEHUB_LOGIN_KNOWN_ADDRESS_DAYS": ("30", "0"),
}


def test_the_limits_default_as_documented_and_are_read_from_the_environment(
    tmp_path: Path,
) -> None:
    code = (
        "from django.conf import settings as s; "
        f"print(' '.join(str(getattr(s, name)) for name in {sorted(LIMIT_SETTINGS)!r}), "
        "s.AXES_FAILURE_LIMIT, s.AXES_COOLOFF_TIME.total_seconds(), s.AXES_LOCKOUT_PARAMETERS)"
    )
    base = {k: v for k, v in os.environ.items() if k not in LIMIT_SETTINGS}
    base.update(
        DJANGO_SETTINGS_MODULE="casehub.settings",
        CASEHUB_VAR_DIR=str(tmp_path),
        SECRET_KEY="tests-only",
    )
    overrides = {name: values[1] for name, values in LIMIT_SETTINGS.items()}
    defaults, overridden = (
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**base, **extra},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split(" ", len(LIMIT_SETTINGS) + 2)
        for extra in ({}, overrides)
    )
    names = sorted(LIMIT_SETTINGS)
    assert defaults[: len(names)] == [LIMIT_SETTINGS[name][0] for name in names]
    assert overridden[: len(names)] == [LIMIT_SETTINGS[name][1] for name in names]
    assert defaults[len(names) :] == ["10", "900.0", "[['username', 'ip_address']]\n"]
    assert overridden[len(names) : -1] == ["7", "1200.0"]
    lines = (ROOT / ".env.example").read_text().splitlines()
    assert [f"{name}={LIMIT_SETTINGS[name][0]}" in lines for name in names] == [True] * len(names)
