"""One account signing in, out and taking API tokens from many places at once while an admin edits
it, through 200 ms of added database latency (P4, small).

Sign-ins update the user's `last_login` and append `auth.login.succeeded` to the system chain (an
event's foreign key to the user is checked after the chain head is locked); a token issue locks
the user's row, then appends `auth.token.issued` (and `auth.token.revoked` past the limit) to the
same chain; an admin's change locks the row, then appends `auth.user.changed`. Run together on one
account they must all succeed: no deadlock, no 500, every event written once, the token limit
held and the chain intact.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from accounts import users
from accounts.models import ApiToken
from audit.chain import SYSTEM_CHAIN, verify_chain
from audit.models import AuditEvent
from bench.delay_proxy import ProxyThread
from tests import personas

CLIENTS = 6  # signing in, and as many taking tokens, at once
ROUNDS = 3  # each client signs in (or takes a token) this many times in a row
SIGN_INS = TOKENS = CLIENTS * ROUNDS
DELAY_EACH_WAY_S = 0.1  # 200 ms added to every round trip to PostgreSQL


@pytest.mark.slow
@pytest.mark.scenario("P4")
@pytest.mark.django_db(transaction=True)
def test_one_account_signing_in_and_taking_tokens_at_once_through_latency() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the delay sits on the TCP path to PostgreSQL (CI runs it)")
    user = personas.officer()
    admin = personas.admin()
    assert TOKENS > settings.CASEHUB_API_TOKEN_MAX_PER_USER
    proxies = ProxyThread()
    target = connection.settings_dict
    proxy = proxies.add("127.0.0.1", int(target.get("PORT") or 5432), delay_s=DELAY_EACH_WAY_S)
    barrier = threading.Barrier(2 * CLIENTS + 1)
    statuses: dict[str, list[Any]] = {"login": [], "logout": [], "token": [], "admin": []}
    credentials = {"username": user.username, "password": personas.PASSWORD}

    def sign_in(index: int) -> None:
        connection.settings_dict = {**target, "HOST": "127.0.0.1", "PORT": str(proxy.port)}
        try:
            barrier.wait()
            for _ in range(ROUNDS):  # a new browser each time: a signed-in one is just redirected
                client = Client(REMOTE_ADDR=f"10.4.0.{index + 1}")
                statuses["login"].append(client.post("/login/", credentials).status_code)
                statuses["logout"].append(client.post("/logout/").status_code)
        except Exception as exc:  # a deadlock surfaces here: the test client re-raises
            statuses["login"].append(repr(exc))
        finally:
            connection.close()

    def take_token(index: int) -> None:
        connection.settings_dict = {**target, "HOST": "127.0.0.1", "PORT": str(proxy.port)}
        client = Client(REMOTE_ADDR=f"10.4.1.{index + 1}")
        try:
            barrier.wait()
            for _ in range(ROUNDS):
                response = client.post(
                    "/api/auth/token", credentials, content_type="application/json"
                )
                statuses["token"].append(response.status_code)
        except Exception as exc:
            statuses["token"].append(repr(exc))
        finally:
            connection.close()

    def edit() -> None:
        connection.settings_dict = {**target, "HOST": "127.0.0.1", "PORT": str(proxy.port)}
        try:
            barrier.wait()
            for i in range(ROUNDS * 2):
                users.change_user(admin, user, first_name=f"Olivia {i}")
                statuses["admin"].append("changed")
        except Exception as exc:
            statuses["admin"].append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=edit)]
    threads += [threading.Thread(target=sign_in, args=(i,)) for i in range(CLIENTS)]
    threads += [threading.Thread(target=take_token, args=(i,)) for i in range(CLIENTS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        proxies.close()
    assert proxy.connections >= 2 * CLIENTS  # every request went through the delay
    assert statuses == {
        "login": [302] * SIGN_INS,
        "logout": [302] * SIGN_INS,
        "token": [200] * TOKENS,
        "admin": ["changed"] * ROUNDS * 2,
    }
    events = AuditEvent.objects.filter(chain=SYSTEM_CHAIN, actor_user=user)
    assert events.filter(action="auth.login.succeeded").count() == SIGN_INS
    assert events.filter(action="auth.logout").count() == SIGN_INS
    assert events.filter(action="auth.token.issued").count() == TOKENS
    changed = AuditEvent.objects.filter(action="auth.user.changed", data__user_id=user.pk)
    assert changed.count() == ROUNDS * 2
    revoked = sum(e.data["tokens"] for e in events.filter(action="auth.token.revoked"))
    assert revoked == TOKENS - settings.CASEHUB_API_TOKEN_MAX_PER_USER
    assert ApiToken.objects.filter(user=user).count() == settings.CASEHUB_API_TOKEN_MAX_PER_USER
    assert verify_chain(SYSTEM_CHAIN) == []
