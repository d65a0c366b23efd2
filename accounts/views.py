"""Signing in and out (password form, identity provider), the signed-in user's account page
(their sessions and API tokens, log out everywhere) and the admins' Sign-in lockouts page."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.contrib.auth.models import User
from django.contrib.auth.views import LoginView, LogoutView
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST
from django.views.generic import View
from mozilla_django_oidc.views import (  # type: ignore[import-untyped]
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from accounts import oidc, throttling
from accounts import tokens as api_tokens
from accounts.forms import PasswordSignInForm
from accounts.sessions import log_out_everywhere, signed_in_sessions
from accounts.users import may_manage_users
from web.http import HtmxHttpRequest

logger = logging.getLogger(__name__)


# Signing in and out ---------------------------------------------------------------------------


class SignInView(LoginView):
    """The sign-in page: the password form, and "Sign in with <provider>" when one is set."""

    form_class = PasswordSignInForm
    redirect_authenticated_user = True


class SignOutView(LogoutView):
    """Log out; a session that signed in through the provider is sent to end its session there
    too when the provider offers that (`end_session_endpoint`)."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        at_provider = oidc.end_session_url(request)
        response = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(at_provider) if at_provider else response


class OidcSignInView(OIDCAuthenticationRequestView):
    """Send the browser to the provider's authorization endpoint (state, nonce, PKCE).

    With `reauth=1` a signed-in user is asked to sign in afresh there (`prompt=login`,
    `max_age=0`), for an e-signature. 404 while no provider is configured; 503 when its
    discovery document cannot be read.
    """

    get_settings = staticmethod(oidc.library_setting)

    def __init__(self, **kwargs: Any) -> None:
        View.__init__(self, **kwargs)  # the endpoint comes from discovery, in get()

    def get(self, request: HttpRequest) -> HttpResponse:
        if not oidc.is_enabled():
            raise Http404("sign-in through an identity provider is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = oidc.provider().authorization_endpoint
        except oidc.ProviderUnavailable as exc:
            logger.warning("The identity provider is unavailable: %s", exc)
            messages.error(request, "The identity provider cannot be reached. Try again later.")
            return redirect("login")
        self.OIDC_RP_CLIENT_ID = settings.CASEHUB_OIDC_CLIENT_ID
        self.reauthenticating = False
        if request.GET.get("reauth") == "1" and isinstance(request.user, User):
            oidc.ask_reauthentication(request, request.user)
            self.reauthenticating = True
        response: HttpResponse = super().get(request)
        return response

    def get_extra_params(self, request: HttpRequest) -> dict[str, str]:
        return {"prompt": "login", "max_age": "0"} if self.reauthenticating else {}


class OidcCallbackView(OIDCAuthenticationCallbackView):
    """Where the provider sends the browser back: check the state, exchange the code, sign in.

    A state this session did not send, an error from the provider and every refused ID token
    are audited (`auth.oidc.refused`) and send the browser to the sign-in page with a message.
    """

    get_settings = staticmethod(oidc.library_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not oidc.is_enabled():
            raise Http404("sign-in through an identity provider is not configured")
        if request.GET.get("error"):
            oidc.record_refusal(
                request, oidc.Refusal.PROVIDER_ERROR, str(request.GET.get("error"))[:200]
            )
        elif "code" in request.GET and "state" in request.GET:
            states = request.session.get("oidc_states") or {}
            if request.GET["state"] not in states:
                oidc.record_refusal(
                    request, oidc.Refusal.STATE, "the state is not one this session sent"
                )
                return self.login_failure()
        try:
            response: HttpResponse = super().get(request)
        except SuspiciousOperation as exc:
            oidc.record_refusal(request, oidc.Refusal.STATE, str(exc))
            return self.login_failure()
        return response

    def login_failure(self) -> HttpResponse:
        messages.error(self.request, oidc.refusal_message(self.request))
        return redirect("login")


oidc_sign_in = login_not_required(OidcSignInView.as_view())
oidc_callback = login_not_required(OidcCallbackView.as_view())


def _user(request: HtmxHttpRequest) -> User:
    # LoginRequiredMiddleware lets only signed-in users reach these views.
    user = request.user
    assert isinstance(user, User)
    return user


@require_GET
def account(request: HtmxHttpRequest) -> HttpResponse:
    """Show the user's sessions count and live API tokens, with log out everywhere."""
    user = _user(request)
    tokens = [
        (token, api_tokens.token_expires_at(token)) for token in api_tokens.live_api_tokens(user)
    ]
    context = {
        "sessions": signed_in_sessions(user),
        "tokens": tokens,
        "idle_minutes": settings.CASEHUB_SESSION_IDLE_MINUTES,
        "token_ttl_hours": settings.CASEHUB_API_TOKEN_TTL_HOURS,
        "token_limit": settings.CASEHUB_API_TOKEN_MAX_PER_USER,
    }
    return render(request, "accounts/account_detail.html", context)


@require_POST
def account_log_out_everywhere(request: HtmxHttpRequest) -> HttpResponse:
    """End the user's other sessions and revoke their API tokens; this browser stays in."""
    ended = log_out_everywhere(_user(request), request.session)
    messages.success(
        request,
        f"Logged out everywhere else: {ended['sessions']} other session(s) ended, "
        f"{ended['tokens']} API token(s) revoked.",
    )
    return redirect("accounts:account")


@require_POST
def account_token_revoke(request: HtmxHttpRequest, token_id: int) -> HttpResponse:
    """Revoke one of the user's API tokens; 404 for a token that is not theirs or not live."""
    try:
        api_tokens.revoke_api_token(_user(request), token_id)
    except api_tokens.TokenNotFound as exc:
        raise Http404(str(exc)) from None
    messages.success(request, f"API token {token_id} revoked.")
    return redirect("accounts:account")


# The admins' Sign-in lockouts page: who is refused sign-in now, and lifting a lockout. ---


def _admin(request: HtmxHttpRequest) -> User:
    user = request.user
    if not isinstance(user, User) or not may_manage_users(user):
        raise PermissionDenied("Only admins see and lift sign-in lockouts.")
    return user


def _page(
    request: HtmxHttpRequest, *, status: int = 200, error: str = "", posted: dict[str, str]
) -> HttpResponse:
    context = {
        "lockouts": throttling.current_lockouts(),
        "liftable": [limit.value for limit in throttling.LIFTABLE],
        "pair_limit": settings.AXES_FAILURE_LIMIT,
        "address_limit": settings.CASEHUB_LOGIN_ADDRESS_FAILURE_LIMIT,
        "cool_off_minutes": settings.CASEHUB_LOGIN_COOLOFF_MINUTES,
        "username_limit": settings.CASEHUB_LOGIN_USERNAME_FAILURE_LIMIT,
        "username_window": settings.CASEHUB_LOGIN_USERNAME_WINDOW_SECONDS,
        "known_days": settings.CASEHUB_LOGIN_KNOWN_ADDRESS_DAYS,
        "reason_length": throttling.REASON_LENGTH,
        "error": error,
        "posted": posted,
    }
    return render(request, "accounts/lockout_list.html", context, status=status)


@require_GET
def lockout_list(request: HtmxHttpRequest) -> HttpResponse:
    """Show the current sign-in refusals, each pair or address with its Lift form (admins).

    Raises PermissionDenied for anyone but an admin.
    """
    _admin(request)
    return _page(request, posted={})


@require_POST
def lockout_lift(request: HtmxHttpRequest) -> HttpResponse:
    """Lift one pair or address lockout with a reason (admins); audited.

    Raises PermissionDenied for anyone but an admin; answers 422 without a reason or for a
    limit that cannot be lifted, and tells the admin when the lockout has already ended.
    """
    admin = _admin(request)
    posted = {name: str(request.POST.get(name, ""))[:300] for name in ("limit", "username", "ip")}
    reason = str(request.POST.get("reason", ""))[: throttling.REASON_LENGTH].strip()
    posted["reason"] = reason
    try:
        limit = throttling.Limit(posted["limit"])
        throttled = throttling.lift_lockout(
            admin,
            limit=limit,
            username=posted["username"] or None,
            ip_address=posted["ip"] or None,
            why=reason,
        )
    except ValueError as exc:
        error = "Say why the lockout is lifted." if not reason else f"Not lifted: {exc}."
        return _page(request, status=422, error=error, posted=posted)
    except throttling.LockoutNotFound:
        messages.info(request, "That lockout has already ended; nothing to lift.")
        return redirect("accounts:lockout-list")
    who = f"{throttled.username} from {throttled.ip_address}" if throttled.username else None
    messages.success(
        request,
        f"Lifted the lockout of {who or throttled.ip_address}: sign-in may be tried again now.",
    )
    return redirect("accounts:lockout-list")
