from __future__ import annotations

import pytest
from django.test import Client

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
