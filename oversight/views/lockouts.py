"""The admins' Sign-in lockouts page: who is refused sign-in now, and lifting a lockout."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from casehub.http import HtmxHttpRequest
from oversight import throttling
from oversight.actions.users import may_manage_users


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
    return render(request, "oversight/lockout_list.html", context, status=status)


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
        return redirect("oversight:lockout-list")
    who = f"{throttled.username} from {throttled.ip_address}" if throttled.username else None
    messages.success(
        request,
        f"Lifted the lockout of {who or throttled.ip_address}: sign-in may be tried again now.",
    )
    return redirect("oversight:lockout-list")
