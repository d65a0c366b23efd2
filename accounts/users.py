"""Users and roles: create, change, deactivate, set roles, reset passwords, unlock e-signing.

Admins manage users but never grant themselves anything (R1): nobody changes their own roles or
active flag, resets their own password here or unlocks their own signing; nobody but a superuser
touches a superuser; superuser and staff flags are never set here (staff follows the admin role,
because the admin site needs it). A new password for a user in a sensitive role (officer,
supervisor, auditor, admin) waits for a second admin, who is neither the requester nor the
target nor an admin whose account the requester controls (controlled_by). So does granting a
sensitive role, at creation or later (RoleGrantRequest): otherwise an admin could create a user
with a password they know, make them an officer and approve gates as them. Removing roles and
adding the analyst role apply at once.

Every change writes one audit event on the system chain with its before and after, in the same
transaction. A refusal raises UserChangeRefused (403) and is recorded first, in a transaction of
its own (a savepoint when the caller already holds one: see UserChangeRefused.durable). Passwords
are never written to the trail.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import password_validation
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group, User
from django.db import connection, transaction
from django.utils import timezone

from accounts import approvals, sessions
from accounts import tokens as api_tokens
from accounts.models import PasswordResetRequest, RoleGrantRequest, SigningState
from accounts.roles import ADMIN, AUDITOR, CONFIGURE, OFFICER, ROLES, SUPERVISOR, NoRoleAllows
from audit.chain import SYSTEM_CHAIN, append_event
from audit.models import AuditEvent

# Roles an admin may only grant, and whose holders' password an admin may only reset, with a
# second admin's approval. The admin role is one: an admin who could reset another admin's
# password, or make an account of theirs an admin, could approve their own requests.
SENSITIVE_ROLES = (OFFICER, SUPERVISOR, AUDITOR, ADMIN)
# A pending reset or role grant older than this can no longer be approved.
PASSWORD_RESET_LIFETIME = timedelta(hours=settings.CASEHUB_PASSWORD_RESET_LIFETIME_HOURS)
ROLE_GRANT_LIFETIME = PASSWORD_RESET_LIFETIME
# The user fields change_user may set.
PROFILE_FIELDS = ("username", "first_name", "last_name", "email", "is_active")

# True while one of these use cases runs: the signal receivers of accounts.signals then leave
# the recording to the use case, which writes one richer event.
_in_user_action: ContextVar[bool] = ContextVar("oversight_in_user_action", default=False)


def in_user_action() -> bool:
    """Return True inside a use case of this module (its own events describe the change)."""
    return _in_user_action.get()


@contextmanager
def _recording() -> Iterator[None]:
    token = _in_user_action.set(True)
    try:
        yield
    finally:
        _in_user_action.reset(token)


class UserChangeRefused(NoRoleAllows):
    """The change is not allowed (403). The refusal is already in the trail.

    `durable` is False when the refusal was recorded inside a transaction the caller holds:
    a caller whose transaction rolls back on this error records it again with
    `record_refusal(error)` once outside.
    """

    def __init__(self, why: str, *, actor: User, data: dict[str, Any], durable: bool) -> None:
        super().__init__(why)
        self.why = why
        self.actor = actor
        self.data = data
        self.durable = durable


class ResetConflict(approvals.RequestConflict):
    """The password reset request is no longer pending, or has expired (409)."""


class RoleGrantConflict(approvals.RequestConflict):
    """The role grant request is no longer pending, or has expired (409)."""


# Records ---------------------------------------------------------------------------------------


def role_names(user: User) -> list[str]:
    """Return the user's role groups, in the order of accounts.roles.ROLES."""
    names = set(user.groups.values_list("name", flat=True))
    return [role for role in ROLES if role in names]


def group_names(user: User) -> list[str]:
    """Return the names of all the user's groups, sorted."""
    return sorted(user.groups.values_list("name", flat=True))


