"""Headers every dynamic answer carries, whatever view (or error handler) produced it."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase
from django.utils.cache import add_never_cache_headers, patch_vary_headers

from casehub.http import HTMX_VARY


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
