"""The demo users: one per role, and a second analyst, officer and admin (separation of duties)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from accounts import roles, users

pytestmark = pytest.mark.django_db


def seed_demo(settings: Any, var_dir: Any) -> None:
    settings.DEMO = True
    settings.VAR_DIR = var_dir
    call_command("seed_demo", stdout=io.StringIO())


def test_demo_mode_seeds_a_second_analyst_who_may_do_the_first_ones_work_items(
    settings: Any, tmp_path: Any
) -> None:
    seed_demo(settings, tmp_path)
    users = get_user_model().objects
    groups = {u.username: list(u.groups.values_list("name", flat=True)) for u in users.all()}
    assert groups["analyst"] == groups["analyst2"] == ["analyst"]
    assert groups["officer"] == groups["officer2"] == ["compliance officer"]
    assert (tmp_path / "demo-users.json").exists()


def test_demo_mode_seeds_a_second_admin_who_approves_what_the_first_one_asks(
    settings: Any, tmp_path: Any
) -> None:
    seed_demo(settings, tmp_path)
    people = get_user_model().objects
    admin, admin2, analyst2 = (people.get(username=u) for u in ("admin", "admin2", "analyst2"))
    assert admin2.is_staff and users.role_names(admin2) == [roles.ADMIN]
    grant = users.set_roles(admin, analyst2, [roles.ANALYST, roles.OFFICER])
    assert grant is not None, "an officer grant waits for a second admin"
    users.approve_role_grant(admin2, grant)
    assert roles.OFFICER in users.role_names(people.get(pk=analyst2.pk))


def test_outside_demo_mode_no_demo_user_is_made(settings: Any) -> None:
    settings.DEMO = False
    with pytest.raises(CommandError, match="demo mode"):
        call_command("seed_demo")
    assert not get_user_model().objects.filter(username="analyst2").exists()
