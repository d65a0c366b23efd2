"""Seed the demo: one user per role plus a second analyst, officer and admin, the domain packs with
their agents and tools, and the packs' demo systems: the invoice ERP, the incident estate and the
fraud account data (demo mode only)."""

from __future__ import annotations

import json
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts import roles
from audit.chain import append_event
from planning.catalogue import load_demo_systems, sync_packs

DEMO_USERS: tuple[tuple[str, str, str], ...] = (
    ("analyst", roles.ANALYST, "Ana Lyst"),
    # A second analyst does the work items of the first one's cases (never the submitter).
    ("analyst2", roles.ANALYST, "Andy Second-Analyst"),
    ("officer", roles.OFFICER, "Olivia Officer"),
    ("officer2", roles.OFFICER, "Oscar Second-Officer"),
    ("supervisor", roles.SUPERVISOR, "Sam Supervisor"),
    ("auditor", roles.AUDITOR, "Audrey Auditor"),
    ("admin", roles.ADMIN, "Adam Admin"),
    # A second admin approves what the first one asks (a role grant, a password reset, a policy).
    ("admin2", roles.ADMIN, "Ada Second-Admin"),
)


class Command(BaseCommand):
    help = "Create the demo users (CASEHUB_DEMO=1 only) and print their passwords."

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEMO:
            raise CommandError("Demo users exist only in demo mode: set CASEHUB_DEMO=1.")
        credentials = self._credentials()
        with transaction.atomic():
            roles.sync_roles()
            for username, role, full_name in DEMO_USERS:
                self._ensure_user(username, role, full_name, credentials[username])
            sync_packs()
            loaded = load_demo_systems()
        for pack, rows in loaded.items():
            if rows:
                self.stdout.write(f"Loaded {rows} rows of the {pack} pack's demo systems.")
        self.stdout.write("Demo logins (demo mode only):")
        for username, role, _ in DEMO_USERS:
            self.stdout.write(f"  {username:<10} {credentials[username]:<24} {role}")

    def _credentials(self) -> dict[str, str]:
        # Generated once per installation and kept under var/, so restarts print the same ones.
        path = settings.VAR_DIR / "demo-users.json"
        stored: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
        for username, _, _ in DEMO_USERS:
            stored.setdefault(username, secrets.token_urlsafe(9))
        path.write_text(json.dumps(stored, indent=2))
        path.chmod(0o600)
        return stored

    def _ensure_user(self, username: str, role: str, full_name: str, password: str) -> None:
        user_model = get_user_model()
        first, _, last = full_name.partition(" ")
        user, created = user_model.objects.get_or_create(
            username=username, defaults={"first_name": first, "last_name": last}
        )
        user.is_staff = role == roles.ADMIN
        user.is_superuser = False
        user.set_password(password)
        user.save()
        user.groups.set([Group.objects.get(name=role)])
        if created:
            append_event(
                "auth.user.created", data={"username": username, "role": role, "demo": True}
            )
