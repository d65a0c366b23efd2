"""Granting a sensitive role waits for a second admin (RELIABILITY O10, R1).

Without it an admin could create a "sock-puppet" (a user whose password they chose, or an
analyst whose password they reset at once), make it an officer, auditor or admin, sign in as it
and approve gates. Through accounts.users and through the admin's real forms.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts import roles, users
from accounts.models import RoleGrantRequest
from audit.chain import SYSTEM_CHAIN, verify_chain
from audit.models import AuditEvent
from tests import personas

pytestmark = pytest.mark.django_db

GRANTS_URL = reverse("admin:accounts_rolegrantrequest_changelist")
SOCK_PASSWORD = "a-sock-puppets-passphrase-7"


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def events(action: str, user: User | None = None) -> list[AuditEvent]:
    found = AuditEvent.objects.filter(chain=SYSTEM_CHAIN, action=action).order_by("seq")
    if user is not None:
        found = found.filter(data__user_id=user.pk)
    return list(found)


def fresh(user: User) -> User:
    """The stored user, without cached permissions."""
    return User.objects.get(pk=user.pk)


def select_action(action: str, *pks: int, **extra: str) -> dict[str, Any]:
    return {"action": action, "_selected_action": [str(pk) for pk in pks], "index": "0", **extra}


def pending(user: User) -> RoleGrantRequest:
    grant = users.pending_role_grant(user)
    assert grant is not None, f"no pending role grant for {user.username}"
    return grant


def independent_admin(username: str, *, approver: User, requester: User) -> User:
    """An admin made through the two-admin flow: `requester` asks, `approver` approves."""
    account = personas.analyst(username)
    grant = users.set_roles(requester, account, [roles.ADMIN])
    assert grant is not None
    users.approve_role_grant(approver, grant)
    return fresh(account)


# The sock-puppet --------------------------------------------------------------------------------


@pytest.mark.scenario("O10")
def test_a_user_an_admin_creates_as_officer_is_none_until_a_second_admin_approves() -> None:
    adam, alice = personas.admin("adam"), personas.admin("alice")
    sock = users.create_user(
        adam, username="sock", password=SOCK_PASSWORD, roles=[roles.ANALYST, roles.OFFICER]
    )
    # Created, with the password adam knows, but without the officer role.
    assert sock.check_password(SOCK_PASSWORD)
    assert users.role_names(sock) == [roles.ANALYST]
    assert not fresh(sock).has_perm("oversight.decide_gate")
    grant = pending(sock)
    assert (grant.requested_by, grant.roles, grant.status) == (adam, [roles.OFFICER], "pending")
    (created,) = events("auth.user.created", sock)
    assert created.data["after"]["roles"] == [roles.ANALYST]
    (requested,) = events("auth.role_grant.requested", sock)
    assert requested.actor_user == adam
    assert requested.data["grant"] == [roles.OFFICER]
    assert requested.data["before"] == {"status": None, "roles": [roles.ANALYST]}
    assert requested.data["after"] == {"status": "pending", "roles": [roles.ANALYST]}

    # Adam cannot approve it himself.
    with pytest.raises(users.UserChangeRefused, match="cannot approve their own"):
        users.approve_role_grant(adam, grant)
    assert not fresh(sock).has_perm("oversight.decide_gate")

    # A second admin approves: now sock is an officer.
    users.approve_role_grant(alice, grant)
    grant.refresh_from_db()
    assert (grant.status, grant.decided_by) == ("approved", alice)
    assert grant.decided_at is not None
    assert users.role_names(sock) == [roles.ANALYST, roles.OFFICER]
    assert fresh(sock).has_perm("oversight.decide_gate")
    (approved,) = events("auth.role_grant.approved", sock)
    assert approved.actor_user == alice
    assert approved.data["requested_by"] == "adam"
    assert approved.data["before"] == {"status": "pending", "roles": [roles.ANALYST]}
    assert approved.data["after"] == {
        "status": "approved",
        "roles": [roles.ANALYST, roles.OFFICER],
    }
    # The same change as set_roles writes, by the approver, naming the request.
    (changed,) = events("auth.user.roles_changed", sock)
    assert changed.actor_user == alice
    assert changed.data["request"] == grant.pk
    assert changed.data["before"] == {"roles": [roles.ANALYST], "is_staff": False}
    assert changed.data["after"] == {"roles": [roles.ANALYST, roles.OFFICER], "is_staff": False}
    assert SOCK_PASSWORD not in json.dumps([event.data for event in AuditEvent.objects.all()])
    assert verify_chain(SYSTEM_CHAIN) == []


@pytest.mark.scenario("O10")
@pytest.mark.parametrize("role", [roles.OFFICER, roles.SUPERVISOR, roles.AUDITOR, roles.ADMIN])
def test_an_analyst_whose_password_was_reset_at_once_gets_no_sensitive_role_alone(
    role: str,
) -> None:
    adam = personas.admin("adam")
    analyst = personas.analyst()
    assert users.request_password_reset(adam, analyst, SOCK_PASSWORD) is None  # at once
    grant = users.set_roles(adam, analyst, [roles.ANALYST, role])
    assert grant is not None and grant.roles == [role]
    analyst = fresh(analyst)
    assert users.role_names(analyst) == [roles.ANALYST]
    assert analyst.is_staff is False
    assert not users.may_manage_users(analyst)
    assert not analyst.has_perm("oversight.decide_gate")
    assert not analyst.has_perm("oversight.view_audit")
    assert events("auth.user.roles_changed", analyst) == []


# Who may approve --------------------------------------------------------------------------------


@pytest.mark.scenario("O10")
def test_neither_the_requester_nor_the_user_nor_an_admin_the_requester_made_approves() -> None:
    adam, alice = personas.admin("adam"), personas.admin("alice")
    # An admin account adam created (its admin role approved by alice): adam controls it.
    puppet = users.create_user(adam, username="puppet", password=SOCK_PASSWORD, roles=[roles.ADMIN])
    assert users.role_names(puppet) == [] and not fresh(puppet).is_staff
    with pytest.raises(users.UserChangeRefused, match="only admins"):  # not yet an admin
        users.approve_role_grant(puppet, pending(puppet))
    users.approve_role_grant(alice, pending(puppet))
    puppet = fresh(puppet)
    assert puppet.is_staff and users.may_manage_users(puppet)

    target = users.create_user(adam, username="xena", password=SOCK_PASSWORD, roles=[roles.OFFICER])
    grant = pending(target)
    refused = [
        (adam, "cannot approve their own"),
        (target, "only admins manage users"),
        (puppet, "requester made this admin account"),
    ]
    for approver, why in refused:
        with pytest.raises(users.UserChangeRefused, match=why):
            users.approve_role_grant(approver, grant)
    grant.refresh_from_db()
    assert grant.status == "pending"
    assert users.role_names(target) == []
    refusals = events("auth.user.change_refused", target)
    assert [event.data["attempt"] for event in refusals] == ["approve_role_grant"] * 3
    assert [event.actor_user for event in refusals] == [adam, target, puppet]
    assert all(event.data["request"] == grant.pk for event in refusals)
    assert events("auth.role_grant.approved", target) == []

    users.approve_role_grant(alice, grant)  # someone independent may
    assert users.role_names(target) == [roles.OFFICER]


@pytest.mark.scenario("O10")
def test_an_admin_cannot_approve_a_grant_of_their_own_roles() -> None:
    adam, amir = personas.admin("adam"), personas.admin("amir")
    grant = users.set_roles(adam, amir, [roles.ADMIN, roles.AUDITOR])
    assert grant is not None and grant.roles == [roles.AUDITOR]
    with pytest.raises(users.UserChangeRefused, match="nobody changes their own"):
        users.approve_role_grant(amir, grant)
    assert users.role_names(amir) == [roles.ADMIN]
    grant.refresh_from_db()
    assert grant.status == "pending"


def test_an_admin_made_by_the_requester_through_a_grant_is_theirs_too() -> None:
    adam, alice, bob = personas.admin("adam"), personas.admin("alice"), personas.admin("bob")
    # Adam asked for pat's admin role and bob approved it: pat is no second admin to adam.
    pat = independent_admin("pat", approver=bob, requester=adam)
    assert users.controlled_by(pat, adam)
    assert users.controlled_by(pat, bob)  # bob made pat an admin too
    assert not users.controlled_by(alice, adam)
    target = personas.analyst("tom")
    grant = users.set_roles(adam, target, [roles.OFFICER])
    assert grant is not None
    with pytest.raises(users.UserChangeRefused, match="requester made this admin"):
        users.approve_role_grant(pat, grant)
    users.approve_role_grant(alice, grant)
    assert users.role_names(target) == [roles.OFFICER]


def test_an_admin_the_user_made_cannot_approve_the_users_grant() -> None:
    adam, alice, bob = personas.admin("adam"), personas.admin("alice"), personas.admin("bob")
    # Alice created carl with a password she knows; bob approved his admin role.
    carl = users.create_user(alice, username="carl", password=SOCK_PASSWORD, roles=[roles.ADMIN])
    users.approve_role_grant(bob, pending(carl))
    grant = users.set_roles(adam, alice, [roles.ADMIN, roles.AUDITOR])
    assert grant is not None
    with pytest.raises(users.UserChangeRefused, match="the user made this admin account"):
        users.approve_role_grant(fresh(carl), grant)
    assert users.role_names(alice) == [roles.ADMIN]
    users.approve_role_grant(bob, grant)
    assert users.role_names(alice) == [roles.AUDITOR, roles.ADMIN]


# Rejection, expiry, supersession ----------------------------------------------------------------


def test_a_rejected_grant_never_applies() -> None:
    adam, alice = personas.admin("adam"), personas.admin("alice")
    analyst = personas.analyst()
    grant = users.set_roles(adam, analyst, [roles.ANALYST, roles.AUDITOR])
    assert grant is not None
    with pytest.raises(ValueError, match="reason"):
        users.reject_role_grant(alice, grant, "   ")
    grant.refresh_from_db()
    assert grant.status == "pending"

    users.reject_role_grant(alice, grant, "not trained for audits yet")
    grant.refresh_from_db()
    assert (grant.status, grant.decided_by, grant.reason) == (
        "rejected",
        alice,
        "not trained for audits yet",
    )
    with pytest.raises(users.RoleGrantConflict, match="rejected"):
        users.approve_role_grant(personas.admin("bob"), grant)
    assert users.role_names(analyst) == [roles.ANALYST]
    (rejected,) = events("auth.role_grant.rejected", analyst)
    assert rejected.actor_user == alice
    assert rejected.data["why"] == "not trained for audits yet"
    assert rejected.data["grant"] == [roles.AUDITOR]
    assert rejected.data["before"] == {"status": "pending", "roles": [roles.ANALYST]}
    assert rejected.data["after"] == {"status": "rejected", "roles": [roles.ANALYST]}


def test_the_requester_may_withdraw_their_request() -> None:
    adam = personas.admin("adam")
    analyst = personas.analyst()
    grant = users.set_roles(adam, analyst, [roles.OFFICER])
    assert grant is not None
    users.reject_role_grant(adam, grant, "asked for the wrong user")
    grant.refresh_from_db()
    assert grant.status == "rejected"
    assert users.role_names(analyst) == []


def test_an_expired_grant_never_applies() -> None:
    lifetime = timedelta(hours=settings.CASEHUB_PASSWORD_RESET_LIFETIME_HOURS)
    assert lifetime == users.ROLE_GRANT_LIFETIME
    adam, alice = personas.admin("adam"), personas.admin("alice")
    analyst = personas.analyst()
    old = users.set_roles(adam, analyst, [roles.ANALYST, roles.OFFICER])
    assert old is not None
    RoleGrantRequest.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - users.ROLE_GRANT_LIFETIME - timedelta(minutes=1)
    )
    old.refresh_from_db()
    with pytest.raises(users.RoleGrantConflict, match="expired"):
        users.approve_role_grant(alice, old)
    old.refresh_from_db()
    assert (old.status, old.decided_by) == ("expired", alice)
    assert users.role_names(analyst) == [roles.ANALYST]
    (expired,) = events("auth.role_grant.expired", analyst)
    assert expired.data["why"] == "too old to approve"
    assert expired.data["after"] == {"status": "expired", "roles": [roles.ANALYST]}
    with pytest.raises(users.RoleGrantConflict, match="no longer pending"):
        users.approve_role_grant(alice, old)

    # Just inside the lifetime it still applies.
    recent = users.set_roles(adam, analyst, [roles.ANALYST, roles.OFFICER])
    assert recent is not None
    RoleGrantRequest.objects.filter(pk=recent.pk).update(
        created_at=timezone.now() - users.ROLE_GRANT_LIFETIME + timedelta(minutes=5)
    )
    recent.refresh_from_db()
    users.approve_role_grant(alice, recent)
    assert users.role_names(analyst) == [roles.ANALYST, roles.OFFICER]


def test_a_new_request_supersedes_the_pending_one() -> None:
    adam, alice = personas.admin("adam"), personas.admin("alice")
    analyst = personas.analyst()
    first = users.set_roles(adam, analyst, [roles.ANALYST, roles.ADMIN])
    second = users.set_roles(adam, analyst, [roles.ANALYST, roles.AUDITOR])
    assert first is not None and second is not None
    first.refresh_from_db()
    assert (first.status, second.status) == ("expired", "pending")
    assert users.pending_role_grant(analyst) == second
    (superseded,) = events("auth.role_grant.expired", analyst)
    assert superseded.data["why"] == "superseded"
    assert superseded.data["request"] == first.pk
    with pytest.raises(users.RoleGrantConflict):
        users.approve_role_grant(alice, first)
    users.approve_role_grant(alice, second)
    assert users.role_names(analyst) == [roles.ANALYST, roles.AUDITOR]
    assert not fresh(analyst).is_staff


# What stays immediate ---------------------------------------------------------------------------


def test_removing_roles_and_adding_the_analyst_role_apply_at_once() -> None:
    adam = personas.admin("adam")
    officer, outsider = personas.officer(), personas.outsider()
    assert users.set_roles(adam, outsider, [roles.ANALYST]) is None
    assert users.role_names(outsider) == [roles.ANALYST]
    assert users.set_roles(adam, officer, [roles.OFFICER, roles.ANALYST]) is None  # held already
    assert users.role_names(officer) == [roles.ANALYST, roles.OFFICER]
    assert users.set_roles(adam, officer, [roles.ANALYST]) is None
    assert users.role_names(officer) == [roles.ANALYST]
    assert not RoleGrantRequest.objects.exists()
    assert events("auth.role_grant.requested") == []


def test_a_mixed_change_removes_at_once_and_grants_later() -> None:
    adam, alice = personas.admin("adam"), personas.admin("alice")
    officer = personas.officer()
    grant = users.set_roles(adam, officer, [roles.AUDITOR])
    assert grant is not None and grant.roles == [roles.AUDITOR]
    assert users.role_names(officer) == []  # the officer role went at once
    (removed,) = events("auth.user.roles_changed", officer)
    assert removed.data["after"] == {"roles": [], "is_staff": False}
    users.approve_role_grant(alice, grant)
    assert users.role_names(officer) == [roles.AUDITOR]


def test_approval_adds_to_the_roles_held_then() -> None:
    adam, alice = personas.admin("adam"), personas.admin("alice")
    analyst = personas.analyst()
    grant = users.set_roles(adam, analyst, [roles.ANALYST, roles.OFFICER])
    assert grant is not None
    assert users.set_roles(alice, analyst, []) is None  # meanwhile the analyst role goes
    users.approve_role_grant(alice, grant)
    assert users.role_names(analyst) == [roles.OFFICER]  # not put back by the approval


# Through the admin's forms ----------------------------------------------------------------------


def add_form(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "username": "nadia",
        "first_name": "Nadia",
        "last_name": "Novak",
        "email": "nadia@example.org",
        "password1": SOCK_PASSWORD,
        "password2": SOCK_PASSWORD,
        "roles": [roles.ANALYST, roles.OFFICER],
    }
    data.update(changes)
    return data


@pytest.mark.scenario("O10")
def test_through_the_admin_forms_the_officer_role_waits_for_a_second_admin() -> None:
    adam, alice = personas.admin("adam"), personas.admin("alice")
    page = client_for(adam).post(reverse("admin:auth_user_add"), add_form(), follow=True)
    assert page.status_code == 200
    html = page.content.decode()
    # The message names the menu the admin index shows the requests under, and the role as it is.
    assert (
        "The compliance officer role of nadia waits for a second admin "
        "(Accounts &gt; Role grant requests)." in html
    )
    index = client_for(adam).get(reverse("admin:index")).content.decode()
    accounts = index.split('<div class="app-accounts module', 1)[1].split("</table>", 1)[0]
    assert ">Accounts</a>" in accounts and ">Role grant requests</a>" in accounts
    nadia = User.objects.get(username="nadia")
    assert nadia.check_password(SOCK_PASSWORD)
    assert users.role_names(nadia) == [roles.ANALYST]
    grant = pending(nadia)
    assert grant.requested_by == adam

    # The user's page says what waits; the list shows the request and who controls the account.
    change = client_for(adam).get(reverse("admin:auth_user_change", args=[nadia.pk]))
    assert (
        "The compliance officer role waits for a second admin (Accounts > Role grant requests)."
        in change.content.decode()
    )
    listing = client_for(alice).get(GRANTS_URL)
    assert listing.status_code == 200
    assert "nadia" in listing.content.decode() and 'name="reason"' in listing.content.decode()

    # Adam's approval through the list action is refused (and recorded); nothing changes.
    response = client_for(adam).post(
        GRANTS_URL, select_action("approve_selected", grant.pk), follow=True
    )
    assert "cannot approve their own role grant" in response.content.decode()
    grant.refresh_from_db()
    assert grant.status == "pending"
    assert not fresh(nadia).has_perm("oversight.decide_gate")
    (refusal,) = events("auth.user.change_refused", nadia)
    assert (refusal.actor_user, refusal.data["attempt"]) == (adam, "approve_role_grant")

    # Alice approves it.
    response = client_for(alice).post(GRANTS_URL, select_action("approve_selected", grant.pk))
    assert response.status_code == 302
    grant.refresh_from_db()
    assert (grant.status, grant.decided_by) == ("approved", alice)
    assert fresh(nadia).has_perm("oversight.decide_gate")


def test_through_the_change_form_and_a_rejection_in_the_list() -> None:
    adam, alice = personas.admin("adam"), personas.admin("alice")
    analyst = personas.analyst()
    form = {
        "username": analyst.username,
        "is_active": "on",
        "roles": [roles.ANALYST, roles.ADMIN],
    }
    page = client_for(adam).post(
        reverse("admin:auth_user_change", args=[analyst.pk]), form, follow=True
    )
    assert page.status_code == 200
    assert "The admin role of ana waits for a second admin" in page.content.decode()
    analyst = fresh(analyst)
    assert users.role_names(analyst) == [roles.ANALYST] and not analyst.is_staff
    grant = pending(analyst)

    # Saving the form again without the role (say, a new e-mail) leaves the request pending.
    form = {**form, "roles": [roles.ANALYST], "email": "ana@example.org"}
    client_for(adam).post(reverse("admin:auth_user_change", args=[analyst.pk]), form)
    grant.refresh_from_db()
    assert grant.status == "pending"

    # A rejection needs a reason.
    client_for(alice).post(GRANTS_URL, select_action("reject_selected", grant.pk))
    grant.refresh_from_db()
    assert grant.status == "pending"
    client_for(alice).post(
        GRANTS_URL, select_action("reject_selected", grant.pk, reason="one admin is enough")
    )
    grant.refresh_from_db()
    assert (grant.status, grant.decided_by, grant.reason) == (
        "rejected",
        alice,
        "one admin is enough",
    )
    assert users.role_names(analyst) == [roles.ANALYST]
    assert not fresh(analyst).is_staff


def test_the_role_grant_requests_are_for_admins_only(officer: User) -> None:
    roles.sync_roles()
    adam = personas.admin("adam")
    assert "Role grant requests" in client_for(adam).get(reverse("admin:index")).content.decode()
    assert client_for(officer).get(GRANTS_URL).status_code == 302  # to the admin's login
    grant = users.set_roles(adam, personas.analyst(), [roles.OFFICER])
    assert grant is not None
    with pytest.raises(users.UserChangeRefused):
        users.approve_role_grant(officer, grant)
    with pytest.raises(users.UserChangeRefused):
        users.reject_role_grant(officer, grant, "no")
    grant.refresh_from_db()
    assert grant.status == "pending"