def user_record(user: User) -> dict[str, Any]:
    """Return what the trail records of a user: profile, flags and groups (never the password)."""
    return {
        "username": user.username,
        "first_name": user.first_name,
        "last_name": user.last_name,
        "email": user.email,
        "is_active": user.is_active,
        "is_staff": user.is_staff,
        "is_superuser": user.is_superuser,
        "roles": role_names(user) if user.pk else [],
    }


# Checks ----------------------------------------------------------------------------------------


def _refuse(actor: User, attempt: str, target: User | None, why: str, **extra: Any) -> None:
    data = {
        "attempt": attempt,
        "user": target.username if target is not None else None,
        "user_id": target.pk if target is not None else None,
        "why": why,
        **extra,
    }
    durable = not connection.in_atomic_block
    with transaction.atomic():
        append_event("auth.user.change_refused", actor=actor, chain=SYSTEM_CHAIN, data=data)
    raise UserChangeRefused(why, actor=actor, data=data, durable=durable)


def record_refusal(error: UserChangeRefused) -> None:
    """Record a refusal again, after the transaction it was first recorded in rolled back."""
    with transaction.atomic():
        append_event(
            "auth.user.change_refused", actor=error.actor, chain=SYSTEM_CHAIN, data=error.data
        )


def refuse_change(admin: User, attempt: str, target: User | None, why: str) -> None:
    """Record and refuse an attempt no use case offers (a tampered form): always raises."""
    _refuse(admin, attempt, target, why)


