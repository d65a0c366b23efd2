"""Sign-in throttling with django-axes: three limits nobody can turn against another user.

django-axes records every failed sign-in (`/login/`, the admin's login and `POST /api/auth/token`:
everything that calls `authenticate` with the request) in its AccessAttempt rows, one per
username, client address and user agent, each with its count and latest time. Those database
rows are the counters of all three limits, so every web worker and host sees the same counts
(the default cache is per process). Past a limit the next attempts are refused before any
password is checked, with 429, Retry-After and a message that says when to try again:

- the pair, a username from one address: CASEHUB_LOGIN_FAILURE_LIMIT failures within
  CASEHUB_LOGIN_COOLOFF_MINUTES lock that pair (axes's own lockout, AXES_LOCKOUT_PARAMETERS),
  never the same user from elsewhere nor another user from the same address;
- the address over all usernames (password spraying): CASEHUB_LOGIN_ADDRESS_FAILURE_LIMIT
  failures within the cool-off;
- the username over all addresses (a distributed attack): CASEHUB_LOGIN_USERNAME_FAILURE_LIMIT
  failures within CASEHUB_LOGIN_USERNAME_WINDOW_SECONDS slow it to that rate; it never locks.

A row counts while its latest failure is inside the window, with all its failures (as axes
counts), so a client that keeps failing waits longer, never shorter. The username limit spares an
address someone signed in from within CASEHUB_LOGIN_KNOWN_ADDRESS_DAYS (axes's AccessLog, written
here for web and API sign-ins alike), for every username tried there: an attacker elsewhere cannot
keep an owner out at their usual address, and what an address is answered never depends on
whether the username exists (a rule keyed on the username's own sign-ins would tell it to anyone
behind the same address). Every refusal reads the same, whichever limit it is.

ThrottlingHandler (AXES_HANDLER) adds the two limits to axes's; `throttled_response`
(AXES_LOCKOUT_CALLABLE) answers every refusal, counts it as an access denial (kind
`throttled`, aggregated per minute) and records the failure that started a refusal
(`security.login.throttled`); `lift_lockout` lets an admin end a pair or address lockout
(`security.login.unlocked`, with who and why).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from axes.handlers.database import AxesDatabaseHandler
from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_client_username
from axes.models import AccessAttempt, AccessLog
from axes.signals import user_locked_out
from axes.utils import reset
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.models import AbstractBaseUser, User
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Max, QuerySet, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from accounts.denials import record_denial
from accounts.models import AccessDenial
from accounts.sessions import record_login_throttled
from accounts.users import may_manage_users
from audit.chain import SYSTEM_CHAIN, append_event
from web.http import client_ip

REASON_LENGTH = 500
# The admin's page lists at most this many lockouts of each limit (the most recent).
LIST_LIMIT = 200


class Limit(StrEnum):
    """Which limit refuses a sign-in."""

    PAIR = "pair"
    ADDRESS = "address"
    USERNAME = "username"


# One message for every limit: which limit refused would tell which counts a username has.
MESSAGE = "Too many failed sign-in attempts."
# The AccessAttempt fields each limit counts by.
KEYS = {
    Limit.PAIR: ("username", "ip_address"),
    Limit.ADDRESS: ("ip_address",),
    Limit.USERNAME: ("username",),
}
# An admin lifts these; the username limit ends by itself within its window.
LIFTABLE = (Limit.PAIR, Limit.ADDRESS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Throttle:
    """A limit a username or address is over: its failures, and when the refusal ends."""

    limit: Limit
    username: str | None
    ip_address: str | None
    failures: int
    until: datetime


class LockoutNotFound(Exception):
    """The lockout to lift is not current (it ended, or was lifted already)."""


def cool_off() -> timedelta:
    """Return the window of the pair and address limits (a pair lockout lasts this long)."""
    return timedelta(minutes=settings.CASEHUB_LOGIN_COOLOFF_MINUTES)


def _username_window() -> timedelta:
    return timedelta(seconds=settings.CASEHUB_LOGIN_USERNAME_WINDOW_SECONDS)


def _rules() -> dict[Limit, tuple[int, timedelta]]:
    # axes reads the pair limit from AXES_FAILURE_LIMIT (CASEHUB_LOGIN_FAILURE_LIMIT at start).
    return {
        Limit.PAIR: (int(settings.AXES_FAILURE_LIMIT), cool_off()),
        Limit.ADDRESS: (settings.CASEHUB_LOGIN_ADDRESS_FAILURE_LIMIT, cool_off()),
        Limit.USERNAME: (settings.CASEHUB_LOGIN_USERNAME_FAILURE_LIMIT, _username_window()),
    }


def _rows(limit: Limit, username: str | None, ip_address: str | None) -> QuerySet[AccessAttempt]:
    named = {"username": username, "ip_address": ip_address}
    return AccessAttempt.objects.filter(**{key: named[key] for key in KEYS[limit]})


def _until(rows: Iterable[tuple[datetime, int]], most: int, window: timedelta) -> datetime | None:
    # A row leaves the count a window after its latest failure, so the refusal ends when the
    # newest rows alone no longer reach the limit: a window after the row that makes them reach
    # it. `rows` are (latest failure, failures), newest first.
    counted = 0
    for attempt_time, failures in rows:
        counted += failures
        if counted >= most:
            return attempt_time + window
    return None


def _throttle(
    limit: Limit, username: str | None, ip_address: str | None, now: datetime
) -> Throttle | None:
    most, window = _rules()[limit]
    recent = _rows(limit, username, ip_address).filter(attempt_time__gte=now - window)
    total = recent.aggregate(n=Sum("failures_since_start"))["n"] or 0
    if total < most:
        return None
    newest_first = recent.order_by("-attempt_time").values_list(
        "attempt_time", "failures_since_start"
    )
    until = _until(newest_first, most, window) or now + window  # rows deleted meanwhile
    return Throttle(
        limit=limit, username=username, ip_address=ip_address, failures=total, until=until
    )


def is_known_address(ip_address: str | None, now: datetime) -> bool:
    """Tell whether anyone signed in from the address within the known-address days."""
    days = settings.CASEHUB_LOGIN_KNOWN_ADDRESS_DAYS
    if days <= 0 or not ip_address:
        return False
    return AccessLog.objects.filter(
        ip_address=ip_address, attempt_time__gte=now - timedelta(days=days)
    ).exists()


def _attempt(
    request: HttpRequest, credentials: dict[str, Any] | None
) -> tuple[str | None, str | None, datetime]:
    # The username as typed, the client's address and the attempt's time, as axes saw them.
    AxesProxyHandler.update_request(request)
    username = get_client_username(request, credentials)
    ip_address = getattr(request, "axes_ip_address", None)
    now = getattr(request, "axes_attempt_time", None) or timezone.now()
    return (str(username) if username is not None else None), ip_address, now


def _shared_limits(request: HttpRequest, credentials: dict[str, Any] | None) -> list[Throttle]:
    # The address limit, and the username limit unless the address is known: both decided by
    # counts and the address alone, never by whether the username exists or signed in.
    username, ip_address, now = _attempt(request, credentials)
    found = [_throttle(Limit.ADDRESS, None, ip_address, now)]
    if username and not is_known_address(ip_address, now):
        found.append(_throttle(Limit.USERNAME, username, None, now))
    return [throttle for throttle in found if throttle is not None]


def throttles_of(request: HttpRequest, credentials: dict[str, Any] | None = None) -> list[Throttle]:
    """Return every limit this sign-in attempt is over (none: its password may be checked)."""
    username, ip_address, now = _attempt(request, credentials)
    pair = _throttle(Limit.PAIR, username, ip_address, now)
    return [*([pair] if pair is not None else []), *_shared_limits(request, credentials)]


class ThrottlingHandler(AxesDatabaseHandler):
    """axes's database handler with the address and username limits and the known addresses.

    axes locks the pair itself (AXES_LOCKOUT_PARAMETERS); this adds the other two limits to its
    check before the password and to the failure that reaches one, and keeps the access log of
    successful sign-ins that makes an address known.
    """

    def is_locked(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> bool:
        """Tell whether the attempt is refused before its password is checked."""
        if super().is_locked(request, credentials):
            return True
        return bool(_shared_limits(request, credentials))

    def user_login_failed(
        self,
        sender: Any,
        credentials: dict[str, Any],
        request: HttpRequest | None = None,
        **kwargs: Any,
    ) -> None:
        """Count the failure (axes); refuse this attempt too when it reached any limit."""
        super().user_login_failed(sender, credentials, request, **kwargs)
        if request is None or getattr(request, "axes_locked_out", False):
            return
        if _shared_limits(request, credentials):
            request.axes_locked_out = True  # type: ignore[attr-defined]
            request.axes_credentials = credentials  # type: ignore[attr-defined]
            user_locked_out.send(
                "axes",
                request=request,
                username=get_client_username(request, credentials),
                ip_address=getattr(request, "axes_ip_address", None),
            )

    def user_logged_in(self, sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
        """Clear the pair's failures (axes) and remember the address the user signed in from."""
        super().user_logged_in(sender, request, user, **kwargs)
        _remember_address(request, user)


