"""Sessions and sign-in throttling: end a user's sessions, log out everywhere, record lockouts.

Sessions live in Django's database session store (SESSION_ENGINE is the database backend).
There is no per-user index of them: ending a user's sessions reads the unexpired ones and
deletes those signed in as the user. With the inactivity timeout (CASEHUB_SESSION_IDLE_MINUTES)
only the sessions of the last half hour or so are unexpired, so that read stays small.

Every change writes its audit event on the system chain in the same transaction:
`security.sessions.ended` (log out everywhere, or an admin's change that ends a user's access),
`security.login.throttled` (a sign-in limit was reached). API tokens are revoked through
planning.actions, which writes `auth.token.revoked`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.backends.base import SessionBase
from django.contrib.sessions.models import Session
from django.db import transaction
from django.utils import timezone

from accounts import tokens as api_tokens
from audit.chain import SYSTEM_CHAIN, Actor, append_event
from audit.models import ActorKind


def _session_keys_of(user: User) -> list[str]:
    # The store keeps the user's id as a string under SESSION_KEY; decode() gives {} for a
    # session it cannot read (tampered, or signed with an old key), which matches nobody.
    wanted = str(user.pk)
    keys = []
    rows = Session.objects.filter(expire_date__gt=timezone.now()).iterator(chunk_size=500)
    for row in rows:
        if str(row.get_decoded().get(SESSION_KEY, "")) == wanted:
            keys.append(row.session_key)
    return keys


def signed_in_sessions(user: User) -> int:
    """Return how many unexpired sessions are signed in as the user."""
    return len(_session_keys_of(user))


def _end_sessions(user: User, keep: str | None) -> int:
    keys = [key for key in _session_keys_of(user) if key != keep]
    if keys:
        Session.objects.filter(session_key__in=keys).delete()
    return len(keys)


@transaction.atomic
def end_all_sessions(user: User, *, actor: Any, why: str) -> int:
    """End every session signed in as the user; return how many ended.

    Called when an admin deactivates the user or removes a role: the sessions would otherwise
    come back to life on reactivation. Writes `security.sessions.ended` (nothing if none).
    """
    ended = _end_sessions(user, keep=None)
    if ended:
        append_event(
            "security.sessions.ended",
            actor=actor,
            chain=SYSTEM_CHAIN,
            data={"user": user.username, "user_id": user.pk, "sessions": ended, "why": why},
        )
    return ended


@transaction.atomic
def log_out_everywhere(user: User, current: SessionBase) -> dict[str, int]:
    """End the user's other sessions and revoke all their API tokens; keep this session.

    The current session gets a new key, so a copy of its old cookie dies too. Writes
    `security.sessions.ended` (always: the user asked) and `auth.token.revoked` when tokens
    were revoked. Returns {"sessions": ended, "tokens": revoked}.
    """
    ended = _end_sessions(user, keep=current.session_key)
    revoked = api_tokens.revoke_api_tokens(user, actor=user, why="the user logged out everywhere")
    current.cycle_key()
    append_event(
        "security.sessions.ended",
        actor=user,
        chain=SYSTEM_CHAIN,
        data={
            "user": user.username,
            "user_id": user.pk,
            "sessions": ended,
            "tokens": revoked,
            "why": "the user logged out everywhere",
        },
    )
    return {"sessions": ended, "tokens": revoked}


@transaction.atomic
def record_login_throttled(
    *, username: str, ip_address: str, failures: int, until: datetime, path: str, limit: str
) -> None:
    """Record that sign-in is refused until `until` by `limit` (pair, address or username).

    Written once, by the failure that reaches the limit (the refused attempts after it are
    counted as access denials). The username is recorded as typed, known or not.
    """
    append_event(
        "security.login.throttled",
        actor=Actor(ActorKind.ANONYMOUS, username[:150] or "anonymous"),
        chain=SYSTEM_CHAIN,
        data={
            "limit": limit,
            "username": username[:150],
            "ip": ip_address,
            "failures": failures,
            "until": until.isoformat(),
            "path": path[:200],
        },
    )
