"""Group mappings (a group of the provider's claim gives a role): the two-person rule for the
sensitive roles, and password sign-in turned off per user."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from accounts import oidc_mappings, signin, users
from accounts.models import OidcGroupMapping, OidcMappingRequest, PasswordSignInOff
from accounts.roles import ADMIN, ANALYST, AUDITOR, OFFICER, SUPERVISOR
from audit.models import AuditEvent
from tests import personas

pytestmark = pytest.mark.django_db


def _actions(prefix: str) -> list[str]:
    return list(
        AuditEvent.objects.filter(action__startswith=prefix)
        .order_by("seq")
        .values_list("action", flat=True)
    )


def test_mapping_a_group_to_the_analyst_role_applies_at_once(admin_user: User) -> None:
    mapping = oidc_mappings.map_group(admin_user, " casehub-analysts ", ANALYST)
    assert isinstance(mapping, OidcGroupMapping)
    assert oidc_mappings.roles_for_groups(["casehub-analysts", "x"]) == {
        ANALYST: ["casehub-analysts"]
    }
    assert _actions("auth.oidc.mapping") == ["auth.oidc.mapping.added"]


@pytest.mark.parametrize("role", [OFFICER, SUPERVISOR, AUDITOR, ADMIN])
def test_mapping_a_group_to_a_sensitive_role_waits_for_a_second_admin(
    admin_user: User, role: str
) -> None:
    second = personas.admin("alma")
    proposal = oidc_mappings.map_group(admin_user, "g", role)
    assert isinstance(proposal, OidcMappingRequest)
    assert oidc_mappings.roles_for_groups(["g"]) == {}
    with pytest.raises(users.UserChangeRefused, match="proposer cannot approve"):
        oidc_mappings.approve_mapping(admin_user, proposal)
    assert oidc_mappings.roles_for_groups(["g"]) == {}
    mapping = oidc_mappings.approve_mapping(second, proposal)
    assert (mapping.group, mapping.role, mapping.approved_by) == ("g", role, second)
    assert oidc_mappings.roles_for_groups(["g"]) == {role: ["g"]}
    assert _actions("auth.oidc.mapping") == [
        "auth.oidc.mapping.requested",
        "auth.oidc.mapping.approved",
    ]
    refused = AuditEvent.objects.get(action="auth.user.change_refused")
    assert refused.data["attempt"] == "approve_mapping"
    with pytest.raises(oidc_mappings.MappingConflict):
        oidc_mappings.approve_mapping(second, proposal)


def test_an_admin_the_proposer_created_is_no_second_admin(admin_user: User) -> None:
    created = users.create_user(admin_user, username="puppet", password=None, roles=[])
    users.set_roles(admin_user, created, [ADMIN])  # waits for a second admin
    pending = users.pending_role_grant(created)
    assert pending is not None
    users.approve_role_grant(personas.admin("alma"), pending)
    created.refresh_from_db()
    proposal = oidc_mappings.map_group(admin_user, "g", OFFICER)
    with pytest.raises(users.UserChangeRefused, match="second admin must be someone else"):
        oidc_mappings.approve_mapping(created, proposal)  # type: ignore[arg-type]


def test_a_rejected_proposal_maps_nothing_and_needs_a_reason(admin_user: User) -> None:
    second = personas.admin("alma")
    proposal = oidc_mappings.map_group(admin_user, "g", AUDITOR)
    assert isinstance(proposal, OidcMappingRequest)
    with pytest.raises(ValueError, match="reason"):
        oidc_mappings.reject_mapping(second, proposal, "  ")
    oidc_mappings.reject_mapping(second, proposal, "auditors come from another group")
    assert proposal.status == OidcMappingRequest.Status.REJECTED
    assert not OidcGroupMapping.objects.exists()
    event = AuditEvent.objects.get(action="auth.oidc.mapping.rejected")
    assert event.data["why"] == "auditors come from another group"


def test_only_admins_map_groups(officer: User) -> None:
    with pytest.raises(users.UserChangeRefused):
        oidc_mappings.map_group(officer, "g", ANALYST)
    assert not OidcGroupMapping.objects.exists()


def test_removing_a_mapping_is_audited(admin_user: User) -> None:
    mapping = oidc_mappings.map_group(admin_user, "g", ANALYST)
    assert isinstance(mapping, OidcGroupMapping)
    oidc_mappings.remove_mapping(admin_user, mapping)
    assert not OidcGroupMapping.objects.exists()
    assert _actions("auth.oidc.mapping")[-1] == "auth.oidc.mapping.removed"


# Password sign-in off -----------------------------------------------------------------------


def _post_login(client: Client, username: str, password: str) -> bytes:
    return client.post("/login/", {"username": username, "password": password}).content


def test_password_sign_in_off_refuses_the_right_password_with_a_clear_message(
    admin_user: User, analyst: User
) -> None:
    assert signin.set_password_sign_in(admin_user, analyst, off=True)
    client = Client()
    page = _post_login(client, analyst.username, personas.PASSWORD)
    assert b"signs in through" in page and b"only, not with a password" in page
    assert "_auth_user_id" not in client.session
    # A wrong password gets the usual answer: the flag tells a guesser nothing.
    page = _post_login(client, analyst.username, "wrong-password")
    assert b"didn't match" in page and b"signs in through" not in page
    # The API's token endpoint refuses the password too.
    answer = client.post(
        "/api/auth/token",
        {"username": analyst.username, "password": personas.PASSWORD},
        content_type="application/json",
    )
    assert answer.status_code == 401
    event = AuditEvent.objects.get(action="auth.user.password_sign_in_changed")
    assert event.data["before"] == {"password_sign_in": True}
    assert event.data["after"] == {"password_sign_in": False}


def test_password_sign_in_turned_back_on_works_again(admin_user: User, analyst: User) -> None:
    signin.set_password_sign_in(admin_user, analyst, off=True)
    assert signin.set_password_sign_in(admin_user, analyst, off=False)
    assert not signin.set_password_sign_in(admin_user, analyst, off=False)
    client = Client()
    _post_login(client, analyst.username, personas.PASSWORD)
    assert client.session["_auth_user_id"] == str(analyst.pk)
    assert len(_actions("auth.user.password_sign_in_changed")) == 2


def test_nobody_turns_off_their_own_password_sign_in(admin_user: User, analyst: User) -> None:
    with pytest.raises(users.UserChangeRefused):
        signin.set_password_sign_in(admin_user, admin_user, off=True)
    with pytest.raises(users.UserChangeRefused):
        signin.set_password_sign_in(analyst, admin_user, off=True)  # type: ignore[arg-type]
    assert not PasswordSignInOff.objects.exists()


def test_a_proposal_not_approved_in_time_expires(admin_user: User) -> None:
    from datetime import timedelta

    from django.utils import timezone

    proposal = oidc_mappings.map_group(admin_user, "g", OFFICER)
    assert isinstance(proposal, OidcMappingRequest)
    assert oidc_mappings.expire_old_proposals(timezone.now()) == 0
    later = timezone.now() + users.ROLE_GRANT_LIFETIME + timedelta(minutes=1)
    assert oidc_mappings.expire_old_proposals(later) == 1
    proposal.refresh_from_db()
    assert proposal.status == OidcMappingRequest.Status.EXPIRED
    with pytest.raises(oidc_mappings.MappingConflict):
        oidc_mappings.approve_mapping(personas.admin("alma"), proposal)
    assert _actions("auth.oidc.mapping") == [
        "auth.oidc.mapping.requested",
        "auth.oidc.mapping.expired",
    ]
