"""The signed-in user's account page: their sessions and API tokens, and log out everywhere."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import User
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from accounts import tokens as api_tokens
from accounts.sessions import log_out_everywhere, signed_in_sessions
from web.http import HtmxHttpRequest


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
