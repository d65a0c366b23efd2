from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from accounts.models import AccessDenial
from audit.chain import SYSTEM_CHAIN, verify_chain
from audit.models import AuditEvent
from tests import personas


@pytest.mark.django_db
def test_login_failed_login_and_logout_are_recorded(client: Client) -> None:
    personas.analyst()
    client.post("/login/", {"username": "ana", "password": "wrong"})
    client.post("/login/", {"username": "ana", "password": personas.PASSWORD})
    client.post("/logout/")

    events = list(
        AuditEvent.objects.filter(chain=SYSTEM_CHAIN, action__startswith="auth.log").order_by("seq")
    )
    assert [e.action for e in events] == [
        "auth.login.failed",
        "auth.login.succeeded",
        "auth.logout",
    ]
    assert events[0].data["username"] == "ana"
    assert "password" not in str(events[0].data)
    assert events[1].actor_label == "ana"
    assert verify_chain(SYSTEM_CHAIN) == []


@pytest.mark.scenario("F1")
@pytest.mark.django_db
def test_behind_a_trusted_proxy_the_trail_records_the_caller_not_the_proxy_or_a_forgery(
    settings: Any,
) -> None:
    settings.CASEHUB_TRUSTED_PROXY_COUNT = 1
    personas.analyst()
    # The proxy (127.0.0.1) appended the address it saw; the entry left of it is the caller's own.
    behind = Client(REMOTE_ADDR="127.0.0.1", headers={"X-Forwarded-For": "6.6.6.6, 198.51.100.7"})
    behind.post("/login/", {"username": "ana", "password": "wrong"})
    behind.post("/login/", {"username": "ana", "password": personas.PASSWORD})
    behind.get("/cases/999999/")
    events = AuditEvent.objects.filter(chain=SYSTEM_CHAIN).order_by("seq")
    ips = {e.action: e.data.get("ip") for e in events if e.action.startswith("auth.login")}
    assert ips == {"auth.login.failed": "198.51.100.7", "auth.login.succeeded": "198.51.100.7"}
    assert AccessDenial.objects.get().source == "198.51.100.7"
