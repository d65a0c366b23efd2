"""The htmx request type, the partial rendering every view shares, and the client's address."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import patch_vary_headers
from django_htmx.middleware import HtmxDetails

# A page that answers htmx with one of its partials differs by these request headers, so a
# cache (the browser's too: back, reload) must never hand the partial out as the page.
HTMX_VARY = ("HX-Request", "HX-Target")


class HtmxHttpRequest(HttpRequest):
    """A request that went through django-htmx's middleware."""

    htmx: HtmxDetails


def partial_name(request: HtmxHttpRequest, partials: Collection[str]) -> str | None:
    """Return the partial htmx asks for (its target id) when the page has it, else None."""
    target = request.htmx.target if request.htmx else None
    return target if target in partials else None


def render_partial(
    request: HtmxHttpRequest,
    template: str,
    context: Mapping[str, Any],
    *,
    partials: Collection[str],
    status: int = 200,
) -> HttpResponse:
    """Render the page, or the partial of it that htmx targets; mark the response as varying.

    A partial is chosen only when the request's HX-Target names one of `partials` (partial name
    = element id = hx-target); anything else gets the whole page.
    """
    name = partial_name(request, partials)
    response = render(request, f"{template}#{name}" if name else template, context, status=status)
    patch_vary_headers(response, HTMX_VARY)
    return response


def client_ip(request: HttpRequest) -> str:
    """Return the client's address: REMOTE_ADDR, or from X-Forwarded-For behind trusted proxies.

    With CASEHUB_TRUSTED_PROXY_COUNT = N > 0, each of N proxies appended the address it saw, so
    the client is the N-th entry from the right; entries left of it are the client's to forge.
    A request that did not pass all N proxies (fewer entries) falls back to REMOTE_ADDR.
    """
    remote = str(request.META.get("REMOTE_ADDR", ""))
    count = settings.CASEHUB_TRUSTED_PROXY_COUNT
    if count <= 0:
        return remote
    forwarded = str(request.META.get("HTTP_X_FORWARDED_FOR", ""))
    hops = [hop.strip() for hop in forwarded.split(",") if hop.strip()]
    if len(hops) < count:
        return remote
    return hops[-count][:45]
