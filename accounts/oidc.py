"""Sign-in through the organisation's identity provider: OpenID Connect's authorization code flow
with PKCE, on mozilla-django-oidc.

Off unless `CASEHUB_OIDC_ISSUER` is set. The provider's endpoints come from its discovery
document, whose `issuer` must be the configured one. An ID token is accepted only when it is
signed with RS256 by a key of the provider's JWKS, names the configured issuer and this client as
its audience, has not expired, carries the nonce this browser's sign-in sent, and has never been
used before (its SHA-256 is kept until it expires). The library checks the state and sends the
PKCE verifier. Users are matched by issuer and `sub` alone (OidcIdentity); the first sign-in
creates the user, with no role unless a group mapping gives one and with password sign-in off.
The group claim maps to roles through the admins' mappings (accounts.oidc_mappings); a role that
came from the claim is taken away at the next sign-in whose claim no longer maps to it, and only
such a role. A missing group claim signs the user in as a claim with no groups: every role that
came from the claim goes, and the sign-in event says the claim was missing.

Every sign-in writes `auth.oidc.signed_in`, every role given or taken through the claim
`auth.oidc.role_granted` / `auth.oidc.role_removed` with the claim's values, and every refusal
`auth.oidc.refused` with its reason.

An e-signature of a user whose password sign-in is off asks for a fresh sign-in at the provider
(`prompt=login`, `max_age=0`): the callback checks that the new ID token's `auth_time` is at most
`CASEHUB_OIDC_REAUTH_MAX_AGE_S` old and names the signed-in user's `sub`, and marks the session;
oversight's signature check takes that mark once (`take_reauthentication`).
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, User
from django.core.cache import cache
from django.core.exceptions import SuspiciousOperation
from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend  # type: ignore[import-untyped]

from accounts import oidc_mappings, users
from accounts.models import OidcIdentity, OidcRoleClaim, OidcTokenUse, PasswordSignInOff
from audit.chain import SYSTEM_CHAIN, Actor, append_event
from audit.models import ActorKind
from web.http import client_ip

# How long the discovery document is kept.
DISCOVERY_TTL_S = 3600
# Clock skew allowed on exp, iat and auth_time.
LEEWAY_S = 10
# Session keys: a re-authentication asked for, and one done.
REAUTH_PENDING = "casehub_oidc_reauth_pending"
REAUTH_DONE = "casehub_oidc_reauth_done"
# Set on the request when the callback refused the sign-in, for its message.
REFUSAL_ATTRIBUTE = "casehub_oidc_refusal"
USERNAME_CHARACTERS = re.compile(r"[^\w.@+-]")


class Refusal(StrEnum):
    """Why a sign-in through the provider was refused (the `reason` of `auth.oidc.refused`)."""

    STATE = "state_mismatch"
    PROVIDER_ERROR = "provider_error"
    TOKEN_EXCHANGE = "token_exchange_failed"  # noqa: S105 (a reason, not a secret)
    MALFORMED = "malformed_token"
    BAD_SIGNATURE = "bad_signature"
    WRONG_ISSUER = "wrong_issuer"
    WRONG_AUDIENCE = "wrong_audience"
    EXPIRED = "expired"
    INVALID = "invalid_token"
    NONCE = "nonce_mismatch"
    REPLAYED = "replayed"
    INACTIVE = "inactive_user"
    REAUTH_STALE = "reauthentication_not_fresh"
    REAUTH_OTHER_USER = "reauthentication_by_another_user"


# What the sign-in page tells the user for each reason.
REFUSAL_MESSAGES = {
    Refusal.INACTIVE: "Your CaseHub account is deactivated.",
    Refusal.REAUTH_STALE: "The identity provider did not ask for your password again: "
    "the signature needs a fresh sign-in.",
    Refusal.REAUTH_OTHER_USER: "You signed in at the identity provider as someone else.",
}


class OidcRefused(Exception):
    """The provider's answer or ID token is not accepted (the reason is audited)."""

    def __init__(self, reason: Refusal, detail: str = "", *, sub: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.reason = reason
        self.detail = detail
        # The subject of a verified token refused all the same (a deactivated user, say).
        self.sub = sub


class ProviderUnavailable(Exception):
    """The provider's discovery document could not be read or does not name the issuer."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderConfig:
    """The provider's endpoints, from its discovery document."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    end_session_endpoint: str | None


def is_enabled() -> bool:
    """Return True when sign-in through an identity provider is configured."""
    return bool(settings.CASEHUB_OIDC_ISSUER)


def provider() -> ProviderConfig:
    """Return the provider's endpoints, read from its discovery document (cached for an hour).

    Raises ProviderUnavailable when it cannot be read, lacks an endpoint, or names an issuer
    other than CASEHUB_OIDC_ISSUER (OpenID Connect Discovery 1.0, section 4.3).
    """
    issuer = settings.CASEHUB_OIDC_ISSUER
    key = "casehub-oidc-discovery:" + hashlib.sha256(issuer.encode()).hexdigest()
    cached = cache.get(key)
    if isinstance(cached, ProviderConfig):
        return cached
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        answer = requests.get(url, timeout=settings.CASEHUB_OIDC_TIMEOUT_S)
        answer.raise_for_status()
        document = answer.json()
    except (requests.RequestException, ValueError) as exc:
        raise ProviderUnavailable(f"cannot read {url}: {exc}") from exc
    if document.get("issuer") != issuer:
        raise ProviderUnavailable(
            f"the discovery document names issuer {document.get('issuer')!r}, not {issuer!r}"
        )
    try:
        config = ProviderConfig(
            issuer=issuer,
            authorization_endpoint=str(document["authorization_endpoint"]),
            token_endpoint=str(document["token_endpoint"]),
            jwks_uri=str(document["jwks_uri"]),
            end_session_endpoint=document.get("end_session_endpoint") or None,
        )
    except KeyError as exc:
        raise ProviderUnavailable(f"the discovery document has no {exc}") from exc
    cache.set(key, config, DISCOVERY_TTL_S)
    return config


def library_setting(attr: str, *default: Any) -> Any:
    """Return a mozilla-django-oidc setting: the env-driven ones from CASEHUB_OIDC_*."""
    driven = {
        "OIDC_RP_CLIENT_ID": settings.CASEHUB_OIDC_CLIENT_ID,
        "OIDC_RP_CLIENT_SECRET": settings.CASEHUB_OIDC_CLIENT_SECRET,
        "OIDC_RP_SCOPES": settings.CASEHUB_OIDC_SCOPES,
        "OIDC_TIMEOUT": settings.CASEHUB_OIDC_TIMEOUT_S,
    }
    if attr in driven:
        return driven[attr]
    return getattr(settings, attr, *default) if default else getattr(settings, attr)


# Refusals -----------------------------------------------------------------------------------


def record_refusal(
    request: HttpRequest | None, reason: Refusal, detail: str = "", **data: Any
) -> None:
    """Write `auth.oidc.refused` with the reason, and mark the request for its message."""
    if request is not None:
        setattr(request, REFUSAL_ATTRIBUTE, reason)
    client = {}
    if request is not None:
        client = {"ip": client_ip(request)}
    with transaction.atomic():
        append_event(
            "auth.oidc.refused",
            actor=Actor(ActorKind.ANONYMOUS, str(data.get("sub") or "anonymous")[:150]),
            chain=SYSTEM_CHAIN,
            data={
                "reason": str(reason),
                "detail": detail[:500],
                "issuer": settings.CASEHUB_OIDC_ISSUER,
                **data,
                **client,
            },
        )


def refusal_message(request: HttpRequest) -> str:
    """Return what the sign-in page says about the callback's refusal."""
    reason = getattr(request, REFUSAL_ATTRIBUTE, None)
    if isinstance(reason, Refusal) and reason in REFUSAL_MESSAGES:
        return REFUSAL_MESSAGES[reason]
    return "Sign-in through the identity provider failed. Try again, or ask an admin."


# Tokens ---------------------------------------------------------------------------------------


def token_hash(token: str) -> str:
    """Return the SHA-256 of an ID token, as kept against its replay."""
    return hashlib.sha256(token.encode()).hexdigest()


def remember_token(token: str, expires: int) -> None:
    """Record that an ID token was used, until it expires; raise OidcRefused if it was before."""
    now = timezone.now()
    try:
        with transaction.atomic():
            OidcTokenUse.objects.filter(expires_at__lt=now - timedelta(seconds=LEEWAY_S)).delete()
            OidcTokenUse.objects.create(
                token_hash=token_hash(token),
                expires_at=datetime.fromtimestamp(expires, tz=UTC) + timedelta(seconds=LEEWAY_S),
            )
    except IntegrityError:
        raise OidcRefused(Refusal.REPLAYED, "this ID token was used before") from None


def check_claims(token: str, key: Any, *, issuer: str, client_id: str) -> dict[str, Any]:
    """Verify an ID token's RS256 signature with the key and its iss, aud, azp, exp and iat.

    Returns its claims. Raises OidcRefused with the reason.
    """
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=["RS256"],
            audience=client_id,
            issuer=issuer,
            leeway=LEEWAY_S,
            options={"require": ["iss", "sub", "aud", "exp", "iat"]},
        )
    except jwt.InvalidSignatureError as exc:
        raise OidcRefused(Refusal.BAD_SIGNATURE, str(exc)) from None
    except jwt.ExpiredSignatureError as exc:
        raise OidcRefused(Refusal.EXPIRED, str(exc)) from None
    except jwt.InvalidIssuerError as exc:
        raise OidcRefused(Refusal.WRONG_ISSUER, str(exc)) from None
    except jwt.InvalidAudienceError as exc:
        raise OidcRefused(Refusal.WRONG_AUDIENCE, str(exc)) from None
    except jwt.DecodeError as exc:
        raise OidcRefused(Refusal.MALFORMED, str(exc)) from None
    except jwt.InvalidTokenError as exc:
        raise OidcRefused(Refusal.INVALID, str(exc)) from None
    audience = claims["aud"]
    if isinstance(audience, list) and len(audience) > 1 and claims.get("azp") != client_id:
        raise OidcRefused(Refusal.WRONG_AUDIENCE, "several audiences and azp is not this client")
    return claims


class OidcBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend with CaseHub's checks, identities and role mapping.

    Answers only the provider's callback (a call with the nonce and PKCE verifier), and nothing
    while no issuer is configured.
    """

    get_settings = staticmethod(library_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The endpoints come from discovery when a sign-in needs them, not from settings.
        self.OIDC_RP_CLIENT_ID = settings.CASEHUB_OIDC_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.CASEHUB_OIDC_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = "RS256"
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.UserModel = User

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> AbstractBaseUser | None:
        if request is None or not is_enabled() or "nonce" not in kwargs:
            return None
        try:
            config = provider()
        except ProviderUnavailable as exc:
            record_refusal(request, Refusal.PROVIDER_ERROR, str(exc))
            return None
        self.OIDC_OP_TOKEN_ENDPOINT = config.token_endpoint
        self.OIDC_OP_JWKS_ENDPOINT = config.jwks_uri
        self.config = config
        try:
            user: AbstractBaseUser | None = super().authenticate(request, **kwargs)
        except OidcRefused as exc:
            subject = {"sub": exc.sub} if exc.sub else {}
            record_refusal(request, exc.reason, exc.detail, **subject)
            return None
        except requests.RequestException as exc:
            record_refusal(request, Refusal.TOKEN_EXCHANGE, str(exc))
            return None
        return user

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        """Verify the ID token (see check_claims), its nonce, and that it is not replayed."""
        if not token:
            raise OidcRefused(Refusal.TOKEN_EXCHANGE, "the token answer has no id_token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError as exc:
            raise OidcRefused(Refusal.MALFORMED, str(exc)) from None
        if header.get("alg") != "RS256":
            raise OidcRefused(Refusal.BAD_SIGNATURE, f"algorithm {header.get('alg')!r}, not RS256")
        try:
            key = self.retrieve_matching_jwk(token)
        except SuspiciousOperation as exc:
            raise OidcRefused(Refusal.BAD_SIGNATURE, str(exc)) from None
        claims = check_claims(
            token, key, issuer=self.config.issuer, client_id=settings.CASEHUB_OIDC_CLIENT_ID
        )
        # A token seen before is refused as such, whatever nonce it carries.
        remember_token(token, int(claims["exp"]))
        if kwargs.get("nonce") is None or claims.get("nonce") != kwargs["nonce"]:
            raise OidcRefused(Refusal.NONCE, "the ID token's nonce is not this sign-in's")
        return claims

    def get_or_create_user(
        self, access_token: str, id_token: str, payload: dict[str, Any]
    ) -> User | None:
        """Sign the ID token's subject in (the claims come from the verified ID token)."""
        request = self.request
        reauth = _pending_reauthentication(request)
        user = sign_in(payload, reauthenticating=reauth)
        if reauth is not None:
            request.session[REAUTH_DONE] = {
                "user_id": user.pk,
                "sub": payload["sub"],
                "auth_time": int(payload["auth_time"]),
            }
            request.session.pop(REAUTH_PENDING, None)
        return user


