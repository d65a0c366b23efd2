"""Sign-in throttling with django-axes: the client's address and the 429 answer.

django-axes counts failed sign-ins (`/login/`, the admin's login and `POST /api/auth/token`:
everything that calls `authenticate` with the request) per username and per client address,
and past CASEHUB_LOGIN_FAILURE_LIMIT failures in CASEHUB_LOGIN_COOLOFF_MINUTES refuses the next
attempts before any password is checked. This module tells axes who the client is (the
settings name it in AXES_CLIENT_IP_CALLABLE) and answers the refusals (AXES_LOCKOUT_CALLABLE):
429 with Retry-After, in JSON for the API and as the sign-in page otherwise, with one message
whatever the username, known or not.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_client_username, get_failure_limit
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import Max, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from accounts.sessions import record_login_throttled

THROTTLED_MESSAGE = "Too many failed sign-in attempts. Try again in {minutes} minute(s)."


def cool_off() -> timedelta:
    """Return how long a lockout lasts after the failure that started it."""
    return timedelta(minutes=settings.CASEHUB_LOGIN_COOLOFF_MINUTES)


def _locked_until(request: HttpRequest, credentials: dict[str, Any] | None) -> datetime:
    # A lockout ends a cool-off after the latest counted failure of the account or address that
    # is over the limit (failures during a lockout are not counted, see the settings), or sooner
    # when older failures of it age out first: an upper bound, never too early.
    handler = AxesProxyHandler.get_implementation()
    limit = get_failure_limit(request, credentials)
    ends = []
    for attempts in handler.get_user_attempts(request, credentials):
        summary = attempts.aggregate(
            failures=Sum("failures_since_start"), latest=Max("attempt_time")
        )
        if (summary["failures"] or 0) >= limit and summary["latest"] is not None:
            ends.append(summary["latest"] + cool_off())
    return max(ends) if ends else timezone.now() + cool_off()


def throttled_response(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict[str, Any] | None = None,
) -> HttpResponse:
    """Answer a refused sign-in: 429, Retry-After, the same message for every username.

    The failure that starts a lockout is recorded once (`security.login.throttled`). An
    answer that is already this one (the API answers it itself) passes through.
    """
    if original_response is not None and original_response.status_code == 429:
        return original_response
    until = _locked_until(request, credentials)
    seconds = max(1, math.ceil((until - timezone.now()).total_seconds()))
    message = THROTTLED_MESSAGE.format(minutes=math.ceil(seconds / 60))
    # axes sets the failure count only on a counted failure: this one crossed the limit.
    failures = getattr(request, "axes_failures_since_start", None)
    if failures is not None:
        record_login_throttled(
            username=str(get_client_username(request, credentials) or ""),
            ip_address=str(getattr(request, "axes_ip_address", "") or ""),
            failures=int(failures),
            until=until,
            path=request.path,
        )
    response: HttpResponse
    if request.path.startswith("/api/"):
        response = JsonResponse({"message": message}, status=429)
    else:
        form = AuthenticationForm(request)
        context = {"form": form, "throttled_message": message}
        response = render(request, "registration/login.html", context, status=429)
    response["Retry-After"] = str(seconds)
    return response
