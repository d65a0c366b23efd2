"""Record logins, failed logins and logouts in the system audit chain."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.http import HttpRequest

from oversight.audit import Actor, append_event
from oversight.models import ActorKind


def _client(request: HttpRequest | None) -> dict[str, str]:
    if request is None:
        return {}
    return {
        "ip": request.META.get("REMOTE_ADDR", ""),
        "user_agent": request.META.get("HTTP_USER_AGENT", "")[:200],
    }


def _on_login(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    append_event("auth.login.succeeded", actor=user, data=_client(request))


def _on_login_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    username = str(credentials.get("username", ""))[:150]
    append_event(
        "auth.login.failed",
        actor=Actor(ActorKind.ANONYMOUS, username or "anonymous"),
        data={"username": username, **_client(request)},
    )


def _on_logout(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    if user is not None:
        append_event("auth.logout", actor=user, data=_client(request))


def connect() -> None:
    """Connect the receivers (called once from OversightConfig.ready)."""
    user_logged_in.connect(_on_login, dispatch_uid="oversight.audit.login")
    user_login_failed.connect(_on_login_failed, dispatch_uid="oversight.audit.login_failed")
    user_logged_out.connect(_on_logout, dispatch_uid="oversight.audit.logout")