# Signing in ------------------------------------------------------------------------------------


def _username_for(claims: dict[str, Any]) -> str:
    wanted = str(claims.get("preferred_username") or claims.get("email") or "").split("@")[0]
    base = USERNAME_CHARACTERS.sub("", wanted)[:140] or "oidc-" + token_hash(claims["sub"])[:12]
    username, n = base, 1
    while User.objects.filter(username__iexact=username).exists():
        n += 1
        username = f"{base}-{n}"
    return username


def _claim_groups(claims: dict[str, Any]) -> list[str] | None:
    value = claims.get(settings.CASEHUB_OIDC_GROUPS_CLAIM)
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return sorted({str(item) for item in value})
    return None


@transaction.atomic
def sign_in(claims: dict[str, Any], *, reauthenticating: User | None = None) -> User:
    """Find or create the user of verified claims, apply their group claim, and audit it.

    A re-authentication (for an e-signature) must come from `reauthenticating`'s own identity
    with an `auth_time` at most CASEHUB_OIDC_REAUTH_MAX_AGE_S old. Raises OidcRefused for a
    deactivated user and a re-authentication that is not fresh or not the signed-in user's.
    """
    issuer, sub = settings.CASEHUB_OIDC_ISSUER, str(claims["sub"])
    identity = (
        OidcIdentity.objects.select_for_update()
        .select_related("user")
        .filter(issuer=issuer, sub=sub)
        .first()
    )
    created = identity is None
    if reauthenticating is not None:
        if identity is None or identity.user_id != reauthenticating.pk:
            raise OidcRefused(Refusal.REAUTH_OTHER_USER, "the ID token is another user's", sub=sub)
        auth_time = claims.get("auth_time")
        age = time.time() - int(auth_time) if isinstance(auth_time, int | float) else None
        if age is None or age > settings.CASEHUB_OIDC_REAUTH_MAX_AGE_S + LEEWAY_S:
            raise OidcRefused(
                Refusal.REAUTH_STALE, f"auth_time {auth_time!r} is not fresh", sub=sub
            )
    if identity is None:
        user = User.objects.create_user(
            username=_username_for(claims),
            password=None,
            email=str(claims.get("email") or "")[:254],
            first_name=str(claims.get("given_name") or "")[:150],
            last_name=str(claims.get("family_name") or "")[:150],
        )
        PasswordSignInOff.objects.create(user=user)
        identity = OidcIdentity.objects.create(user=user, issuer=issuer, sub=sub)
    user = identity.user
    if not user.is_active:
        raise OidcRefused(Refusal.INACTIVE, f"user {user.username} is deactivated", sub=sub)
    groups = _claim_groups(claims)
    identity.groups = groups
    identity.last_signed_in_at = timezone.now()
    identity.save(update_fields=["groups", "last_signed_in_at"])
    subject = {"user": user.username, "user_id": user.pk, "issuer": issuer, "sub": sub}
    claim = {"claim": settings.CASEHUB_OIDC_GROUPS_CLAIM, "claim_values": groups}
    roles = _apply_group_claim(user, groups, subject, claim)
    append_event(
        "auth.oidc.signed_in",
        actor=user,
        chain=SYSTEM_CHAIN,
        data={
            **subject,
            **claim,
            "claim_missing": groups is None,
            "created": created,
            "reauthentication": reauthenticating is not None,
            "auth_time": claims.get("auth_time"),
            "roles": roles,
        },
    )
    return user


