from __future__ import annotations

import pytest
from django.test import Client

from accounts import roles
from audit.chain import append_event
from tests import personas

pytestmark = pytest.mark.django_db


def _client_for(user: object) -> Client:
    client = Client()
    client.force_login(user)  # type: ignore[arg-type]
    return client


def test_visitors_are_sent_to_the_login_page() -> None:
    response = Client().get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_visitors_cannot_read_the_audit_trail_or_its_partial() -> None:
    for headers in ({}, {"HX-Request": "true"}):
        response = Client().get("/audit/", headers=headers)
        assert response.status_code == 302
        assert response["Location"].startswith("/login/")


@pytest.mark.parametrize(
    "make", [personas.analyst, personas.officer, personas.admin, personas.outsider]
)
def test_only_auditors_read_the_audit_trail(make: object) -> None:
    client = _client_for(make())  # type: ignore[operator]
    assert client.get("/audit/").status_code == 403
    assert client.get("/audit/", headers={"HX-Request": "true"}).status_code == 403


def test_auditor_reads_the_audit_trail_and_filters_it() -> None:
    append_event("auth.login.failed", data={"username": "mallory"})
    append_event("config.agent.changed", data={"agent": "erp"})
    client = _client_for(personas.auditor())
    page = client.get("/audit/?action=auth.")
    assert page.status_code == 200
    assert b"auth.login.failed" in page.content
    assert b"config.agent.changed" not in page.content
    headers = {"HX-Request": "true", "HX-Target": "audit-table"}
    partial = client.get("/audit/?action=config.", headers=headers)
    assert b"config.agent.changed" in partial.content
    assert partial.content.lstrip().startswith(b'<div id="audit-table"')
    assert "HX-Request" in partial["Vary"]
    # An htmx request aimed elsewhere (a boosted link, a history restore) gets the whole page.
    other = client.get("/audit/", headers={"HX-Request": "true", "HX-Target": "main"})
    assert b"<html" in other.content


@pytest.mark.parametrize(
    ("make", "landing"),
    [
        (personas.analyst, "analyst"),
        (personas.officer, "compliance officer"),
        (personas.auditor, "auditor"),
        (personas.admin, "admin"),
        (personas.outsider, "none"),
    ],
)
def test_each_role_lands_on_its_own_page(make: object, landing: str) -> None:
    response = _client_for(make()).get("/")  # type: ignore[operator]
    assert response.status_code == 200
    assert f'data-landing="{landing}"'.encode() in response.content


@pytest.mark.parametrize(
    "make", [personas.analyst, personas.officer, personas.auditor, personas.outsider]
)
def test_only_admins_enter_the_django_admin(make: object) -> None:
    response = _client_for(make()).get("/admin/")  # type: ignore[operator]
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_admin_manages_users_but_is_no_superuser_and_cannot_decide_gates() -> None:
    user = personas.admin()
    client = _client_for(user)
    assert client.get("/admin/").status_code == 200
    assert client.get("/admin/auth/user/").status_code == 200
    assert not user.is_superuser
    assert not user.has_perm("oversight.decide_gate")
    assert not user.has_perm("oversight.view_audit")


def test_navigation_shows_each_role_only_what_it_may_use() -> None:
    pages = {
        "analyst": _client_for(personas.analyst()).get("/").content,
        "auditor": _client_for(personas.auditor()).get("/").content,
        "admin": _client_for(personas.admin()).get("/").content,
    }
    assert b'data-nav="audit"' in pages["auditor"]
    assert b'data-nav="audit"' not in pages["analyst"]
    assert b'data-nav="audit"' not in pages["admin"]
    assert b'data-nav="admin"' in pages["admin"]
    assert b'data-nav="admin"' not in pages["analyst"]
    assert b'data-nav="admin"' not in pages["auditor"]


def test_pages_carry_a_strict_content_security_policy() -> None:
    response = _client_for(personas.analyst()).get("/")
    policy = response["Content-Security-Policy"]
    assert "default-src 'self'" in policy
    assert "unsafe-inline" not in policy


# Every sentence on a landing page is true of the product today: what does not exist yet is
# announced as coming, never as a feature.
NOT_BUILT_YET = [
    "approve it, then agents execute",
    "complete the human tasks assigned",
    "trust learned",
    "stop switch",
]


def _supervisor() -> object:
    return personas.make_user("sue", roles.SUPERVISOR)


@pytest.mark.parametrize(
    "make", [personas.analyst, personas.officer, _supervisor, personas.auditor, personas.admin]
)
def test_landing_pages_claim_nothing_that_does_not_exist_yet(make: object) -> None:
    page = _client_for(make()).get("/").content.decode().lower()  # type: ignore[operator]
    for claim in NOT_BUILT_YET:
        assert claim not in page, claim


@pytest.mark.parametrize(
    "make", [personas.analyst, personas.officer, _supervisor, personas.auditor]
)
def test_landing_pages_say_that_approved_plans_run(make: object) -> None:
    page = _client_for(make()).get("/").content.decode()  # type: ignore[operator]
    note = page.split('data-note="execution"', 1)[1].split("</p>", 1)[0]
    assert "step" in note and "coming" not in note.lower()


def test_admin_landing_names_only_what_the_admin_configures() -> None:
    page = _client_for(personas.admin()).get("/").content.decode()
    assert "agents, tool risk classes, domain packs, the gating policy and reason codes" in page
    assert "decide no gate" in page


def test_a_supervisor_lands_on_the_reviewers_page_not_on_no_role() -> None:
    page = _client_for(_supervisor()).get("/").content.decode()
    assert 'data-landing="compliance supervisor"' in page
    assert "Gates escalated past their deadline come to you too." in page
    assert "No role yet" not in page
