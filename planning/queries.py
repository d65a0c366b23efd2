"""Read-side queries with the visibility rules of each role built in."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import QuerySet
from django.http import Http404

from planning.models import Case, PlanNode
from planning.rules import can_submit_cases, can_view_all_cases


def visible_cases(user: User | AnonymousUser) -> QuerySet[Case]:
    """Return the cases the user may read: all for officers and auditors, own for analysts."""
    cases = Case.objects.select_related("submitter", "current_version")
    if can_view_all_cases(user):
        return cases
    if can_submit_cases(user):
        return cases.filter(submitter_id=user.pk)
    return cases.none()


def case_for(user: User | AnonymousUser, case_id: int) -> Case:
    """Return one visible case; raise Http404 when it does not exist or is not the user's to see."""
    try:
        return visible_cases(user).get(pk=case_id)
    except (Case.DoesNotExist, ValueError, TypeError):
        raise Http404("No such case") from None


def plan_nodes(case: Case) -> QuerySet[PlanNode]:
    """Return the nodes of the case's current plan version in tree order (none without a plan)."""
    if case.current_version_id is None:
        return PlanNode.objects.none()
    return PlanNode.objects.filter(version_id=case.current_version_id).order_by("position")