def _apply_group_claim(
    user: User, groups: list[str] | None, subject: dict[str, Any], claim: dict[str, Any]
) -> list[str]:
    """Give the roles the claim maps to and take those that came from it and no longer do."""
    wanted = oidc_mappings.roles_for_groups(groups or [])
    from_claim = {
        row.role: row for row in OidcRoleClaim.objects.select_for_update().filter(user=user)
    }
    held = set(users.role_names(user))
    add = [role for role in wanted if role not in held]
    gone = [role for role in from_claim if role not in wanted]
    before, after = users.apply_claimed_roles(
        user,
        add=add,
        remove=[role for role in gone if role in held],
        why="the identity provider's group claim no longer maps to the role",
    )
    for role in gone:
        row = from_claim[role]
        row.delete()
        append_event(
            "auth.oidc.role_removed",
            actor=None,
            chain=SYSTEM_CHAIN,
            data={
                **subject,
                **claim,
                "role": role,
                "granted_from": row.groups,
                "before": {"roles": before},
                "after": {"roles": after},
            },
        )
    for role in add:
        OidcRoleClaim.objects.create(user=user, role=role, groups=wanted[role])
        append_event(
            "auth.oidc.role_granted",
            actor=None,
            chain=SYSTEM_CHAIN,
            data={
                **subject,
                **claim,
                "role": role,
                "granted_from": wanted[role],
                "before": {"roles": before},
                "after": {"roles": after},
            },
        )
    for role, row in from_claim.items():
        if role in wanted and row.groups != wanted[role]:
            row.groups = wanted[role]
            row.save(update_fields=["groups"])
    return after


