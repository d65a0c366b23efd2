"""The two-person request flow: one admin asks, a second admin decides.

A password reset for a user in a sensitive role and a grant of a sensitive role are requests
(`PasswordResetRequest`, `RoleGrantRequest`), each in one of four states: pending, then approved
(by a second admin), rejected (with a reason for a role grant; the requester may withdraw their
own) or expired (superseded by a newer request of the same target, too old to approve, or swept
by Celery beat past its lifetime). This module holds what every kind of request shares: locking
a pending request, closing it with its audit event, expiring one too old to approve, sweeping
the old ones, and the rule that the requester is no second person. What a request changes when
approved (a password, roles) is its kind's own, in `accounts.users`.

A group of the identity provider's group claim mapped to a sensitive role is a request too
(`OidcMappingRequest`, in `accounts.oidc_mappings`), which uses `pending`, `expire_if_old` and
`is_requester` here.

Policy changes follow the same rule (a second admin approves, never the proposer) in
`oversight.actions.policies`, which asks `is_requester` here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from accounts.models import OidcMappingRequest, PasswordResetRequest, RoleGrantRequest
from audit.chain import SYSTEM_CHAIN, append_event

type TwoPersonRequest = PasswordResetRequest | RoleGrantRequest

# The event of each way a request closes (codes spelt out for tests/audit).
RESET_CLOSED: Mapping[str, str] = {
    PasswordResetRequest.Status.APPROVED: "auth.password_reset.approved",
    PasswordResetRequest.Status.REJECTED: "auth.password_reset.rejected",
    PasswordResetRequest.Status.EXPIRED: "auth.password_reset.expired",
}
GRANT_CLOSED: Mapping[str, str] = {
    RoleGrantRequest.Status.APPROVED: "auth.role_grant.approved",
    RoleGrantRequest.Status.REJECTED: "auth.role_grant.rejected",
    RoleGrantRequest.Status.EXPIRED: "auth.role_grant.expired",
}
# How each kind is named in messages.
NOUNS: Mapping[type[Any], str] = {
    PasswordResetRequest: "password reset",
    RoleGrantRequest: "role grant",
    OidcMappingRequest: "group mapping",
}


class RequestConflict(Exception):
    """The request is no longer pending, or too old to approve (409)."""


def subject(user: User) -> dict[str, Any]:
    """Return how an event names the user a request is about."""
    return {"user": user.username, "user_id": user.pk}


def pending[R: (PasswordResetRequest, RoleGrantRequest, OidcMappingRequest)](
    request: R, conflict: type[RequestConflict]
) -> R:
    """Lock the request's row and return it; raise `conflict` unless it is still pending."""
    locked = type(request).objects.select_for_update().get(pk=request.pk)
    if locked.status != type(request).Status.PENDING:
        noun = NOUNS[type(request)]
        raise conflict(f"the {noun} is {locked.status}, no longer pending")
    return locked


def close(
    request: TwoPersonRequest,
    status: str,
    admin: User | None,
    now: datetime,
    *,
    why: str = "",
    roles: tuple[list[str], list[str]] | None = None,
) -> None:
    """Close a locked pending request as `status` (by `admin`, None for the sweep) and write its
    event, inside the caller's transaction.

    A role grant keeps the reason on its row, and its event names the roles asked for and the
    target's roles `(before, after)`.
    """
    before = request.status
    request.status = status
    request.decided_by = admin
    request.decided_at = now
    fields = ["status", "decided_by", "decided_at"]
    extra: dict[str, Any] = {}
    held_before: dict[str, Any] = {}
    held_after: dict[str, Any] = {}
    if isinstance(request, RoleGrantRequest):
        request.reason = why
        fields.append("reason")
        extra["grant"] = request.roles
        if roles is not None:
            held_before, held_after = {"roles": roles[0]}, {"roles": roles[1]}
    request.save(update_fields=fields)
    append_event(
        RESET_CLOSED[status] if isinstance(request, PasswordResetRequest) else GRANT_CLOSED[status],
        actor=admin,
        chain=SYSTEM_CHAIN,
        data={
            **subject(request.target),
            "request": request.pk,
            "requested_by": request.requested_by.username,
            **extra,
            "why": why,
            "before": {"status": before, **held_before},
            "after": {"status": status, **held_after},
        },
    )


def is_requester(approver: User, requested_by_id: int | None) -> bool:
    """Tell whether the approver asked for the change themselves (and so is no second person)."""
    return requested_by_id is not None and requested_by_id == approver.pk


def expire_if_old[R: (PasswordResetRequest, RoleGrantRequest, OidcMappingRequest)](
    request: R,
    admin: User,
    *,
    lifetime: timedelta,
    conflict: type[RequestConflict],
    close_expired: Callable[[R, User | None, datetime, str], None],
) -> None:
    """Mark a request older than its lifetime expired (audited) and raise `conflict`; return
    quietly when it may still be approved."""
    now = timezone.now()
    if now - request.created_at <= lifetime:
        return
    with transaction.atomic():
        locked = pending(request, conflict)
        close_expired(locked, admin, now, "too old to approve")
    raise conflict(f"the {NOUNS[type(request)]} has expired: the requester must ask again")


def sweep_expired[R: (PasswordResetRequest, RoleGrantRequest)](
    model: type[R],
    *,
    lifetime: timedelta,
    now: datetime,
    close_expired: Callable[[R, User | None, datetime, str], None],
) -> int:
    """Expire the pending requests of `model` past their lifetime, inside the caller's
    transaction; return how many. Rows are claimed with SKIP LOCKED, so two schedulers expire
    each request once."""
    expired = 0
    for request in (
        model.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("target", "requested_by")
        .filter(status=model.Status.PENDING)
        .filter(created_at__lt=now - lifetime)[:500]
    ):
        close_expired(request, None, now, "not approved in time")
        expired += 1
    return expired
