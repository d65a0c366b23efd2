"""Template context shared by every page: the navigation the user's role may use."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest
from django.urls import reverse

from oversight.roles import role_of
from planning import rules


@dataclass(frozen=True, slots=True)
class NavItem:
    label: str
    url: str
    key: str


def _items(request: HttpRequest) -> list[NavItem]:
    user = request.user
    items = [NavItem("Home", reverse("home"), "home")]
    if rules.can_read_cases(user):
        items.append(NavItem("Cases", reverse("planning:case-list"), "cases"))
    if rules.can_submit_cases(user):
        items.append(NavItem("New case", reverse("planning:case-new"), "case-new"))
    if user.has_perm(rules.VIEW_AUDIT):
        items.append(NavItem("Audit trail", reverse("oversight:audit-list"), "audit"))
    if user.is_staff and user.has_perm(rules.CONFIGURE):
        items.append(NavItem("Administration", reverse("admin:index"), "admin"))
    return items


def navigation(request: HttpRequest) -> dict[str, object]:
    """Return the nav items and role of the signed-in user (none for visitors)."""
    if not request.user.is_authenticated:
        return {"nav_items": [], "user_role": None}
    return {"nav_items": _items(request), "user_role": role_of(request.user)}
