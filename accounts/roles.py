"""The four roles, their permissions, and what each may see."""

from __future__ import annotations

from typing import Any

from django.apps import apps as global_apps
from django.contrib.auth.management import create_permissions
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group, Permission
from django.core.exceptions import PermissionDenied

ANALYST = "analyst"
OFFICER = "compliance officer"
# Officers who also decide the gates escalated past their deadline.
SUPERVISOR = "compliance supervisor"
AUDITOR = "auditor"
ADMIN = "admin"
ROLES = (ANALYST, OFFICER, SUPERVISOR, AUDITOR, ADMIN)


class NoRoleAllows(PermissionDenied):
    """Refused whatever roles the user holds (403): the page says why and suggests no role."""


# The role permissions. They belong to no single model: their codenames hang on the oversight
# app's `Capability` anchor (no table), where they have always been, so grants stay as they are.
SUBMIT_CASE = "oversight.submit_case"
VIEW_ALL_CASES = "oversight.view_all_cases"
VIEW_AUDIT = "oversight.view_audit"
CONFIGURE = "oversight.configure"
DECIDE_GATE = "oversight.decide_gate"
EDIT_PLAN = "oversight.edit_plan"
EXPORT_AUDIT = "oversight.export_audit"

# Admins manage users and configuration but hold no gate or audit-changing permission
# (separation of duties): they are staff, never superusers.
ROLE_PERMISSIONS: dict[str, tuple[str, ...]] = {
    ANALYST: (SUBMIT_CASE,),
    OFFICER: (VIEW_ALL_CASES, DECIDE_GATE, EDIT_PLAN),
    SUPERVISOR: (VIEW_ALL_CASES, DECIDE_GATE, EDIT_PLAN),
    AUDITOR: (VIEW_ALL_CASES, VIEW_AUDIT, EXPORT_AUDIT),
    ADMIN: (
        CONFIGURE,
        # Users are added and changed through accounts.admin, which checks
        # oversight.configure and goes through accounts.users.
        "auth.view_user",
        "auth.view_group",
        "planning.view_agent",
        "planning.add_agent",
        "planning.change_agent",
        "planning.view_tool",
        "planning.change_tool",
        "planning.view_domainpack",
        "planning.change_domainpack",
    ),
}


def role_of(user: AbstractBaseUser | AnonymousUser) -> str | None:
    """Return the user's role (the first of their role groups), or None."""
    if not user.is_authenticated:
        return None
    names = {group.name for group in user.groups.all()}  # type: ignore[attr-defined]
    return next((role for role in ROLES if role in names), None)


def _permission(codename: str) -> Permission:
    app_label, code = codename.split(".", 1)
    return Permission.objects.get(content_type__app_label=app_label, codename=code)


def sync_roles() -> None:
    """Create the role groups and set exactly their permissions; idempotent."""
    for role, codenames in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set([_permission(c) for c in codenames])


def sync_roles_after_migrate(sender: Any, apps: Any = global_apps, **kwargs: Any) -> None:
    """Run sync_roles after a migrate, once every app's permissions exist (created here first)."""
    for app_config in global_apps.get_app_configs():
        create_permissions(app_config, verbosity=0, using=kwargs.get("using", "default"))
    sync_roles()
