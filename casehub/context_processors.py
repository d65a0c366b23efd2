"""Template context shared by every page: the navigation the user's role may use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.cache import cache
from django.db.models import BooleanField, Exists, IntegerField, QuerySet
from django.db.models.expressions import RawSQL
from django.http import HttpRequest
from django.urls import reverse

from accounts.roles import ROLES
from execution.models import ExecutionControl, WorkItem
from execution.queries import work_items_for
from oversight.queries import inbox_for, unread_notifications
from planning import rules
from planning.promotion.actions import can_view_methods
from web.middleware import NAV_GENERATION_KEY

# A navigation count stops at this many: the badge reads "99+" past it. Counting stops there too,
# so 10,000 waiting gates cost what 100 do on every page (the inbox itself counts them all).
NAV_COUNT_CAP = 99


def count_text(count: int) -> str:
    """The badge text of a navigation count: the number, or "99+" past the cap."""
    return f"{NAV_COUNT_CAP}+" if count > NAV_COUNT_CAP else str(count)


@dataclass(frozen=True, slots=True)
class NavItem:
    label: str
    url: str
    key: str
    count: int | None = None

    @property
    def count_text(self) -> str:
        return count_text(self.count or 0)


def _items(request: HttpRequest, counts: dict[str, int]) -> list[NavItem]:
    user = request.user
    items = [NavItem("Home", reverse("home"), "home")]
    if "inbox_count" in counts:
        items.append(
            NavItem("Review inbox", reverse("oversight:inbox"), "inbox", counts["inbox_count"])
        )
    if "work_items_count" in counts:
        items.append(
            NavItem(
                "Work items",
                reverse("execution:work-item-list"),
                "work-items",
                counts["work_items_count"],
            )
        )
    if rules.can_read_cases(user):
        items.append(NavItem("Cases", reverse("planning:case-list"), "cases"))
    if rules.can_submit_cases(user):
        items.append(NavItem("New case", reverse("planning:case-new"), "case-new"))
    if user.has_perm(rules.VIEW_AUDIT):
        items.append(NavItem("Audit trail", reverse("oversight:audit-list"), "audit"))
    if rules.can_view_quality(user):
        items.append(NavItem("Quality", reverse("quality:quality"), "quality"))
    if can_view_methods(user):
        items.append(NavItem("Methods", reverse("planning:method-list"), "methods"))
    if user.is_staff and user.has_perm(rules.CONFIGURE):
        items.append(NavItem("Administration", reverse("admin:index"), "admin"))
    if user.has_perm(rules.CONFIGURE):
        items.append(NavItem("Execution", reverse("execution:execution-control"), "execution"))
    items.append(
        NavItem(
            "Notifications", reverse("oversight:notifications"), "notifications", counts["unread"]
        )
    )
    return items


def _count_of(rows: QuerySet[Any]) -> RawSQL:
    """COUNT(*) of at most NAV_COUNT_CAP + 1 of the rows, as a scalar subquery (the rows'
    query is uncorrelated: it compiles on its own, with its own parameters)."""
    sql, params = rows.order_by().values("pk")[: NAV_COUNT_CAP + 1].query.sql_with_params()
    # The SQL is the ORM's own compilation of a queryset (no text from a request); its values
    # stay parameters. The ORM has no COUNT over a sliced subquery.
    capped = f"SELECT COUNT(*) FROM ({sql}) capped"  # noqa: S608
    return RawSQL(capped, params, output_field=IntegerField())  # noqa: S611


def _counts_and_role(request: HttpRequest) -> tuple[dict[str, int], str | None]:
    """Count the user's unread notices and waiting gates and find their role, in one query.

    The counts ride along the user's groups (one row per group, the same counts on each); only
    a user in no group at all costs a second query for their notices.
    """
    user = cast(User, request.user)
    counts: dict[str, Any] = {"unread": _count_of(unread_notifications(user))}
    if user.has_perm("oversight.decide_gate") and not user.has_perm(rules.CONFIGURE):
        counts["inbox_count"] = _count_of(inbox_for(user))
    if rules.can_submit_cases(user) or user.has_perm("oversight.decide_gate"):
        # Analysts and officers are the groups human steps go to (`runners.human.human_group`).
        counts["work_items_count"] = _count_of(
            work_items_for(user).filter(status=WorkItem.Status.OPEN)
        )
    counts["stopped"] = Exists(
        ExecutionControl.objects.filter(pk=1, stopped=True), output_field=BooleanField()
    )
    rows = list(Group.objects.filter(user=user).annotate(**counts).values_list("name", *counts))
    if not rows:
        stopped = ExecutionControl.objects.filter(pk=1, stopped=True).exists()
        return {"unread": unread_notifications(user).count(), "stopped": int(stopped)}, None
    names = {row[0] for row in rows}
    role = next((name for name in ROLES if name in names), None)
    return {name: int(value or 0) for name, value in zip(counts, rows[0][1:], strict=True)}, role


def _kept_counts_and_role(request: HttpRequest) -> tuple[dict[str, int], str | None]:
    """Return `_counts_and_role`, kept CASEHUB_NAV_COUNTS_TTL_S seconds per user in this process.

    Counting builds and compiles three subqueries, the largest share of a page's own work. The
    key holds the session's navigation generation, which the user's own changes move on
    (`web.middleware.SessionIdleMiddleware`): after a decision the next page counts afresh in
    any web process; what others change shows within the seconds kept.
    """
    ttl = settings.CASEHUB_NAV_COUNTS_TTL_S
    if ttl <= 0:
        return _counts_and_role(request)
    session = getattr(request, "session", None)
    generation = session.get(NAV_GENERATION_KEY, 0) if session is not None else 0
    key = f"casehub.nav:{request.user.pk}:{generation}"
    kept = cache.get(key)
    if kept is None:
        kept = _counts_and_role(request)
        cache.set(key, kept, ttl)
    return cast(tuple[dict[str, int], str | None], kept)


def navigation(request: HttpRequest) -> dict[str, object]:
    """Return the nav items and role of the signed-in user (none for visitors)."""
    if not request.user.is_authenticated:
        return {"nav_items": [], "user_role": None}
    counts, role = _kept_counts_and_role(request)
    return {
        "nav_items": _items(request, counts),
        "user_role": role,
        "inbox_count": counts.get("inbox_count", 0),
        "inbox_count_text": count_text(counts.get("inbox_count", 0)),
        "unread_count": counts["unread"],
        "unread_count_text": count_text(counts["unread"]),
        "execution_stopped": bool(counts.get("stopped")),
    }
