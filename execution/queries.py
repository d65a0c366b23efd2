"""Read-side queries of execution with separation of duties built in: whose work items are whose."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, Group, User
from django.db.models import Q, QuerySet

from execution.models import WorkItem
from planning.models import Case


def work_items_for(user: User | AnonymousUser) -> QuerySet[WorkItem]:
    """Return the work items of the user's groups, except those of cases the user submitted.

    Being in the item's group is what lets a person see and do it (an analyst does a step of
    another analyst's case), and so is being in its escalation group once it escalated past its
    deadline: separation of duties keeps the submitter out, as the action does.
    """
    if not user.is_authenticated or not user.is_active:
        return WorkItem.objects.none()
    groups = Group.objects.filter(user=user).values("pk")
    own_cases = Case.objects.filter(submitter_id=user.pk).values("pk")
    return WorkItem.objects.filter(work_item_groups(groups)).exclude(case_id__in=own_cases)


def work_item_groups(groups: QuerySet[Group, Any]) -> Q:
    """Return the condition for work items these groups may do: theirs, or escalated to them."""
    return Q(group__in=groups) | Q(escalated_at__isnull=False, escalation_group__in=groups)
