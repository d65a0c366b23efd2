"""Pending password resets and role grants expire on schedule, not only when someone approves."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from accounts import roles, users
from accounts.models import PasswordResetRequest, RoleGrantRequest
from audit.models import AuditEvent
from tests import personas

pytestmark = pytest.mark.django_db

LIFETIME = timedelta(hours=settings.CASEHUB_PASSWORD_RESET_LIFETIME_HOURS)


def _requests() -> tuple[PasswordResetRequest, RoleGrantRequest]:
    admin = personas.admin()
    reset = users.request_password_reset(admin, personas.officer(), "a-new-long-passphrase-42")
    grant = users.set_roles(admin, personas.analyst(), [roles.ANALYST, roles.OFFICER])
    assert reset is not None and grant is not None
    return reset, grant


@pytest.mark.scenario("O10")
def test_requests_past_their_lifetime_expire_once_and_are_audited() -> None:
    reset, grant = _requests()
    created = max(reset.created_at, grant.created_at)
    assert users.expire_old_requests(created + LIFETIME / 2) == {
        "password_resets": 0,
        "role_grants": 0,
    }
    later = created + LIFETIME + timedelta(minutes=1)
    assert users.expire_old_requests(later) == {"password_resets": 1, "role_grants": 1}
    assert users.expire_old_requests(later) == {"password_resets": 0, "role_grants": 0}
    reset.refresh_from_db()
    grant.refresh_from_db()
    assert (reset.status, grant.status) == ("expired", "expired")
    assert AuditEvent.objects.filter(action="auth.password_reset.expired").count() == 1
    assert AuditEvent.objects.filter(action="auth.role_grant.expired").count() == 1
    # The expired grant gave nothing.
    assert roles.OFFICER not in users.role_names(grant.target)


def test_a_fresh_request_is_left_pending() -> None:
    reset, grant = _requests()
    assert users.expire_old_requests(timezone.now()) == {"password_resets": 0, "role_grants": 0}
    assert PasswordResetRequest.objects.get(pk=reset.pk).status == "pending"
    assert RoleGrantRequest.objects.get(pk=grant.pk).status == "pending"
