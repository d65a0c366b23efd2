"""User administration: admins never escalate themselves (R1, O10), and every user, role and
password change is in the trail with its before and after.

Through the admin's real forms (a Client signed in as the admin persona) and through the use
cases of accounts.users; changes made elsewhere (the shell) are caught by the signals.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts import roles, users
from accounts.models import PasswordResetRequest, SigningState
from audit.chain import SYSTEM_CHAIN, verify_chain
from audit.models import AuditEvent
from tests import personas

pytestmark = pytest.mark.django_db

NEW_PASSWORD = "a-brand-new-passphrase-42"


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def events(action: str, user: User | None = None) -> list[AuditEvent]:
    found = AuditEvent.objects.filter(chain=SYSTEM_CHAIN, action=action).order_by("seq")
    if user is not None:
        found = found.filter(data__user_id=user.pk)
    return list(found)


def user_events(user: User) -> list[str]:
    """Every system-chain action about one user, in order."""
    found = AuditEvent.objects.filter(chain=SYSTEM_CHAIN, data__user_id=user.pk).order_by("seq")
    return [event.action for event in found]


def change_url(user: Any) -> str:
    return reverse("admin:auth_user_change", args=[user.pk])


def profile_form(user: User, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "username": user.username,
        "first_name": user.first_name,
        "last_name": user.last_name,
        "email": user.email,
        "is_active": "on" if user.is_active else "",
        "roles": users.role_names(user),
    }
    data.update(changes)
    return {key: value for key, value in data.items() if value not in ("", None)}


def add_form(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "username": "nadia",
        "first_name": "Nadia",
        "last_name": "Novak",
        "email": "nadia@example.org",
        "password1": personas.PASSWORD,
        "password2": personas.PASSWORD,
        "roles": [roles.ANALYST],
    }
    data.update(changes)
    return data


def select_action(action: str, *pks: int) -> dict[str, Any]:
    return {"action": action, "_selected_action": [str(pk) for pk in pks], "index": "0"}


# Creating users --------------------------------------------------------------------------------


@pytest.mark.scenario("O10")
def test_an_admin_creates_an_analyst_through_the_form_and_it_is_audited(admin_user: User) -> None:
    response = client_for(admin_user).post(reverse("admin:auth_user_add"), add_form())
    assert response.status_code == 302, response.content.decode()[:3000]
    nadia = User.objects.get(username="nadia")
    assert users.role_names(nadia) == [roles.ANALYST]
    assert (nadia.is_staff, nadia.is_superuser, nadia.is_active) == (False, False, True)
    assert nadia.check_password(personas.PASSWORD)
    (event,) = events("auth.user.created", nadia)
    assert event.actor_user == admin_user
    assert event.data["before"] is None
    assert event.data["after"] == {
        "username": "nadia",
        "first_name": "Nadia",
        "last_name": "Novak",
        "email": "nadia@example.org",
        "is_active": True,
        "is_staff": False,
        "is_superuser": False,
        "roles": [roles.ANALYST],
    }
    # One event from the use case, none doubled by the signals.
    assert user_events(nadia) == ["auth.user.created"]
    assert personas.PASSWORD not in json.dumps(event.data)


@pytest.mark.scenario("O10")
@pytest.mark.parametrize(
    "tamper", [{"is_superuser": "on"}, {"is_staff": "on"}, {"user_permissions": "1"}]
)
def test_an_admin_cannot_create_a_superuser_or_staff_user(
    admin_user: User, tamper: dict[str, str]
) -> None:
    response = client_for(admin_user).post(reverse("admin:auth_user_add"), add_form(**tamper))
    assert response.status_code == 403
    assert not User.objects.filter(username="nadia").exists()
    (refusal,) = events("auth.user.change_refused")
    assert refusal.actor_user == admin_user
    assert refusal.data["attempt"] == "admin_form"
    assert next(iter(tamper)) in refusal.data["why"]


def test_the_add_form_offers_no_superuser_staff_or_permission_fields(admin_user: User) -> None:
    page = client_for(admin_user).get(reverse("admin:auth_user_add")).content.decode()
    for name in ("is_superuser", "is_staff", "user_permissions", 'name="groups"'):
        assert name not in page
    for role in roles.ROLES:
        assert f'value="{role}"' in page


def test_staff_follows_the_admin_role(admin_user: User) -> None:
    response = client_for(admin_user).post(
        reverse("admin:auth_user_add"), add_form(username="ada", roles=[roles.ADMIN])
    )
    assert response.status_code == 302
    ada = User.objects.get(username="ada")
    assert (ada.is_staff, ada.is_superuser) == (False, False)  # the admin role waits
    grant = users.pending_role_grant(ada)
    assert grant is not None
    users.approve_role_grant(personas.admin("alice"), grant)
    ada.refresh_from_db()
    assert (ada.is_staff, ada.is_superuser) == (True, False)
    assert users.role_names(ada) == [roles.ADMIN]
    assert users.set_roles(admin_user, ada, [roles.ANALYST]) is None  # removing is immediate
    ada.refresh_from_db()
    assert ada.is_staff is False
    granted, removed = events("auth.user.roles_changed", ada)
    assert granted.data["before"] == {"roles": [], "is_staff": False}
    assert granted.data["after"] == {"roles": [roles.ADMIN], "is_staff": True}
    assert removed.data["before"] == {"roles": [roles.ADMIN], "is_staff": True}
    assert removed.data["after"] == {"roles": [roles.ANALYST], "is_staff": False}


# Own roles and access ---------------------------------------------------------------------------


@pytest.mark.scenario("O10")
def test_an_admin_cannot_give_themselves_the_officer_role_through_the_form(
    admin_user: User,
) -> None:
    client = client_for(admin_user)
    response = client.post(change_url(admin_user), profile_form(admin_user, roles=[roles.OFFICER]))
    assert response.status_code == 403
    admin_user.refresh_from_db()
    assert users.role_names(admin_user) == [roles.ADMIN]
    assert not admin_user.has_perm("oversight.decide_gate")
    (refusal,) = events("auth.user.change_refused", admin_user)
    assert refusal.actor_user == admin_user
    assert refusal.data["attempt"] == "set_roles"
    assert events("auth.user.roles_changed", admin_user) == []


@pytest.mark.scenario("O10")
def test_an_admin_cannot_give_themselves_a_role_through_the_action(admin_user: User) -> None:
    with pytest.raises(users.UserChangeRefused):
        users.set_roles(admin_user, admin_user, [roles.ADMIN, roles.OFFICER])
    admin_user.refresh_from_db()
    assert users.role_names(admin_user) == [roles.ADMIN]
    (refusal,) = events("auth.user.change_refused", admin_user)
    assert refusal.data["why"].startswith("nobody changes their own roles")


def test_on_their_own_record_roles_and_active_flag_are_read_only(admin_user: User) -> None:
    client = client_for(admin_user)
    page = client.get(change_url(admin_user)).content.decode()
    assert 'name="roles"' not in page
    assert 'name="is_active"' not in page
    assert "another admin changes your roles" in page
    # Their name they may change; that is audited like any change.
    form = profile_form(admin_user, first_name="Adam")
    del form["roles"], form["is_active"]
    response = client.post(change_url(admin_user), form)
    assert response.status_code == 302, response.content.decode()[:3000]
    admin_user.refresh_from_db()
    assert admin_user.first_name == "Adam"
    (event,) = events("auth.user.changed", admin_user)
    assert event.data["before"] == {"first_name": ""}
    assert event.data["after"] == {"first_name": "Adam"}


@pytest.mark.scenario("O10")
def test_an_admin_cannot_deactivate_themselves(admin_user: User) -> None:
    client = client_for(admin_user)
    form = profile_form(admin_user)
    del form["roles"]
    refused = client.post(change_url(admin_user), form)
    assert refused.status_code == 403
    # One sentence, and no advice to ask an admin given to an admin about their own record.
    page = refused.content.decode()
    assert "Nobody changes their own active flag: another admin does." in page
    assert "ask an admin" not in page
    with pytest.raises(users.UserChangeRefused):
        users.deactivate_user(admin_user, admin_user)
    with pytest.raises(users.UserChangeRefused):
        users.change_user(admin_user, admin_user, is_active=False)
    admin_user.refresh_from_db()
    assert admin_user.is_active
    assert len(events("auth.user.change_refused", admin_user)) == 3


def test_other_roles_cannot_manage_users(officer: User, analyst: User) -> None:
    with pytest.raises(users.UserChangeRefused):
        users.set_roles(officer, analyst, [roles.OFFICER])
    with pytest.raises(users.UserChangeRefused):
        users.create_user(officer, username="sock", password=personas.PASSWORD)
    assert users.role_names(analyst) == [roles.ANALYST]
    assert not User.objects.filter(username="sock").exists()
    assert len(events("auth.user.change_refused")) == 2
    assert client_for(officer).get(reverse("admin:auth_user_changelist")).status_code == 302


# Changing other users ---------------------------------------------------------------------------


@pytest.mark.scenario("O10")
def test_changing_someone_elses_roles_and_profile_is_audited_once(
    admin_user: User, analyst: User
) -> None:
    page = client_for(admin_user).get(change_url(analyst)).content.decode()
    assert re.search(r'name="roles" value="analyst"[^>]*checked', page)
    assert not re.search(r'name="roles" value="compliance officer"[^>]*checked', page)
    for name in ("is_superuser", "is_staff", "user_permissions", 'name="groups"'):
        assert name not in page
    response = client_for(admin_user).post(
        change_url(analyst),
        profile_form(analyst, email="ana@example.org", roles=[roles.OFFICER]),
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    analyst.refresh_from_db()
    # The analyst role goes at once; the officer role waits for a second admin.
    assert users.role_names(analyst) == []
    assert analyst.email == "ana@example.org"
    grant = users.pending_role_grant(analyst)
    assert grant is not None and grant.roles == [roles.OFFICER]
    users.approve_role_grant(personas.admin("alice"), grant)
    analyst = User.objects.get(pk=analyst.pk)  # no cached permissions
    assert users.role_names(analyst) == [roles.OFFICER]
    assert analyst.has_perm("oversight.decide_gate")
    (changed,) = events("auth.user.changed", analyst)
    assert changed.data["before"] == {"email": ""}
    assert changed.data["after"] == {"email": "ana@example.org"}
    removed, granted = events("auth.user.roles_changed", analyst)
    assert removed.actor_user == admin_user
    assert removed.data["before"] == {"roles": [roles.ANALYST], "is_staff": False}
    assert removed.data["after"] == {"roles": [], "is_staff": False}
    assert granted.actor_user.username == "alice"
    assert granted.data["before"] == {"roles": [], "is_staff": False}
    assert granted.data["after"] == {"roles": [roles.OFFICER], "is_staff": False}
    assert events("auth.user.groups_changed", analyst)[-1].actor_kind == "system"  # persona's
    assert len(events("auth.user.groups_changed", analyst)) == 1  # only make_user's own add


@pytest.mark.scenario("O10")
def test_a_tampered_change_form_is_refused_and_nothing_changes(
    admin_user: User, analyst: User
) -> None:
    group = Group.objects.get(name=roles.OFFICER)
    response = client_for(admin_user).post(
        change_url(analyst), profile_form(analyst, is_superuser="on", groups=str(group.pk))
    )
    assert response.status_code == 403
    analyst.refresh_from_db()
    assert not analyst.is_superuser
    assert users.role_names(analyst) == [roles.ANALYST]
    (refusal,) = events("auth.user.change_refused", analyst)
    assert "is_superuser" in refusal.data["why"]


def test_only_a_superuser_changes_a_superuser(admin_user: User) -> None:
    root = User.objects.create_superuser("root", password=personas.PASSWORD)
    for attempt in (
        lambda: users.change_user(admin_user, root, email="x@example.org"),
        lambda: users.set_roles(admin_user, root, [roles.ANALYST]),
        lambda: users.request_password_reset(admin_user, root, NEW_PASSWORD),
        lambda: users.deactivate_user(admin_user, root),
    ):
        with pytest.raises(users.UserChangeRefused):
            attempt()
    root.refresh_from_db()
    assert root.is_active and root.email == "" and root.check_password(personas.PASSWORD)
    assert len(events("auth.user.change_refused", root)) == 4
    response = client_for(admin_user).post(
        reverse("admin:auth_user_password_change", args=[root.pk]),
        {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD},
    )
    assert response.status_code == 403


def test_deactivating_from_the_list_is_audited_and_skips_the_admin(
    admin_user: User, analyst: User
) -> None:
    client = client_for(admin_user)
    response = client.post(
        reverse("admin:auth_user_changelist"),
        select_action("deactivate_selected", analyst.pk, admin_user.pk),
    )
    assert response.status_code == 302
    analyst.refresh_from_db()
    admin_user.refresh_from_db()
    assert (analyst.is_active, admin_user.is_active) == (False, True)
    (event,) = events("auth.user.deactivated", analyst)
    assert event.data["before"] == {"is_active": True}
    assert event.data["after"] == {"is_active": False}
    assert len(events("auth.user.change_refused", admin_user)) == 1


def test_users_cannot_be_deleted_in_the_admin(admin_user: User, analyst: User) -> None:
    url = reverse("admin:auth_user_delete", args=[analyst.pk])
    assert client_for(admin_user).post(url, {"post": "yes"}).status_code == 403
    assert User.objects.filter(pk=analyst.pk).exists()


def test_groups_are_read_only_in_the_admin(admin_user: User) -> None:
    client = client_for(admin_user)
    group = Group.objects.get(name=roles.ADMIN)
    url = reverse("admin:auth_group_change", args=[group.pk])
    assert client.get(url).status_code == 200
    assert client.post(url, {"name": "root", "permissions": []}).status_code == 403
    assert client.get(reverse("admin:auth_group_add")).status_code == 403
    group.refresh_from_db()
    assert group.name == roles.ADMIN
    assert group.permissions.count() == len(roles.ROLE_PERMISSIONS[roles.ADMIN])


# Password resets --------------------------------------------------------------------------------


@pytest.mark.scenario("O10")
def test_an_officers_password_reset_waits_for_a_second_admin(officer: User) -> None:
    first, second = personas.admin("adam"), personas.admin("alice")
    response = client_for(first).post(
        reverse("admin:auth_user_password_change", args=[officer.pk]),
        {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "set-password": "1"},
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    officer.refresh_from_db()
    assert officer.check_password(personas.PASSWORD)  # not yet
    page = client_for(first).get(change_url(officer)).content.decode()
    assert "A reset waits for a second admin." in page
    (pending,) = PasswordResetRequest.objects.filter(target=officer)
    assert (pending.status, pending.requested_by) == ("pending", first)

    # The requester cannot approve it, not through the list action nor the use case.
    resets = reverse("admin:accounts_passwordresetrequest_changelist")
    assert (
        client_for(first).post(resets, select_action("approve_selected", pending.pk)).status_code
        == 302
    )
    with pytest.raises(users.UserChangeRefused):
        users.approve_password_reset(first, pending)
    pending.refresh_from_db()
    officer.refresh_from_db()
    assert pending.status == "pending"
    assert officer.check_password(personas.PASSWORD)
    refusals = events("auth.password_reset.approved") + events("auth.user.change_refused", officer)
    assert [event.action for event in refusals] == ["auth.user.change_refused"] * 2

    # The second admin approves it: the new password works, the old one no longer does.
    assert client_for(second).get(resets).status_code == 200
    response = client_for(second).post(resets, select_action("approve_selected", pending.pk))
    assert response.status_code == 302
    pending.refresh_from_db()
    officer.refresh_from_db()
    assert (pending.status, pending.decided_by) == ("approved", second)
    assert officer.check_password(NEW_PASSWORD)
    assert not officer.check_password(personas.PASSWORD)

    (requested,) = events("auth.password_reset.requested", officer)
    assert requested.actor_user == first
    assert requested.data["before"] == {"status": None}
    assert requested.data["after"] == {"status": "pending"}
    assert requested.data["roles"] == [roles.OFFICER]
    (approved,) = events("auth.password_reset.approved", officer)
    assert approved.actor_user == second
    assert approved.data["requested_by"] == "adam"
    assert approved.data["before"] == {"status": "pending"}
    assert approved.data["after"] == {"status": "approved"}
    trail = json.dumps([e.data for e in AuditEvent.objects.all()])
    assert NEW_PASSWORD not in trail and pending.password_hash not in trail
    # Nothing but the use cases' events: the signals did not double them.
    assert "auth.user.flags_changed" not in user_events(officer)


@pytest.mark.scenario("O10")
@pytest.mark.parametrize(
    "make", [personas.auditor, lambda: personas.make_user("sue", roles.SUPERVISOR)]
)
def test_auditor_and_supervisor_resets_also_wait(make: Any) -> None:
    target = make()
    first = personas.admin("adam")
    assert users.request_password_reset(first, target, NEW_PASSWORD) is not None
    target.refresh_from_db()
    assert target.check_password(personas.PASSWORD)


def test_an_analysts_password_reset_applies_at_once(admin_user: User, analyst: User) -> None:
    url = reverse("admin:auth_user_password_change", args=[analyst.pk])
    assert 'name="password1"' in client_for(admin_user).get(url).content.decode()
    response = client_for(admin_user).post(
        reverse("admin:auth_user_password_change", args=[analyst.pk]),
        {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD, "set-password": "1"},
    )
    assert response.status_code == 302
    analyst.refresh_from_db()
    assert analyst.check_password(NEW_PASSWORD)
    assert not PasswordResetRequest.objects.exists()
    (event,) = events("auth.user.password_reset", analyst)
    assert event.actor_user == admin_user
    assert NEW_PASSWORD not in json.dumps(event.data)


def test_a_weak_password_is_refused_by_the_form(admin_user: User, analyst: User) -> None:
    response = client_for(admin_user).post(
        reverse("admin:auth_user_password_change", args=[analyst.pk]),
        {"password1": "123", "password2": "123", "set-password": "1"},
    )
    assert response.status_code == 200
    analyst.refresh_from_db()
    assert analyst.check_password(personas.PASSWORD)
    assert events("auth.user.password_reset") == []


@pytest.mark.scenario("O10")
def test_an_admins_own_password_and_another_admins_need_someone_else() -> None:
    adam, alice, amir = personas.admin("adam"), personas.admin("alice"), personas.admin("amir")
    with pytest.raises(users.UserChangeRefused):
        users.request_password_reset(adam, adam, NEW_PASSWORD)
    pending = users.request_password_reset(adam, alice, NEW_PASSWORD)
    assert pending is not None  # an admin's password is sensitive too
    with pytest.raises(users.UserChangeRefused):  # the target is no second admin
        users.approve_password_reset(alice, pending)
    users.approve_password_reset(amir, pending)
    alice.refresh_from_db()
    assert alice.check_password(NEW_PASSWORD)


@pytest.mark.scenario("O10")
def test_an_admin_the_requester_made_is_no_second_admin(admin_user: User, officer: User) -> None:
    bob = personas.admin("bob")  # approves the admin role of the requester's accounts
    sock = users.create_user(
        admin_user, username="sock", password=personas.PASSWORD, roles=[roles.ADMIN]
    )
    sock_grant = users.pending_role_grant(sock)
    assert sock_grant is not None
    users.approve_role_grant(bob, sock_grant)
    pending = users.request_password_reset(admin_user, officer, NEW_PASSWORD)
    assert pending is not None
    with pytest.raises(users.UserChangeRefused, match="made this admin"):
        users.approve_password_reset(sock, pending)
    promoted = personas.analyst("pat")
    promotion = users.set_roles(admin_user, promoted, [roles.ADMIN])
    assert promotion is not None
    users.approve_role_grant(bob, promotion)
    with pytest.raises(users.UserChangeRefused, match="made this admin"):
        users.approve_password_reset(promoted, pending)
    # An admin whose password the requester chose (a third admin approved it) is theirs too.
    alice, amir = personas.admin("alice"), personas.admin("amir")
    chosen = users.request_password_reset(admin_user, alice, NEW_PASSWORD)
    assert chosen is not None
    users.approve_password_reset(amir, chosen)
    with pytest.raises(users.UserChangeRefused, match="chose its password"):
        users.approve_password_reset(alice, pending)
    officer.refresh_from_db()
    assert officer.check_password(personas.PASSWORD)
    assert users.controlled_by(alice, admin_user) and not users.controlled_by(amir, admin_user)
    users.approve_password_reset(amir, pending)  # someone independent may
    officer.refresh_from_db()
    assert officer.check_password(NEW_PASSWORD)


def test_a_rejected_or_expired_reset_never_applies(officer: User) -> None:
    adam, alice = personas.admin("adam"), personas.admin("alice")
    rejected = users.request_password_reset(adam, officer, NEW_PASSWORD)
    assert rejected is not None
    users.reject_password_reset(alice, rejected)
    with pytest.raises(users.ResetConflict):
        users.approve_password_reset(alice, rejected)
    (event,) = events("auth.password_reset.rejected", officer)
    assert event.data["after"] == {"status": "rejected"}

    old = users.request_password_reset(adam, officer, NEW_PASSWORD)
    assert old is not None
    PasswordResetRequest.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - users.PASSWORD_RESET_LIFETIME - timedelta(minutes=1)
    )
    old.refresh_from_db()
    with pytest.raises(users.ResetConflict, match="expired"):
        users.approve_password_reset(alice, old)
    old.refresh_from_db()
    officer.refresh_from_db()
    assert old.status == "expired"
    assert officer.check_password(personas.PASSWORD)
    assert events("auth.password_reset.expired", officer)[-1].data["why"] == "too old to approve"


def test_a_new_request_supersedes_the_pending_one(officer: User) -> None:
    adam = personas.admin("adam")
    first = users.request_password_reset(adam, officer, NEW_PASSWORD)
    second = users.request_password_reset(adam, officer, NEW_PASSWORD + "-2")
    assert first is not None and second is not None
    first.refresh_from_db()
    assert (first.status, second.status) == ("expired", "pending")
    assert events("auth.password_reset.expired", officer)[0].data["why"] == "superseded"


# E-signing -------------------------------------------------------------------------------------


def test_an_admin_unlocks_someone_elses_signing_but_not_their_own(
    admin_user: User, officer: User
) -> None:
    locked_at = timezone.now()
    SigningState.objects.create(user=officer, failures=5, locked_at=locked_at)
    response = client_for(admin_user).post(
        reverse("admin:auth_user_changelist"),
        select_action("unlock_signing_selected", officer.pk),
    )
    assert response.status_code == 302
    state = SigningState.objects.get(user=officer)
    assert (state.failures, state.locked_at) == (0, None)
    (event,) = events("security.signing.unlocked", officer)
    assert event.actor_user == admin_user
    assert event.data["before"]["failures"] == 5
    assert event.data["before"]["locked_at"] is not None
    assert event.data["after"] == {"failures": 0, "locked_at": None}

    SigningState.objects.create(user=admin_user, failures=5, locked_at=locked_at)
    with pytest.raises(users.UserChangeRefused):
        users.unlock_signing(admin_user, admin_user)
    assert SigningState.objects.get(user=admin_user).locked_at is not None


# Changes outside the admin ---------------------------------------------------------------------


def test_changes_from_the_shell_are_audited_with_before_and_after(analyst: User) -> None:
    officers = Group.objects.get(name=roles.OFFICER)
    analyst.groups.add(officers)
    (added,) = events("auth.user.groups_changed", analyst)[1:]  # after make_user's own add
    assert added.actor_kind == "system"
    assert added.data["before"] == {"groups": [roles.ANALYST]}
    assert added.data["after"] == {"groups": sorted([roles.ANALYST, roles.OFFICER])}

    officers.user_set.remove(analyst)  # from the group's side
    removed = events("auth.user.groups_changed", analyst)[-1]
    assert removed.data["before"] == {"groups": sorted([roles.ANALYST, roles.OFFICER])}
    assert removed.data["after"] == {"groups": [roles.ANALYST]}

    analyst.groups.clear()
    cleared = events("auth.user.groups_changed", analyst)[-1]
    assert cleared.data["after"] == {"groups": []}

    analyst.is_superuser = True
    analyst.is_staff = True
    analyst.save()
    (flags,) = events("auth.user.flags_changed", analyst)
    assert flags.data["before"] == {"is_staff": False, "is_superuser": False}
    assert flags.data["after"] == {"is_staff": True, "is_superuser": True}

    analyst.last_login = timezone.now()
    analyst.save(update_fields=["last_login"])
    assert len(events("auth.user.flags_changed", analyst)) == 1


def test_users_created_and_deleted_from_the_shell_are_audited() -> None:
    root = User.objects.create_superuser("root", password=personas.PASSWORD)
    (created,) = events("auth.user.created", root)
    assert created.actor_kind == "system"
    assert created.data["after"]["is_superuser"] is True
    pk = root.pk
    root.delete()
    (deleted,) = AuditEvent.objects.filter(action="auth.user.deleted", data__user_id=pk)
    assert deleted.data["before"]["username"] == "root"
    assert deleted.data["after"] is None


# The admin role's permissions -------------------------------------------------------------------


def test_the_admin_roles_permissions_allow_what_admins_must_do(admin_user: User) -> None:
    roles.sync_roles()
    admin_user = User.objects.get(pk=admin_user.pk)  # no cached permissions
    assert admin_user.has_perm("oversight.configure")
    assert not admin_user.has_perm("auth.add_user")
    assert not admin_user.has_perm("auth.change_user")
    assert not admin_user.is_superuser
    client = client_for(admin_user)
    assert "Password reset requests" in client.get(reverse("admin:index")).content.decode()
    for name in (
        "admin:auth_user_changelist",
        "admin:auth_user_add",
        "admin:auth_group_changelist",
        "admin:accounts_passwordresetrequest_changelist",
    ):
        assert client.get(reverse(name)).status_code == 200, name
    assert client.get(change_url(personas.analyst())).status_code == 200


def test_the_system_chain_verifies_after_all_this(admin_user: User, officer: User) -> None:
    second = personas.admin("alice")
    pending = users.request_password_reset(admin_user, officer, NEW_PASSWORD)
    assert pending is not None
    users.approve_password_reset(second, pending)
    with pytest.raises(users.UserChangeRefused):
        users.set_roles(admin_user, admin_user, [roles.OFFICER])
    assert verify_chain(SYSTEM_CHAIN) == []