# Signing out and re-authenticating -----------------------------------------------------------


def end_session_url(request: HttpRequest) -> str | None:
    """Return the provider's end-session URL for this session's sign-in, or None.

    None unless the session signed in through the provider and its discovery document names
    an `end_session_endpoint`.
    """
    id_token = request.session.get("oidc_id_token")
    if not is_enabled() or not id_token:
        return None
    try:
        endpoint = provider().end_session_endpoint
    except ProviderUnavailable:
        return None
    if endpoint is None:
        return None
    query = urlencode(
        {
            "id_token_hint": id_token,
            "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
            "client_id": settings.CASEHUB_OIDC_CLIENT_ID,
        }
    )
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


def ask_reauthentication(request: HttpRequest, user: User) -> None:
    """Mark the session: the next callback is this user's fresh sign-in for a signature."""
    request.session[REAUTH_PENDING] = {"user_id": user.pk, "asked_at": int(time.time())}
    request.session.pop(REAUTH_DONE, None)


def _pending_reauthentication(request: HttpRequest) -> User | None:
    pending = request.session.get(REAUTH_PENDING)
    user = getattr(request, "user", None)
    if not pending or not isinstance(user, User) or pending.get("user_id") != user.pk:
        return None
    return user


def reauthenticated_at(request: HttpRequest, user: User) -> datetime | None:
    """Return when the user last signed in afresh at the provider for a signature, if that is
    still within CASEHUB_OIDC_REAUTH_MAX_AGE_S; otherwise None."""
    done = request.session.get(REAUTH_DONE)
    if not done or done.get("user_id") != user.pk:
        return None
    if time.time() - int(done["auth_time"]) > settings.CASEHUB_OIDC_REAUTH_MAX_AGE_S:
        return None
    return datetime.fromtimestamp(int(done["auth_time"]), tz=UTC)


def take_reauthentication(request: HttpRequest, user: User) -> datetime | None:
    """Use up the user's fresh re-authentication (one signature each); return its auth_time."""
    at = reauthenticated_at(request, user)
    request.session.pop(REAUTH_DONE, None)
    return at
