"""Which groups of the identity provider's group claim give which CaseHub role.

Admins edit the table. Mapping a group to the analyst role applies at once; mapping one to a
sensitive role (officer, supervisor, auditor, admin) is proposed by one admin and approved by a
second (the two-person rule of accounts.approvals: the proposer is never the approver, nor an
admin account the proposer controls). Removing a mapping applies at once; members lose the role
at their next sign-in. Every change writes its audit event on the system chain.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from accounts import approvals, users
from accounts.models import OidcGroupMapping, OidcMappingRequest
from accounts.roles import ROLES
from audit.chain import SYSTEM_CHAIN, append_event

# The event of each way a proposal closes (codes spelt out for tests/audit).
MAPPING_CLOSED: dict[str, str] = {
    OidcMappingRequest.Status.APPROVED: "auth.oidc.mapping.approved",
    OidcMappingRequest.Status.REJECTED: "auth.oidc.mapping.rejected",
    OidcMappingRequest.Status.EXPIRED: "auth.oidc.mapping.expired",
}
GROUP_LENGTH = 200


class MappingConflict(approvals.RequestConflict):
    """The proposal is no longer pending, or has expired, or the mapping exists (409)."""


def roles_for_groups(groups: Iterable[str]) -> dict[str, list[str]]:
    """Return each role the groups map to, with the groups that map to it (roles in ROLES order)."""
    found: dict[str, list[str]] = {}
    for group, role in OidcGroupMapping.objects.filter(group__in=list(groups)).values_list(
        "group", "role"
    ):
        found.setdefault(role, []).append(group)
    return {role: sorted(found[role]) for role in ROLES if role in found}


def _check(admin: User, attempt: str) -> None:
    if not users.may_manage_users(admin):
        users.refuse_change(admin, attempt, None, "only admins map groups to roles")


def _clean(group: str, role: str) -> str:
    group = group.strip()
    if not group or len(group) > GROUP_LENGTH:
        raise ValueError(f"a group is 1 to {GROUP_LENGTH} characters")
    if role not in ROLES:
        raise ValueError(f"not a role: {role}")
    return group


def _record(mapping: OidcGroupMapping | OidcMappingRequest) -> dict[str, Any]:
    return {"group": mapping.group, "role": mapping.role}


def map_group(admin: User, group: str, role: str) -> OidcGroupMapping | OidcMappingRequest:
    """Map a group to a role: at once for the analyst role, else as a proposal.

    Returns the mapping, or the pending proposal that waits for a second admin (it supersedes an
    earlier pending one of the same group and role). Writes `auth.oidc.mapping.added` or
    `auth.oidc.mapping.requested`. Raises UserChangeRefused (audited) unless the admin may
    manage users; ValueError for an empty group or an unknown role; MappingConflict when the
    mapping exists.
    """
    _check(admin, "map_group")
    group = _clean(group, role)
    with transaction.atomic():
        if OidcGroupMapping.objects.filter(group=group, role=role).exists():
            raise MappingConflict(f"{group} already maps to {role}")
        if role not in users.SENSITIVE_ROLES:
            mapping = OidcGroupMapping.objects.create(group=group, role=role, created_by=admin)
            append_event(
                "auth.oidc.mapping.added",
                actor=admin,
                chain=SYSTEM_CHAIN,
                data={**_record(mapping), "mapping": mapping.pk, "second_admin": None},
            )
            return mapping
        now = timezone.now()
        for earlier in OidcMappingRequest.objects.select_for_update().filter(
            group=group, role=role, status=OidcMappingRequest.Status.PENDING
        ):
            _close(earlier, OidcMappingRequest.Status.EXPIRED, admin, now, "superseded")
        request = OidcMappingRequest.objects.create(group=group, role=role, requested_by=admin)
        append_event(
            "auth.oidc.mapping.requested",
            actor=admin,
            chain=SYSTEM_CHAIN,
            data={
                **_record(request),
                "request": request.pk,
                "before": {"status": None},
                "after": {"status": request.status},
            },
        )
        return request


def _close(
    request: OidcMappingRequest, status: str, admin: User | None, now: datetime, why: str
) -> None:
    before = request.status
    request.status = status
    request.decided_by = admin
    request.decided_at = now
    request.reason = why[:500]
    request.save(update_fields=["status", "decided_by", "decided_at", "reason"])
    append_event(
        MAPPING_CLOSED[status],
        actor=admin,
        chain=SYSTEM_CHAIN,
        data={
            **_record(request),
            "request": request.pk,
            "requested_by": request.requested_by.username,
            "why": why,
            "before": {"status": before},
            "after": {"status": status},
        },
    )


def _expire(request: OidcMappingRequest, admin: User | None, now: datetime, why: str) -> None:
    _close(request, OidcMappingRequest.Status.EXPIRED, admin, now, why)


def approve_mapping(admin: User, request: OidcMappingRequest) -> OidcGroupMapping:
    """Approve a proposed mapping as the second admin; return the mapping now in force.

    Writes `auth.oidc.mapping.approved`. Raises UserChangeRefused (audited) unless the admin
    may manage users, for the proposer, and for an admin account the proposer controls (see
    accounts.users.controlled_by); MappingConflict when the proposal is no longer pending or
    has expired (marked so, audited).
    """
    _check(admin, "approve_mapping")
    if approvals.is_requester(admin, request.requested_by_id):
        users.refuse_change(
            admin, "approve_mapping", None, "the proposer cannot approve their own group mapping"
        )
    if users.controlled_by(admin, request.requested_by):
        users.refuse_change(
            admin,
            "approve_mapping",
            None,
            "the proposer made this admin account or chose its password: "
            "a second admin must be someone else",
        )
    approvals.expire_if_old(
        request,
        admin,
        lifetime=users.ROLE_GRANT_LIFETIME,
        conflict=MappingConflict,
        close_expired=_expire,
    )
    with transaction.atomic():
        locked = approvals.pending(request, MappingConflict)
        mapping, _ = OidcGroupMapping.objects.get_or_create(
            group=locked.group,
            role=locked.role,
            defaults={"created_by": locked.requested_by, "approved_by": admin},
        )
        _close(locked, OidcMappingRequest.Status.APPROVED, admin, timezone.now(), "")
    request.refresh_from_db()
    return mapping


def reject_mapping(admin: User, request: OidcMappingRequest, reason: str) -> OidcMappingRequest:
    """Reject a proposed mapping with a reason (the proposer may withdraw theirs).

    Writes `auth.oidc.mapping.rejected`. Raises UserChangeRefused (audited) unless the admin may
    manage users; ValueError for an empty reason; MappingConflict when no longer pending.
    """
    _check(admin, "reject_mapping")
    reason = reason.strip()
    if not reason:
        raise ValueError("a rejection needs a reason")
    with transaction.atomic():
        locked = approvals.pending(request, MappingConflict)
        _close(locked, OidcMappingRequest.Status.REJECTED, admin, timezone.now(), reason)
    request.refresh_from_db()
    return locked


@transaction.atomic
def remove_mapping(admin: User, mapping: OidcGroupMapping) -> None:
    """Remove a mapping at once; its members lose the role at their next sign-in.

    Writes `auth.oidc.mapping.removed`. Raises UserChangeRefused (audited) unless the admin may
    manage users.
    """
    _check(admin, "remove_mapping")
    record = {**_record(mapping), "mapping": mapping.pk}
    deleted, _ = OidcGroupMapping.objects.filter(pk=mapping.pk).delete()
    if deleted:
        append_event("auth.oidc.mapping.removed", actor=admin, chain=SYSTEM_CHAIN, data=record)


def expire_old_proposals(now: datetime | None = None) -> int:
    """Mark pending proposals older than their lifetime `expired` (audited); return how many.

    Run by Celery beat with the other two-person requests. Rows are claimed with SKIP LOCKED, so
    two schedulers expire each proposal once.
    """
    now = now or timezone.now()
    expired = 0
    with transaction.atomic():
        for proposal in (
            OidcMappingRequest.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("requested_by")
            .filter(status=OidcMappingRequest.Status.PENDING)
            .filter(created_at__lt=now - users.ROLE_GRANT_LIFETIME)[:500]
        ):
            _expire(proposal, None, now, "not approved in time")
            expired += 1
    return expired
