"""Accounts' rows: API tokens, two-person requests (password resets, role grants), access
denials and e-signature lockouts.

The tables keep the names they had in the apps these models came from (`planning_apitoken`,
`oversight_*`).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    """A bearer token for the JSON API; only its SHA-256 is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "planning_apitoken"

    def __str__(self) -> str:
        return f"token of {self.user_id}"


class SigningState(models.Model):
    """Wrong signature passwords of one user; signing locks after too many (R7)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="signing_state"
    )
    failures = models.PositiveSmallIntegerField(default=0)
    locked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "oversight_signingstate"

    def __str__(self) -> str:
        return f"signing state of {self.user_id}"


class PasswordResetRequest(models.Model):
    """A password an admin set for a user in a sensitive role; a second admin must approve it.

    Only the new password's hash is stored (make_password); the password itself never is.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"

    target = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="password_resets"
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    password_hash = models.CharField(max_length=256)
    created_at = models.DateTimeField(auto_now_add=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "oversight_passwordresetrequest"
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "target"])]

    def __str__(self) -> str:
        return f"password reset of {self.target_id} ({self.status})"


class AccessDenial(models.Model):
    """A counter of the access denials of one client, user and kind within one minute.

    The first denial of a minute writes an audit event at once; the rest only count here, and
    accounts.denials.flush_denials summarises them in one event once the minute is over, so a
    flood of refused requests costs one row, not a chain of events. `source` is the client
    behind CASEHUB_TRUSTED_PROXY_COUNT proxies (REMOTE_ADDR when that is 0).
    """

    class Kind(models.TextChoices):
        FORBIDDEN = "forbidden"
        NOT_FOUND = "not_found"
        BAD_TOKEN = "bad_token"  # noqa: S105 (a kind of denial, not a secret)
        THROTTLED = "throttled"  # a sign-in refused by accounts.throttling

    PATH_LENGTH = 300

    source = models.CharField(max_length=64)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    minute = models.DateTimeField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    count = models.PositiveIntegerField(default=1)
    first_path = models.CharField(max_length=PATH_LENGTH)
    last_path = models.CharField(max_length=PATH_LENGTH)
    flushed = models.BooleanField(default=False)

    class Meta:
        db_table = "oversight_accessdenial"
        constraints = [
            # The user is NULL for anonymous callers, and NULLs never collide in a unique index:
            # the index holds COALESCE(user, 0) so that one anonymous source has one row too.
            models.UniqueConstraint(
                models.F("source"),
                models.Func(
                    models.F("user"),
                    models.Value(0),
                    function="COALESCE",
                    output_field=models.IntegerField(),
                ),
                models.F("kind"),
                models.F("minute"),
                name="oversight_access_denial_once_a_minute",
            ),
        ]
        indexes = [models.Index(fields=["flushed", "minute"])]

    def __str__(self) -> str:
        return f"{self.count} x {self.kind} from {self.source} at {self.minute:%Y-%m-%d %H:%M}"


class RoleGrantRequest(models.Model):
    """Sensitive roles an admin wants a user to have; a second admin must approve them.

    `roles` lists the sensitive roles to add (officer, supervisor, auditor, admin); approving
    adds them to the roles the user holds then. Removing roles and adding the analyst role never
    wait: only these do.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"

    target = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="role_grants"
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    roles = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True)

    class Meta:
        db_table = "oversight_rolegrantrequest"
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "target"])]

    def __str__(self) -> str:
        return f"role grant of {', '.join(self.roles)} to {self.target_id} ({self.status})"


# Execution ---------------------------------------------------------------------------------------


# Sign-in through the organisation's identity provider (OpenID Connect) ------------------------


class OidcIdentity(models.Model):
    """A user's account at the identity provider: its issuer and stable subject id (`sub`).

    Users are matched by these two alone, never by username or e-mail, so no provider account can
    take over a local one. `groups` is the group claim of the last sign-in (None: it was missing).
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity"
    )
    issuer = models.CharField(max_length=300)
    sub = models.CharField(max_length=255)
    groups = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_signed_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "OIDC identity"
        verbose_name_plural = "OIDC identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "sub"], name="accounts_oidc_identity_once")
        ]

    def __str__(self) -> str:
        return f"{self.sub} at {self.issuer}"


class OidcGroupMapping(models.Model):
    """A group of the provider's group claim that gives its members a CaseHub role.

    A mapping to a sensitive role exists only once a second admin approved its
    OidcMappingRequest; a mapping to the analyst role applies at once.
    """

    group = models.CharField(max_length=200)
    role = models.CharField(max_length=32)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "OIDC group mapping"
        ordering = ["group", "role"]
        constraints = [
            models.UniqueConstraint(fields=["group", "role"], name="accounts_oidc_mapping_once")
        ]

    def __str__(self) -> str:
        return f"{self.group} → {self.role}"


class OidcMappingRequest(models.Model):
    """A group mapped to a sensitive role that one admin proposed; a second admin decides."""

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"

    group = models.CharField(max_length=200)
    role = models.CharField(max_length=32)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True)

    class Meta:
        verbose_name = "OIDC group mapping proposal"
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "group"])]

    def __str__(self) -> str:
        return f"mapping {self.group} → {self.role} ({self.status})"


class OidcRoleClaim(models.Model):
    """A role a user holds because their group claim mapped to it, and the groups that did.

    Only these roles are taken away when the claim no longer maps to them: a role an admin
    granted stays.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_role_claims"
    )
    role = models.CharField(max_length=32)
    groups = models.JSONField(default=list)
    granted_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "role"], name="accounts_oidc_role_claim_once")
        ]

    def __str__(self) -> str:
        return f"{self.role} of {self.user_id} from {', '.join(self.groups)}"


class OidcTokenUse(models.Model):
    """An ID token that signed someone in, kept until it expires: a replayed one is refused."""

    token_hash = models.CharField(max_length=64, unique=True)
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"ID token {self.token_hash[:12]}… (until {self.expires_at:%Y-%m-%d %H:%M})"


class PasswordSignInOff(models.Model):
    """The user may not sign in with a password (only through the identity provider)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="password_sign_in_off",
    )
    since = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"password sign-in off for {self.user_id}"
