"""Count and time every request by its route name, and trace it when tracing is on."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase

from observability import metrics, tracing

KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_of(request: HttpRequest) -> str:
    """Return the request's URL name (namespaced), its route pattern, `static`, or `unmatched`.

    Never the raw path: the labels stay as few as the routes.
    """
    match = getattr(request, "resolver_match", None)
    if match is not None:
        return match.view_name or match.route or "unnamed"
    # WhiteNoise answers static files before any URL is resolved.
    if request.path.startswith("/" + settings.STATIC_URL.lstrip("/")):
        return "static"
    return "unmatched"


def _method(request: HttpRequest) -> str:
    method = (request.method or "").upper()
    return method if method in KNOWN_METHODS else "other"


class RequestMetricsMiddleware:
    """Count each answer by route, method and status; time it; wrap it in a server span.

    First in MIDDLEWARE, so the time and the status are those of the whole stack (a redirect of
    the security middleware, a static file, an error page).
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        """Answer the request, then count and time it."""
        tracer = tracing.tracer()
        started = time.perf_counter()
        response = self.get_response(request) if tracer is None else self._traced(tracer, request)
        method = _method(request)
        route = route_of(request)
        metrics.HTTP_REQUESTS.labels(route, method, str(response.status_code)).inc()
        metrics.HTTP_DURATION.labels(route, method).observe(time.perf_counter() - started)
        return response

    def _traced(self, tracer: Any, request: HttpRequest) -> HttpResponseBase:
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind, Status, StatusCode

        carrier = {key.lower(): value for key, value in request.headers.items()}
        method = _method(request)
        with tracer.start_as_current_span(
            method,
            context=propagate.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": request.method or "",
                "url.path": request.path,
                "url.scheme": request.scheme or "",
            },
        ) as span:
            response = self.get_response(request)
            route = route_of(request)
            # The semantic conventions name a server span by method and route template.
            match = getattr(request, "resolver_match", None)
            if match is not None and match.route:
                span.set_attribute("http.route", match.route)
                span.update_name(f"{method} {match.route}")
            span.set_attribute("casehub.route", route)
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                span.set_status(Status(StatusCode.ERROR))
            return response
