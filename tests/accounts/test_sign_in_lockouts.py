"""The admins' Sign-in lockouts page: see who is refused sign-in, lift a lockout (RELIABILITY W5).

Lifting takes a reason, is recorded with who and why (`security.login.unlocked`), and is for
admins only: anyone else gets 403 (recorded as an access denial) and the lockout stays.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, cast

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from accounts.models import AccessDenial
from accounts.throttling import Limit, current_lockouts, lift_lockout
from audit.models import AuditEvent
from tests import personas

pytestmark = pytest.mark.django_db

LIMIT = 3
ADDRESS_LIMIT = 6
PAGE = "/sign-in-lockouts/"
LIFT = "/sign-in-lockouts/lift"


@pytest.fixture(autouse=True)
def _small_limits(settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = LIMIT
    settings.CASEHUB_LOGIN_ADDRESS_FAILURE_LIMIT = ADDRESS_LIMIT
    settings.CASEHUB_LOGIN_USERNAME_FAILURE_LIMIT = 4


def _fail(username: str, address: str = "127.0.0.1", times: int = LIMIT) -> None:
    for _ in range(times):
        Client(REMOTE_ADDR=address).post("/login/", {"username": username, "password": "wrong"})


def _sign_in(username: str, address: str = "127.0.0.1") -> int:
    client = Client(REMOTE_ADDR=address)
    response = client.post("/login/", {"username": username, "password": personas.PASSWORD})
    return int(response.status_code)


def _as(make: Any) -> Client:
    client = Client()
    client.force_login(make())
    return client


def _lift(client: Client, limit: str, username: str, ip: str, reason: str) -> Any:
    data = {"limit": limit, "username": username, "ip": ip, "reason": reason}
    return client.post(LIFT, data)


def test_the_page_and_the_lift_have_their_urls() -> None:
    assert reverse("accounts:lockout-list") == PAGE
    assert reverse("accounts:lockout-lift") == LIFT


@pytest.mark.scenario("W5")
def test_an_admin_lifts_a_lockout_in_two_clicks_recorded_with_who_and_why() -> None:
    personas.analyst()
    _fail("ana")
    assert _sign_in("ana") == 429
    admin = _as(personas.admin)
    page = admin.get(PAGE)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-lockout="pair"' in html and "ana" in html and "127.0.0.1" in html
    assert 'data-action="lift-lockout"' in html and "csrfmiddlewaretoken" in html
    response = _lift(admin, "pair", "ana", "127.0.0.1", "  Ana called the help desk  ")
    assert response.status_code == 302 and response["Location"] == PAGE
    event = AuditEvent.objects.get(action="security.login.unlocked")
    assert event.actor_label == "adam" and event.actor_user is not None
    assert event.data["why"] == "Ana called the help desk"
    assert event.data["limit"] == "pair" and event.data["username"] == "ana"
    assert event.data["ip"] == "127.0.0.1" and event.data["failures"] == LIMIT
    assert _sign_in("ana") == 302
    assert b'data-empty="lockouts"' in admin.get(PAGE).content


@pytest.mark.scenario("W5")
def test_a_lift_without_a_reason_is_refused_and_the_lockout_stays() -> None:
    personas.analyst()
    _fail("ana")
    admin = _as(personas.admin)
    response = _lift(admin, "pair", "ana", "127.0.0.1", "   ")
    assert response.status_code == 422
    assert b"Say why the lockout is lifted." in response.content
    assert not AuditEvent.objects.filter(action="security.login.unlocked").exists()
    assert _sign_in("ana") == 429


@pytest.mark.scenario("W5")
@pytest.mark.parametrize(
    "make",
    [personas.analyst, personas.officer, personas.auditor, personas.outsider],
    ids=["analyst", "officer", "auditor", "outsider"],
)
def test_only_admins_see_or_lift_lockouts(make: Any) -> None:
    personas.analyst("bea")
    _fail("bea")
    client = _as(make)
    assert client.get(PAGE).status_code == 403
    assert _lift(client, "pair", "bea", "127.0.0.1", "let me in").status_code == 403
    assert not AuditEvent.objects.filter(action="security.login.unlocked").exists()
    assert _sign_in("bea") == 429, "the lockout stays"
    denied = AccessDenial.objects.filter(kind=AccessDenial.Kind.FORBIDDEN, user__isnull=False)
    assert denied.exists()


def test_anonymous_visitors_are_sent_to_sign_in() -> None:
    response = Client().get(PAGE)
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert Client().post(LIFT, {}).status_code == 302


def test_the_action_itself_refuses_a_non_admin() -> None:
    personas.analyst()
    _fail("ana")
    officer = cast(User, personas.officer())
    with pytest.raises(PermissionDenied):
        lift_lockout(officer, limit=Limit.PAIR, username="ana", ip_address="127.0.0.1", why="x")
    assert _sign_in("ana") == 429


@pytest.mark.scenario("W5")
def test_an_address_lockout_is_lifted_for_every_username_there() -> None:
    personas.analyst()
    sprayer = "10.6.6.6"
    for i in range(ADDRESS_LIMIT):
        _fail(f"user-{i}", sprayer, times=1)
    assert _sign_in("ana", sprayer) == 429
    admin = _as(personas.admin)
    assert b'data-lockout="address"' in admin.get(PAGE).content
    assert _lift(admin, "address", "", sprayer, "our test runner").status_code == 302
    event = AuditEvent.objects.get(action="security.login.unlocked")
    assert event.data["limit"] == "address" and event.data["username"] is None
    assert event.data["attempts_deleted"] == ADDRESS_LIMIT
    assert _sign_in("ana", sprayer) == 302


def test_the_username_limit_is_shown_but_ends_by_itself() -> None:
    personas.analyst()
    for i in range(4):
        _fail("ana", f"198.51.100.{i + 1}", times=1)
    admin = _as(personas.admin)
    html = admin.get(PAGE).content.decode()
    assert 'data-lockout="username"' in html and "ends by itself" in html
    response = _lift(admin, "username", "ana", "", "please")
    assert response.status_code == 422
    assert not AuditEvent.objects.filter(action="security.login.unlocked").exists()


def test_lifting_a_lockout_that_has_ended_changes_nothing() -> None:
    personas.analyst()
    _fail("ana")
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - timedelta(minutes=15))
    admin = _as(personas.admin)
    response = _lift(admin, "pair", "ana", "127.0.0.1", "too late")
    assert response.status_code == 302
    assert b"already ended" in admin.get(PAGE).content
    assert not AuditEvent.objects.filter(action="security.login.unlocked").exists()


def test_the_page_costs_the_same_queries_for_one_lockout_or_many() -> None:
    admin = _as(personas.admin)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin.get(PAGE).status_code == 200
        return len(captured.captured_queries)

    _fail("u-0", "10.0.0.1")
    few = queries()
    for i in range(1, 6):
        _fail(f"u-{i}", f"10.0.0.{i + 1}")
    _fail("v", "10.0.9.9", times=1)
    for i in range(ADDRESS_LIMIT):
        _fail(f"w-{i}", "10.0.8.8", times=1)
    assert len([t for t in current_lockouts() if t.limit == "pair"]) == 6
    assert queries() == few + 1, "the address limit's rows, once, for all its lockouts"
