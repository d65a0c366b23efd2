from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import personas

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROLES = [
    (personas.analyst, "analyst", set(), {"audit", "admin"}),
    (personas.officer, "compliance officer", set(), {"audit", "admin"}),
    (personas.auditor, "auditor", {"audit"}, {"admin"}),
    (personas.admin, "admin", {"admin"}, {"audit"}),
]


def _log_in(page: Any, username: str, password: str = personas.PASSWORD) -> None:
    page.goto("/")
    assert "/login/" in page.url
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")


@pytest.mark.parametrize(("make", "role", "shown", "hidden"), ROLES, ids=[r[1] for r in ROLES])
def test_each_role_logs_in_and_sees_its_navigation(
    page: Any, make: Any, role: str, shown: set[str], hidden: set[str], tmp_path: Path
) -> None:
    user = make()
    _log_in(page, user.username)
    page.wait_for_selector(f'[data-landing="{role}"]')
    assert page.text_content(".role-badge") == role
    nav = set(page.eval_on_selector_all("[data-nav]", "els => els.map(e => e.dataset.nav)"))
    assert shown <= nav
    assert not (hidden & nav)
    page.screenshot(path=str(tmp_path / f"{role}.png"), full_page=True)


def test_wrong_password_keeps_the_visitor_on_the_login_page(page: Any) -> None:
    personas.analyst()
    _log_in(page, "ana", "not-the-password")
    page.wait_for_selector("[role=alert]")
    assert "/login/" in page.url


def test_log_out_returns_to_the_login_page(page: Any) -> None:
    personas.auditor()
    _log_in(page, "audrey")
    page.wait_for_selector('[data-landing="auditor"]')
    page.click("text=Log out")
    page.wait_for_url("**/login/")
    page.goto("/audit/")
    assert "/login/" in page.url


def test_pages_load_without_console_errors_under_the_csp(page: Any) -> None:
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    personas.auditor()
    _log_in(page, "audrey")
    page.wait_for_selector('[data-landing="auditor"]')
    page.goto("/audit/")
    page.fill("input[name=action]", "auth.")
    page.press("input[name=action]", "Enter")
    page.wait_for_selector("#audit-table >> text=auth.login.succeeded")
    assert errors == []