def _remember_address(request: HttpRequest, user: AbstractBaseUser) -> None:
    # axes would write this row itself (AXES_DISABLE_ACCESS_LOG) but would also give an API call a
    # session; the hash of a session is not needed here.
    username = user.get_username()
    now = getattr(request, "axes_attempt_time", None) or timezone.now()
    days = settings.CASEHUB_LOGIN_KNOWN_ADDRESS_DAYS
    forgotten = now - timedelta(days=days)
    AccessLog.objects.filter(username=username, attempt_time__lt=forgotten).delete()
    if days <= 0:
        return
    AccessLog.objects.create(
        username=username,
        ip_address=getattr(request, "axes_ip_address", None) or None,
        user_agent=getattr(request, "axes_user_agent", "")[:255],
        http_accept=getattr(request, "axes_http_accept", "")[:1025],
        path_info=getattr(request, "axes_path_info", "")[:255],
    )


def record_sign_in(request: HttpRequest, user: User) -> None:
    """Record a sign-in without a session (an API token) as a web sign-in is recorded.

    The pair's failures are cleared and the address remembered, as `user_logged_in` does for
    the web sign-in (axes's receiver; an API call sends no such signal).
    """
    AxesProxyHandler.user_logged_in(None, request, user)


def _wait_words(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds} second{'s' if seconds != 1 else ''}"
    minutes = math.ceil(seconds / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def throttled_message(seconds: int) -> str:
    """Return what a refused client reads: when to try again (the same for every limit)."""
    return f"{MESSAGE} Try again in {_wait_words(seconds)}."


def throttled_response(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict[str, Any] | None = None,
) -> HttpResponse:
    """Answer a refused sign-in: 429, Retry-After, one message whatever the username.

    Each refusal is counted as an access denial (kind `throttled`); the failure that reached a
    limit is recorded once more as `security.login.throttled`. An answer that is already this
    one (the API answers it itself) passes through.
    """
    if original_response is not None and original_response.status_code == 429:
        return original_response
    now = timezone.now()
    found = throttles_of(request, credentials)
    # The longest refusal is the one to wait out; none left means it just ended (or was lifted).
    throttle = max(found, key=lambda item: item.until, default=None)
    until = throttle.until if throttle is not None else now
    seconds = max(1, math.ceil((until - now).total_seconds()))
    message = throttled_message(seconds)
    record_denial(request, AccessDenial.Kind.THROTTLED, source=client_ip(request))
    # axes sets the failure count only on a counted failure: this one reached the limit.
    if throttle is not None and getattr(request, "axes_failures_since_start", None) is not None:
        record_login_throttled(
            username=str(get_client_username(request, credentials) or ""),
            ip_address=str(getattr(request, "axes_ip_address", "") or ""),
            failures=throttle.failures,
            until=until,
            path=request.path,
            limit=throttle.limit.value,
        )
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse({"message": message}, status=429)
    else:
        form = AuthenticationForm(request)
        context = {"form": form, "throttled_message": message}
        response = render(request, "registration/login.html", context, status=429)
    response["Retry-After"] = str(seconds)
    return response


# The admin's view ------------------------------------------------------------------------------


def _lockouts_of(limit: Limit, now: datetime) -> list[Throttle]:
    # Two queries whatever the number: the keys over the limit, then their recent rows.
    most, window = _rules()[limit]
    keys = KEYS[limit]
    recent = AccessAttempt.objects.filter(attempt_time__gte=now - window)
    over = list(
        recent.values_list(*keys)
        .annotate(failures=Sum("failures_since_start"), latest=Max("attempt_time"))
        .filter(failures__gte=most)
        .order_by("-latest")[:LIST_LIMIT]
    )
    if not over:
        return []
    wanted = {key: {row[index] for row in over} for index, key in enumerate(keys)}
    rows = recent.filter(**{f"{key}__in": values for key, values in wanted.items()})
    history: dict[tuple[Any, ...], list[tuple[datetime, int]]] = {}
    for *group, attempt_time, failures in rows.order_by("-attempt_time").values_list(
        *keys, "attempt_time", "failures_since_start"
    ):
        history.setdefault(tuple(group), []).append((attempt_time, failures))
    found = []
    for *group, failures, _latest in over:
        named = dict(zip(keys, group, strict=True))
        until = _until(history.get(tuple(group), []), most, window)
        if until is None:
            continue  # its rows aged out between the two queries
        found.append(
            Throttle(
                limit=limit,
                username=named.get("username"),
                ip_address=named.get("ip_address"),
                failures=failures,
                until=until,
            )
        )
    return sorted(found, key=lambda item: item.until, reverse=True)


def current_lockouts(now: datetime | None = None) -> list[Throttle]:
    """Return the current refusals: pairs, addresses, then usernames, the longest first in each.

    At most LIST_LIMIT of each (the most recently failing), in six queries.
    """
    now = now or timezone.now()
    return [throttle for limit in Limit for throttle in _lockouts_of(limit, now)]


@transaction.atomic
def lift_lockout(
    admin: User, *, limit: Limit, username: str | None, ip_address: str | None, why: str
) -> Throttle:
    """End a current pair or address lockout by forgetting its failures; return what it was.

    Writes `security.login.unlocked` (who, the limit, the username and address, the failures,
    when it would have ended, and why). Raises PermissionDenied unless the admin may manage
    users, ValueError for the username limit, a missing key or no reason, and LockoutNotFound
    when the lockout is not current.
    """
    if not may_manage_users(admin):
        raise PermissionDenied("Only admins lift sign-in lockouts.")
    why = why.strip()[:REASON_LENGTH]
    if limit not in LIFTABLE:
        raise ValueError("the username limit ends by itself")
    if not why:
        raise ValueError("say why the lockout is lifted")
    if not ip_address or (limit == Limit.PAIR and not username):
        raise ValueError("name the lockout to lift")
    key_username = username if limit == Limit.PAIR else None
    # The rows of the lockout, locked: a concurrent failure waits until they are gone.
    list(_rows(limit, key_username, ip_address).select_for_update().values_list("pk", flat=True))
    throttle = _throttle(limit, key_username, ip_address, timezone.now())
    if throttle is None:
        raise LockoutNotFound(f"no current {limit} lockout")
    # axes's own reset: both keys for a pair, the address alone for an address.
    deleted = reset(ip=ip_address, username=key_username)
    append_event(
        "security.login.unlocked",
        actor=admin,
        chain=SYSTEM_CHAIN,
        data={
            "limit": limit.value,
            "username": key_username,
            "ip": ip_address,
            "failures": throttle.failures,
            "until": throttle.until.isoformat(),
            "attempts_deleted": deleted,
            "why": why,
        },
    )
    return throttle
