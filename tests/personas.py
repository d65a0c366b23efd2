"""Personas for database tests, built by plain functions (no fixtures files)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser, Group

from accounts import roles

PASSWORD = "correct-horse-battery-staple"


def make_user(username: str, role: str | None, *, password: str = PASSWORD) -> AbstractUser:
    """Create a user in a role group (None: a signed-up outsider with no role)."""
    roles.sync_roles()
    user = get_user_model().objects.create_user(username=username, password=password)
    if role is not None:
        user.groups.add(Group.objects.get(name=role))
    if role == roles.ADMIN:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    return user


def analyst(username: str = "ana") -> AbstractUser:
    return make_user(username, roles.ANALYST)


def officer(username: str = "olivia") -> AbstractUser:
    return make_user(username, roles.OFFICER)


def second_officer(username: str = "oscar") -> AbstractUser:
    return make_user(username, roles.OFFICER)


def auditor(username: str = "audrey") -> AbstractUser:
    return make_user(username, roles.AUDITOR)


def admin(username: str = "adam") -> AbstractUser:
    return make_user(username, roles.ADMIN)


def outsider(username: str = "otto") -> AbstractUser:
    return make_user(username, None)
