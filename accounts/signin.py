"""Password sign-in per user: the backend that refuses users whose password sign-in is off, and
the admins' switch for it.

A user whose password sign-in is off signs in only through the identity provider
(accounts.oidc). The password form says so only to someone who typed that user's right password:
to anyone else the answer is the usual "didn't match", so the flag tells nobody which accounts
exist. Every place that checks a password (the sign-in page, the admin's, `POST /api/auth/token`)
goes through this backend.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import AbstractBaseUser, User
from django.db import transaction
from django.http import HttpRequest

from accounts import approvals, users
from accounts.models import PasswordSignInOff
from audit.chain import SYSTEM_CHAIN, append_event

# Set on the request when the right password of such a user was refused.
REFUSED_ATTRIBUTE = "casehub_password_sign_in_off"
MESSAGE = "This account signs in through {provider} only, not with a password."


def is_password_sign_in_off(user: AbstractBaseUser) -> bool:
    """Return True if the user may sign in only through the identity provider."""
    return PasswordSignInOff.objects.filter(user_id=user.pk).exists()


def was_refused(request: HttpRequest | None) -> bool:
    """Tell whether this request's right password was refused because password sign-in is off."""
    return bool(getattr(request, REFUSED_ATTRIBUTE, False))


class PasswordBackend(ModelBackend):
    """Django's username and password backend, refusing users whose password sign-in is off."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None or not is_password_sign_in_off(user):
            return user
        if request is not None:
            setattr(request, REFUSED_ATTRIBUTE, True)
        return None


def set_password_sign_in(admin: User, user: User, *, off: bool) -> bool:
    """Turn a user's password sign-in off (identity provider only) or back on; return whether
    anything changed.

    Writes `auth.user.password_sign_in_changed` with the flag before and after. Raises
    UserChangeRefused (audited) unless the admin may manage users, for the admin's own account
    and for a superuser changed by a non-superuser.
    """
    attempt = "set_password_sign_in"
    if not users.may_manage_users(admin):
        users.refuse_change(admin, attempt, user, "only admins manage users")
    if user.pk == admin.pk:
        users.refuse_change(
            admin, attempt, user, "nobody changes their own sign-in: another admin does"
        )
    if user.is_superuser and not admin.is_superuser:
        users.refuse_change(admin, attempt, user, "only a superuser changes a superuser")
    return _set_password_sign_in(admin, user, off)


@transaction.atomic
def _set_password_sign_in(admin: User, user: User, off: bool) -> bool:
    User.objects.select_for_update().filter(pk=user.pk).first()
    before = is_password_sign_in_off(user)
    if before == off:
        return False
    if off:
        PasswordSignInOff.objects.create(user=user)
    else:
        PasswordSignInOff.objects.filter(user=user).delete()
    append_event(
        "auth.user.password_sign_in_changed",
        actor=admin,
        chain=SYSTEM_CHAIN,
        data={
            **approvals.subject(user),
            "before": {"password_sign_in": not before},
            "after": {"password_sign_in": not off},
        },
    )
    return True