def may_manage_users(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Return True if the user may manage users: an active holder of oversight.configure."""
    if not isinstance(user, User):
        return False
    return user.is_active and user.has_perm(CONFIGURE)


def _check(
    admin: User, attempt: str, target: User | None, *, not_self: bool = True, **extra: Any
) -> None:
    if not may_manage_users(admin):
        _refuse(admin, attempt, target, "only admins manage users", **extra)
    if target is None:
        return
    if not_self and target.pk == admin.pk:
        _refuse(
            admin,
            attempt,
            target,
            "nobody changes their own roles, access or password here: another admin does",
            **extra,
        )
    if target.is_superuser and not admin.is_superuser:
        _refuse(admin, attempt, target, "only a superuser changes a superuser", **extra)


def _role_groups(roles: Iterable[str]) -> list[Group]:
    wanted = list(dict.fromkeys(roles))
    unknown = [role for role in wanted if role not in ROLES]
    if unknown:
        raise ValueError(f"not a role: {', '.join(unknown)}")
    groups = {group.name: group for group in Group.objects.filter(name__in=wanted)}
    missing = [role for role in wanted if role not in groups]
    if missing:
        raise ValueError(f"role groups missing (run sync_roles): {', '.join(missing)}")
    return [groups[role] for role in wanted]


def _locked(user: User) -> User:
    return User.objects.select_for_update().get(pk=user.pk)


# Use cases -------------------------------------------------------------------------------------


def create_user(
    admin: User,
    *,
    username: str,
    password: str | None,
    first_name: str = "",
    last_name: str = "",
    email: str = "",
    roles: Sequence[str] = (),
    is_active: bool = True,
) -> User:
    """Create a user in the given roles (staff only for the admin role); return them.

    The sensitive roles among them are not given at once: the user is created without them and a
    pending RoleGrantRequest asks a second admin for them (see pending_role_grant). A None
    password makes an unusable one. Raises UserChangeRefused (audited) unless the admin may
    manage users, ValueError for an unknown role, ValidationError for a weak password.
    """
    _check(admin, "create_user", None)
    groups = _role_groups(roles)
    if password is not None:
        password_validation.validate_password(
            password, User(username=username, first_name=first_name, last_name=last_name)
        )
    return _create_user(admin, username, password, first_name, last_name, email, groups, is_active)


@transaction.atomic
def _create_user(
    admin: User,
    username: str,
    password: str | None,
    first_name: str,
    last_name: str,
    email: str,
    groups: list[Group],
    is_active: bool,
) -> User:
    grants = [group.name for group in groups if group.name in SENSITIVE_ROLES]
    at_once = [group for group in groups if group.name not in grants]
    with _recording():
        user = User.objects.create_user(
            username=username,
            password=password,
            first_name=first_name,
            last_name=last_name,
            email=email,
            is_active=is_active,
            is_staff=any(group.name == ADMIN for group in at_once),
        )
        user.groups.add(*at_once)
        append_event(
            "auth.user.created",
            actor=admin,
            chain=SYSTEM_CHAIN,
            data={**approvals.subject(user), "before": None, "after": user_record(user)},
        )
    if grants:
        _request_role_grant(admin, user, grants)
    return user


def change_user(admin: User, user: User, **changes: Any) -> User:
    """Change a user's username, names, e-mail or active flag; return the stored user.

    Writes `auth.user.changed` with the changed fields before and after (nothing if nothing
    changed). Raises UserChangeRefused (audited) unless the admin may manage users, for a change
    of the admin's own active flag, and for a superuser changed by a non-superuser; ValueError
    for a field that is not a profile field.
    """
    unknown = sorted(set(changes) - set(PROFILE_FIELDS))
    if unknown:
        raise ValueError(f"change_user changes {', '.join(PROFILE_FIELDS)}, not {unknown}")
    own_active = user.pk == admin.pk and "is_active" in changes
    _check(admin, "change_user", user, not_self=own_active)
    return _change_user(admin, user, changes, "auth.user.changed")


def deactivate_user(admin: User, user: User) -> User:
    """Deactivate a user (they can no longer sign in); return them. Never the admin themselves.

    Writes `auth.user.deactivated`. Raises UserChangeRefused (audited) as change_user does.
    """
    _check(admin, "deactivate_user", user)
    return _change_user(admin, user, {"is_active": False}, "auth.user.deactivated")


@transaction.atomic
def _change_user(admin: User, user: User, changes: dict[str, Any], action: str) -> User:
    stored = _locked(user)
    before = {name: getattr(stored, name) for name in changes}
    for name, value in changes.items():
        setattr(stored, name, value)
    changed = [name for name in changes if before[name] != getattr(stored, name)]
    if changed:
        with _recording():
            stored.save(update_fields=changed)
        append_event(
            action,
            actor=admin,
            chain=SYSTEM_CHAIN,
            data={
                **approvals.subject(stored),
                "before": {name: before[name] for name in changed},
                "after": {name: getattr(stored, name) for name in changed},
            },
        )
        if "is_active" in changed and not stored.is_active:
            _revoke_tokens(admin, stored, why="the account was deactivated")
    for name in PROFILE_FIELDS:
        setattr(user, name, getattr(stored, name))
    return stored


def set_roles(admin: User, user: User, roles: Sequence[str]) -> RoleGrantRequest | None:
    """Give a user exactly these roles (other groups stay); staff follows the admin role.

    Removed roles and the analyst role apply at once; sensitive roles the user does not hold yet
    wait for a second admin in a RoleGrantRequest, which supersedes the user's pending one.
    Returns that request, or None when everything applied at once. Writes
    `auth.user.roles_changed` with the roles and staff flag before and after (nothing if nothing
    changed at once) and `auth.role_grant.requested`. Raises UserChangeRefused (audited) unless
    the admin may manage users, for the admin's own roles and for a superuser; ValueError for an
    unknown role.
    """
    _check(admin, "set_roles", user)
    groups = _role_groups(roles)
    return _set_roles_or_request(admin, user, groups)


@transaction.atomic
def _set_roles_or_request(admin: User, user: User, groups: list[Group]) -> RoleGrantRequest | None:
    held = role_names(_locked(user))
    grants = [group.name for group in groups if group.name in SENSITIVE_ROLES]
    grants = [role for role in grants if role not in held]
    _set_roles(admin, user, [group for group in groups if group.name not in grants])
    if not grants:
        return None
    return _request_role_grant(admin, user, grants)


@transaction.atomic
def _set_roles(
    admin: User, user: User, groups: list[Group], extra: dict[str, Any] | None = None
) -> User:
    stored = _locked(user)
    before: dict[str, Any] = {"roles": role_names(stored), "is_staff": stored.is_staff}
    wanted = {group.name for group in groups}
    with _recording():
        stored.groups.remove(*stored.groups.filter(name__in=ROLES).exclude(name__in=wanted))
        stored.groups.add(*groups)
        stored.is_staff = ADMIN in wanted
        if stored.is_staff != before["is_staff"]:
            stored.save(update_fields=["is_staff"])
    after: dict[str, Any] = {"roles": role_names(stored), "is_staff": stored.is_staff}
    if after != before:
        append_event(
            "auth.user.roles_changed",
            actor=admin,
            chain=SYSTEM_CHAIN,
            data={**approvals.subject(stored), **(extra or {}), "before": before, "after": after},
        )
    if removed := sorted(set(before["roles"]) - set(after["roles"])):
        _revoke_tokens(admin, stored, why=f"role(s) removed: {', '.join(removed)}")
    user.is_staff = stored.is_staff
    return stored


def _revoke_tokens(admin: User, user: User, *, why: str) -> None:
    # A token outlives no change of who the user is (O9), and neither does a session: a
    # deactivated user's session would come back on reactivation, a demoted user's would keep
    # whatever the page had open. Both are ended here, each change audited.
    api_tokens.revoke_api_tokens(user, actor=admin, why=why)
    sessions.end_all_sessions(user, actor=admin, why=why)


def needs_second_admin(user: User) -> bool:
    """Return True if a new password for this user waits for a second admin."""
    return user.groups.filter(name__in=SENSITIVE_ROLES).exists()


def request_password_reset(
    admin: User, user: User, new_password: str
) -> PasswordResetRequest | None:
    """Set a user's password, or ask a second admin to, for a user in a sensitive role.

    Returns the pending request, or None when the password was set at once. A new request
    expires the user's earlier pending ones. Raises UserChangeRefused (audited) unless the admin
    may manage users, for the admin's own password and for a superuser; ValidationError for a
    weak password.
    """
    _check(admin, "request_password_reset", user)
    password_validation.validate_password(new_password, user)
    return _request_password_reset(admin, user, new_password)


@transaction.atomic
def _request_password_reset(
    admin: User, user: User, new_password: str
) -> PasswordResetRequest | None:
    stored = _locked(user)
    roles = role_names(stored)
    if not needs_second_admin(stored):
        with _recording():
            stored.set_password(new_password)
            stored.save(update_fields=["password"])
        append_event(
            "auth.user.password_reset",
            actor=admin,
            chain=SYSTEM_CHAIN,
            data={**approvals.subject(stored), "roles": roles, "second_admin": None},
        )
        _revoke_tokens(admin, stored, why="an admin set a new password")
        return None
    now = timezone.now()
    for earlier in PasswordResetRequest.objects.select_for_update().filter(
        target=stored, status=PasswordResetRequest.Status.PENDING
    ):
        approvals.close(earlier, PasswordResetRequest.Status.EXPIRED, admin, now, why="superseded")
    request = PasswordResetRequest.objects.create(
        target=stored, requested_by=admin, password_hash=make_password(new_password)
    )
    append_event(
        "auth.password_reset.requested",
        actor=admin,
        chain=SYSTEM_CHAIN,
        data={
            **approvals.subject(stored),
            "request": request.pk,
            "roles": roles,
            "before": {"status": None},
            "after": {"status": request.status},
        },
    )
    return request


def controlled_by(user: User, other: User) -> bool:
    """Return True if `other` may control `user`'s account, so `user` is no second person to them.

    That is: `other` created the account or chose its password (at once or through an approved
    reset: they know it), or made it an admin (at once, by approving a grant, or through an
    approved grant they asked for). Two-person rules (the second admin of a password reset or a
    role grant, and others' approvals) use this against accounts an admin made for themselves.
    """
    if PasswordResetRequest.objects.filter(
        target_id=user.pk, requested_by_id=other.pk, status=PasswordResetRequest.Status.APPROVED
    ).exists():
        return True
    granted = RoleGrantRequest.objects.filter(
        target_id=user.pk, requested_by_id=other.pk, status=RoleGrantRequest.Status.APPROVED
    ).values_list("roles", flat=True)
    if any(ADMIN in roles for roles in granted):
        return True
    events = AuditEvent.objects.filter(
        chain=SYSTEM_CHAIN,
        actor_user_id=other.pk,
        action__in=("auth.user.created", "auth.user.roles_changed", "auth.user.password_reset"),
        data__user_id=user.pk,
    )
    for event in events:
        if event.action in ("auth.user.created", "auth.user.password_reset"):
            return True
        if ADMIN in ((event.data.get("after") or {}).get("roles") or []):
            return True
    return False


def approve_password_reset(admin: User, request: PasswordResetRequest) -> User:
    """Approve a pending reset as the second admin: the target's password changes; return them.

    Raises UserChangeRefused (audited) unless the admin may manage users, for the requester,
    the target, an admin the requester controls (see controlled_by), and a superuser target
    unless the approver is one; ResetConflict when the request is no longer pending or expired
    (an expired request is marked so, audited).
    """
    target = request.target
    _check(admin, "approve_password_reset", target)
    if approvals.is_requester(admin, request.requested_by_id):
        why = "the requester cannot approve their own password reset"
        _refuse(admin, "approve_password_reset", target, why, request=request.pk)
    if controlled_by(admin, request.requested_by):
        _refuse(
            admin,
            "approve_password_reset",
            target,
            "the requester made this admin account or chose its password: "
            "a second admin must be someone else",
            request=request.pk,
        )
    approvals.expire_if_old(
        request,
        admin,
        lifetime=PASSWORD_RESET_LIFETIME,
        conflict=ResetConflict,
        close_expired=_expire_reset,
    )
    return _approve_password_reset(admin, request)


@transaction.atomic
def _approve_password_reset(admin: User, request: PasswordResetRequest) -> User:
    locked = approvals.pending(request, ResetConflict)
    target = _locked(locked.target)
    with _recording():
        target.password = locked.password_hash
        target.save(update_fields=["password"])
    approvals.close(locked, PasswordResetRequest.Status.APPROVED, admin, timezone.now())
    _revoke_tokens(admin, target, why="a password reset was approved")
    request.refresh_from_db()
    return target


def reject_password_reset(admin: User, request: PasswordResetRequest) -> PasswordResetRequest:
    """Reject a pending reset (the requester may withdraw theirs); the password stays.

    Raises UserChangeRefused (audited) unless the admin may manage users; ResetConflict when the
    request is no longer pending.
    """
    _check(admin, "reject_password_reset", request.target, not_self=False)
    return _reject_password_reset(admin, request)


@transaction.atomic
def _reject_password_reset(admin: User, request: PasswordResetRequest) -> PasswordResetRequest:
    locked = approvals.pending(request, ResetConflict)
    approvals.close(locked, PasswordResetRequest.Status.REJECTED, admin, timezone.now())
    request.refresh_from_db()
    return locked


# Role grants ----------------------------------------------------------------------------------


def pending_role_grant(user: User) -> RoleGrantRequest | None:
    """Return the user's pending role grant request (at most one), or None."""
    return RoleGrantRequest.objects.filter(
        target_id=user.pk, status=RoleGrantRequest.Status.PENDING
    ).first()


def _request_role_grant(admin: User, user: User, grants: list[str]) -> RoleGrantRequest:
    # Inside the caller's transaction, the user locked (or just created).
    now = timezone.now()
    for earlier in RoleGrantRequest.objects.select_for_update().filter(
        target_id=user.pk, status=RoleGrantRequest.Status.PENDING
    ):
        _close_grant(earlier, RoleGrantRequest.Status.EXPIRED, admin, now, why="superseded")
    request = RoleGrantRequest.objects.create(target=user, requested_by=admin, roles=grants)
    held = role_names(user)
    append_event(
        "auth.role_grant.requested",
        actor=admin,
        chain=SYSTEM_CHAIN,
        data={
            **approvals.subject(user),
            "request": request.pk,
            "grant": grants,
            "before": {"status": None, "roles": held},
            "after": {"status": request.status, "roles": held},
        },
    )
    return request


def _close_grant(
    request: RoleGrantRequest,
    status: str,
    admin: User | None,
    now: Any,
    *,
    why: str = "",
    roles_before: list[str] | None = None,
) -> None:
    held = role_names(request.target)
    roles = (held if roles_before is None else roles_before, held)
    approvals.close(request, status, admin, now, why=why, roles=roles)


def _expire_reset(request: PasswordResetRequest, admin: User | None, now: Any, why: str) -> None:
    approvals.close(request, PasswordResetRequest.Status.EXPIRED, admin, now, why=why)


def _expire_grant(request: RoleGrantRequest, admin: User | None, now: Any, why: str) -> None:
    _close_grant(request, RoleGrantRequest.Status.EXPIRED, admin, now, why=why)


def approve_role_grant(admin: User, request: RoleGrantRequest) -> User:
    """Approve a pending role grant as the second admin: the target gets the roles; return them.

    The roles are added to those the target holds now (staff follows the admin role), through
    the same change as set_roles: `auth.user.roles_changed` (by the approver, naming the request)
    and `auth.role_grant.approved`, both with the roles before and after. Raises
    UserChangeRefused (audited) unless the admin may manage users, for the requester, the target,
    an admin account the requester or the target controls (see controlled_by), and a superuser
    target unless the approver is one; RoleGrantConflict when the request is no longer pending
    or expired (an expired request is marked so, audited).
    """
    target = request.target
    attempt = "approve_role_grant"
    _check(admin, attempt, target, request=request.pk)
    if approvals.is_requester(admin, request.requested_by_id):
        why = "the requester cannot approve their own role grant"
        _refuse(admin, attempt, target, why, request=request.pk)
    if controlled_by(admin, request.requested_by):
        _refuse(
            admin,
            attempt,
            target,
            "the requester made this admin account or chose its password: "
            "a second admin must be someone else",
            request=request.pk,
        )
    if controlled_by(admin, target):
        _refuse(
            admin,
            attempt,
            target,
            "the user made this admin account or chose its password: "
            "a second admin must be someone else",
            request=request.pk,
        )
    approvals.expire_if_old(
        request,
        admin,
        lifetime=ROLE_GRANT_LIFETIME,
        conflict=RoleGrantConflict,
        close_expired=_expire_grant,
    )
    return _approve_role_grant(admin, request)


@transaction.atomic
def _approve_role_grant(admin: User, request: RoleGrantRequest) -> User:
    locked = approvals.pending(request, RoleGrantConflict)
    target = _locked(locked.target)
    held = role_names(target)
    wanted = [*held, *(role for role in locked.roles if role not in held)]
    _set_roles(
        admin,
        target,
        _role_groups(wanted),
        extra={"request": locked.pk, "requested_by": locked.requested_by.username},
    )
    locked.target = target
    _close_grant(locked, RoleGrantRequest.Status.APPROVED, admin, timezone.now(), roles_before=held)
    request.refresh_from_db()
    return target


def reject_role_grant(admin: User, request: RoleGrantRequest, reason: str) -> RoleGrantRequest:
    """Reject a pending role grant, giving a reason (the requester may withdraw theirs).

    The target's roles stay. Writes `auth.role_grant.rejected` with the reason. Raises
    UserChangeRefused (audited) unless the admin may manage users; ValueError for an empty
    reason; RoleGrantConflict when the request is no longer pending.
    """
    _check(admin, "reject_role_grant", request.target, not_self=False, request=request.pk)
    reason = reason.strip()
    if not reason:
        raise ValueError("a rejection needs a reason")
    return _reject_role_grant(admin, request, reason[:500])


@transaction.atomic
def _reject_role_grant(admin: User, request: RoleGrantRequest, reason: str) -> RoleGrantRequest:
    locked = approvals.pending(request, RoleGrantConflict)
    _close_grant(locked, RoleGrantRequest.Status.REJECTED, admin, timezone.now(), why=reason)
    request.refresh_from_db()
    return locked


# Roles from the identity provider's group claim ---------------------------------------------


@transaction.atomic
def apply_claimed_roles(
    user: User, *, add: Sequence[str], remove: Sequence[str], why: str
) -> tuple[list[str], list[str]]:
    """Add and remove roles as the user's group claim maps them; return the roles before and after.

    No admin acts here: a group mapped to a sensitive role had its second admin when the mapping
    was approved (accounts.oidc_mappings). Staff follows the admin role. The caller writes the
    events that name the claim. A removed role revokes the user's API tokens and ends their
    sessions, as an admin's removal does (audited). Raises ValueError for an unknown role.
    """
    stored = _locked(user)
    before = role_names(stored)
    with _recording():
        if remove:
            stored.groups.remove(*stored.groups.filter(name__in=list(remove)))
        if add:
            stored.groups.add(*_role_groups(add))
        after = role_names(stored)
        is_staff = ADMIN in after if ADMIN in (*add, *remove) else stored.is_staff
        if is_staff != stored.is_staff:
            stored.is_staff = is_staff
            stored.save(update_fields=["is_staff"])
    if removed := sorted(set(before) - set(after)):
        api_tokens.revoke_api_tokens(stored, actor=None, why=f"{why}: {', '.join(removed)}")
        sessions.end_all_sessions(stored, actor=None, why=f"{why}: {', '.join(removed)}")
    user.is_staff = stored.is_staff
    return before, after


# E-signing -------------------------------------------------------------------------------------


def unlock_signing(admin: User, user: User) -> SigningState:
    """Unlock a user's e-signing after wrong passwords (failures back to 0); return the state.

    Writes `security.signing.unlocked` with the state before and after (nothing if it was not
    locked and had no failures). Raises UserChangeRefused (audited) unless the admin may manage
    users, and for the admin's own signing.
    """
    _check(admin, "unlock_signing", user)
    return _unlock_signing(admin, user)


@transaction.atomic
def _unlock_signing(admin: User, user: User) -> SigningState:
    state, _ = SigningState.objects.get_or_create(user=user)
    state = SigningState.objects.select_for_update().get(pk=state.pk)
    before = {"failures": state.failures, "locked_at": state.locked_at}
    if state.failures == 0 and state.locked_at is None:
        return state
    state.failures = 0
    state.locked_at = None
    state.save(update_fields=["failures", "locked_at"])
    append_event(
        "security.signing.unlocked",
        actor=admin,
        chain=SYSTEM_CHAIN,
        data={
            **approvals.subject(user),
            "before": before,
            "after": {"failures": 0, "locked_at": None},
        },
    )
    return state


def expire_old_requests(now: datetime | None = None) -> dict[str, int]:
    """Mark pending password resets and role grants past their lifetime `expired` (audited).

    Run by Celery beat, so the lists never show a request as pending that can no longer be
    approved. Rows are claimed with SKIP LOCKED and re-checked, so two schedulers expire each
    request once. Returns how many of each kind expired.
    """
    now = now or timezone.now()
    expired = {"password_resets": 0, "role_grants": 0}
    with transaction.atomic():
        expired["password_resets"] = approvals.sweep_expired(
            PasswordResetRequest,
            lifetime=PASSWORD_RESET_LIFETIME,
            now=now,
            close_expired=_expire_reset,
        )
        expired["role_grants"] = approvals.sweep_expired(
            RoleGrantRequest, lifetime=ROLE_GRANT_LIFETIME, now=now, close_expired=_expire_grant
        )
    return expired
