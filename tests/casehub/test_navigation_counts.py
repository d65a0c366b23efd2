"""The navigation's counts are kept a few seconds per user and web process, and counted afresh
after the user's own change (#22: pages under load)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.core.cache import cache
from django.db import connection
from django.http import HttpResponse
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from oversight.models import Notification
from tests import personas
from web.middleware import NAV_GENERATION_KEY, SessionIdleMiddleware

pytestmark = pytest.mark.django_db


@pytest.fixture
def kept(settings: Any) -> Iterator[None]:
    settings.CASEHUB_NAV_COUNTS_TTL_S = 60
    cache.clear()
    yield
    cache.clear()


def notify(user: Any, n: int) -> None:
    for i in range(n):
        Notification.objects.create(user=user, kind="gate.opened", message=f"notice {i}")


def test_the_counts_are_kept_and_a_page_then_costs_one_query_less(kept: None) -> None:
    officer = personas.officer()
    notify(officer, 2)
    client = Client()
    client.force_login(officer)
    home = reverse("home")
    with CaptureQueriesContext(connection) as first:
        assert client.get(home).context["unread_count"] == 2
    notify(officer, 1)  # someone else's change: not seen while the counts are kept
    with CaptureQueriesContext(connection) as second:
        assert client.get(home).context["unread_count"] == 2
    assert len(second) == len(first) - 1
    cache.clear()  # the seconds are up
    assert client.get(home).context["unread_count"] == 3


def test_the_users_own_change_is_counted_at_once(kept: None) -> None:
    officer = personas.officer()
    notify(officer, 2)
    client = Client()
    client.force_login(officer)
    assert client.get(reverse("oversight:notifications")).context["unread_count"] == 2
    assert client.post(reverse("oversight:notifications-read-all")).status_code in (200, 302)
    # another web process has its own cache: the generation in the session tells it too
    assert client.session[NAV_GENERATION_KEY] == 1
    assert client.get(reverse("home")).context["unread_count"] == 0


def test_without_keeping_every_page_counts(settings: Any) -> None:
    settings.CASEHUB_NAV_COUNTS_TTL_S = 0
    officer = personas.officer()
    client = Client()
    client.force_login(officer)
    assert client.get(reverse("home")).context["unread_count"] == 0
    notify(officer, 1)
    assert client.get(reverse("home")).context["unread_count"] == 1


def test_a_change_without_a_signed_in_session_opens_no_session() -> None:
    officer = personas.officer()
    session = SessionStore()
    request = RequestFactory().post("/api/v1/cases")
    request.session = session
    request.user = officer  # signed in by a token, say: not through this session
    SessionIdleMiddleware(lambda r: HttpResponse())(request)
    assert NAV_GENERATION_KEY not in session
