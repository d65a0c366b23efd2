"""The demo users: one per role, and a second analyst and officer for separation of duties."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def test_demo_mode_seeds_a_second_analyst_who_may_do_the_first_ones_work_items(
    settings: Any, tmp_path: Any
) -> None:
    settings.DEMO = True
    settings.VAR_DIR = tmp_path
    call_command("seed_demo", stdout=io.StringIO())
    users = get_user_model().objects
    groups = {u.username: list(u.groups.values_list("name", flat=True)) for u in users.all()}
    assert groups["analyst"] == groups["analyst2"] == ["analyst"]
    assert groups["officer"] == groups["officer2"] == ["compliance officer"]
    assert (tmp_path / "demo-users.json").exists()


def test_outside_demo_mode_no_demo_user_is_made(settings: Any) -> None:
    settings.DEMO = False
    with pytest.raises(CommandError, match="demo mode"):
        call_command("seed_demo")
    assert not get_user_model().objects.filter(username="analyst2").exists()
