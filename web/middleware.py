"""Headers every dynamic answer carries, whatever view (or error handler) produced it."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase
from django.utils.cache import add_never_cache_headers, patch_vary_headers

from web.http import HTMX_VARY


class NoStoreMiddleware:
    """Mark every answer `Cache-Control: no-store` and every HTML answer `Vary: HX-Request`.

    Pages, partials, API answers and error pages all hold case data or a CSRF token, so neither a
    shared cache nor the browser's may keep them (back after log out must not show a case). HTML
    differs by htmx request headers (a page or one of its partials), so it varies by them.
    Static files are answered by WhiteNoise above this middleware and keep their own caching.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        """Answer the request, then add the caching headers."""
        response = self.get_response(request)
        add_never_cache_headers(response)
        if response.get("Content-Type", "").startswith("text/html"):
            patch_vary_headers(response, HTMX_VARY)
        return response


# A session's expiry moves on when it is saved; saving it on every request (Django's
# SESSION_SAVE_EVERY_REQUEST) costs a database write per page. Once a minute is as good for an
# idle timeout counted in minutes.
SESSION_REFRESH_S = 60
_SEEN_KEY = "_casehub_seen"
# Moved on by every change a signed-in user makes in their session (see SessionIdleMiddleware).
NAV_GENERATION_KEY = "_casehub_nav"
_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class SessionIdleMiddleware:
    """Keep a signed-in session alive while it is used: refresh its expiry at most once a minute.

    The session then ends `SESSION_COOKIE_AGE` (the idle timeout) after its last refresh, within
    a minute of the last request. A change the user makes (any unsafe method) also moves the
    session's navigation generation on: the navigation's counts are kept per user and generation
    for a few seconds (`casehub.context_processors`), so the page after a decision counts afresh,
    whichever web process answers it. Only a session signed in already is touched: an API call
    with a token opens no session.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        """Answer the request; mark the session modified when its last refresh is a minute old."""
        session = getattr(request, "session", None)
        user = getattr(request, "user", None)
        if session is not None and user is not None and user.is_authenticated:
            now = int(time.time())
            seen = session.get(_SEEN_KEY, 0)
            if not isinstance(seen, int) or now - seen >= SESSION_REFRESH_S:
                session[_SEEN_KEY] = now
            if request.method in _UNSAFE_METHODS and session.get("_auth_user_id") is not None:
                generation = session.get(NAV_GENERATION_KEY, 0)
                session[NAV_GENERATION_KEY] = generation + 1 if isinstance(generation, int) else 1
        return self.get_response(request)


def mark_session_fresh(
    sender: object, request: HttpRequest | None = None, **kwargs: object
) -> None:
    """Count a sign-in as use of its session: the first request after it writes nothing."""
    session = getattr(request, "session", None)
    if session is not None:
        session[_SEEN_KEY] = int(time.time())
