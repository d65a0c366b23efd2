"""API tokens: issued, looked up, revoked.

A token is good for CASEHUB_API_TOKEN_TTL_HOURS from its creation and a user holds at most
CASEHUB_API_TOKEN_MAX_PER_USER live ones: a new one beyond that revokes the oldest. Tokens die
with their holder's password, active flag and roles (accounts.users and accounts.sessions
revoke them there). Every revocation is an `auth.token.revoked` event.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from accounts.models import ApiToken
from audit.chain import append_event


class TokenNotFound(Exception):
    """No live token with this id belongs to the user (404)."""


def _token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def token_lifetime() -> timedelta:
    """Return how long an API token lives from its creation."""
    return timedelta(hours=settings.CASEHUB_API_TOKEN_TTL_HOURS)


def token_expires_at(token: ApiToken) -> datetime:
    """Return when the token stops working."""
    return token.created_at + token_lifetime()


def live_api_tokens(user: User) -> list[ApiToken]:
    """Return the user's tokens that have not expired, newest first."""
    since = timezone.now() - token_lifetime()
    return list(
        ApiToken.objects.filter(user=user, created_at__gt=since).order_by("-created_at", "-pk")
    )


def _revoke(
    tokens: list[ApiToken], user: User, *, actor: Any, why: str, action: str = "auth.token.revoked"
) -> int:
    # Inside the caller's transaction: one event names every token it ends.
    if not tokens:
        return 0
    ApiToken.objects.filter(pk__in=[token.pk for token in tokens]).delete()
    append_event(
        action,
        actor=actor,
        data={
            "user": user.username,
            "user_id": user.pk,
            "tokens": len(tokens),
            "token_ids": sorted(token.pk for token in tokens),
            "why": why,
        },
    )
    return len(tokens)


@transaction.atomic
def issue_api_token(user: User) -> str:
    """Create a bearer token for the user and return it; only its hash is stored.

    The user's expired tokens are deleted (`auth.token.expired`), and if they already hold
    CASEHUB_API_TOKEN_MAX_PER_USER live ones the oldest are revoked (`auth.token.revoked`).
    """
    # The user's row lock serialises two issues at once, so neither overshoots the limit. It is
    # FOR NO KEY UPDATE: a plain FOR UPDATE also blocks the foreign-key check of every audit event
    # naming the user, so a sign-in holding the chain head would wait on it while this waits on
    # that head (a deadlock). Locks are taken as everywhere: the user's row, then the chain head.
    User.objects.select_for_update(no_key=True).filter(pk=user.pk).first()
    since = timezone.now() - token_lifetime()
    expired = list(ApiToken.objects.filter(user=user, created_at__lte=since))
    _revoke(expired, user, actor=user, why="expired", action="auth.token.expired")
    live = live_api_tokens(user)
    keep = settings.CASEHUB_API_TOKEN_MAX_PER_USER - 1
    _revoke(
        live[keep:],
        user,
        actor=user,
        why=f"a new token beyond {settings.CASEHUB_API_TOKEN_MAX_PER_USER}: the oldest goes",
    )
    raw = secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, key_hash=_token_hash(raw))
    append_event(
        "auth.token.issued",
        actor=user,
        data={
            "user": user.username,
            "user_id": user.pk,
            "token": token.pk,
            "expires_at": token_expires_at(token).isoformat(),
        },
    )
    return raw


def token_secret_expires_at(raw: str) -> datetime:
    """Return when the token with this secret expires.

    Raises ApiToken.DoesNotExist for a secret that names no stored token.
    """
    return token_expires_at(ApiToken.objects.get(key_hash=_token_hash(raw)))


def api_token_for(raw: str) -> ApiToken | None:
    """Return the live token a bearer secret names (its user loaded), or None.

    None for an unknown or expired token and for one whose user is inactive.
    """
    if not raw:
        return None
    token = ApiToken.objects.select_related("user").filter(key_hash=_token_hash(raw)).first()
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    if now >= token_expires_at(token):
        return None
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def user_for_token(raw: str) -> User | None:
    """Return the active user a live bearer token belongs to, or None (see api_token_for)."""
    token = api_token_for(raw)
    return token.user if token is not None else None


@transaction.atomic
def revoke_api_token(user: User, token_id: int, *, why: str = "revoked by its owner") -> None:
    """Revoke one of the user's own live tokens (`auth.token.revoked`).

    Raises TokenNotFound when no live token with this id is the user's.
    """
    since = timezone.now() - token_lifetime()
    token = (
        ApiToken.objects.select_for_update()
        .filter(pk=token_id, user=user, created_at__gt=since)
        .first()
    )
    if token is None:
        raise TokenNotFound(f"You have no live API token {token_id}.")
    _revoke([token], user, actor=user, why=why)


@transaction.atomic
def revoke_api_tokens(user: User, *, actor: Any, why: str) -> int:
    """Revoke every token of the user, expired or not; return how many were revoked.

    Writes one `auth.token.revoked` event naming them and why (nothing when there were none).
    """
    tokens = list(ApiToken.objects.select_for_update().filter(user=user))
    return _revoke(tokens, user, actor=actor, why=why)
