"""Walk the URLconf: every route of the pages, the admin and the API, with the methods it takes.

Shared by the tests that must cover every route (the audit walk, A8; the authorization matrix,
W3), so that both see the same routes. The URLconf is walked (the HTML views, the admin through
`admin.site.urls`, the API through django-ninja's path views); the methods come from
`require_http_methods`-style decorators, a class-based view's handlers, or ninja's operations.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver
from ninja.operation import PathView

__all__ = ["MUTATING", "Route", "all_routes"]

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True, slots=True)
class Route:
    """One URL pattern: its table key, its full route and the methods it accepts."""

    key: str
    route: str
    methods: frozenset[str] | None  # None: cannot be told, so possibly mutating


def _closure(function: Any) -> dict[str, Any]:
    code = getattr(function, "__code__", None)
    cells = getattr(function, "__closure__", None) or ()
    if code is None:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells, strict=True)}


def _unwrapped(callback: Any) -> Iterator[Any]:
    function = callback
    while function is not None:
        yield function
        function = getattr(function, "__wrapped__", None)


def _path_view(callback: Any) -> PathView | None:
    for function in _unwrapped(callback):
        view = _closure(function).get("self")
        if isinstance(view, PathView):
            return view
    return None


def _view_methods(callback: Any) -> frozenset[str] | None:
    view_class = getattr(callback, "view_class", None)
    if view_class is not None:
        names = view_class.http_method_names
        return frozenset(name.upper() for name in names if hasattr(view_class, name))
    for function in _unwrapped(callback):
        declared = _closure(function).get("request_method_list")
        if declared is not None:
            return frozenset(declared)
    return None


def _patterns(
    patterns: list[URLPattern | URLResolver], prefix: str = "", namespace: str = ""
) -> Iterator[tuple[str, str | None, Any]]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = namespace
            if pattern.namespace:
                inner = f"{namespace}{pattern.namespace}:"
            yield from _patterns(pattern.url_patterns, prefix + str(pattern.pattern), inner)
        else:
            name = f"{namespace}{pattern.name}" if pattern.name else None
            yield prefix + str(pattern.pattern), name, pattern.callback


def all_routes() -> list[Route]:
    """Every route of the URLconf; an API route once per method (key "POST /api/...")."""
    found: list[Route] = []
    for route, name, callback in _patterns(get_resolver().url_patterns):
        view = _path_view(callback)
        if view is not None:
            methods = {method for operation in view.operations for method in operation.methods}
            found.extend(Route(f"{m} /{route}", route, frozenset({m})) for m in sorted(methods))
        else:
            found.append(Route(name or route, route, _view_methods(callback)))
    return list({route.key: route for route in found}.values())  # a path per operation
