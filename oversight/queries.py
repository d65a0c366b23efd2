"""Read-side queries of oversight with separation of duties built in: whose gates wait for whom."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, Group, User
from django.db.models import F, Q, QuerySet
from django.http import Http404

from oversight.models import OPEN_GATE_STATUSES, Gate, Notification
from planning.queries import visible_cases

DECIDE_GATE = "oversight.decide_gate"
CONFIGURE = "oversight.configure"


def inbox_for(user: User | AnonymousUser) -> QuerySet[Gate]:
    """Return the open gates of current plan versions that wait for this user's decision.

    Separation of duties is part of the query (R1): never a gate of a case the user submitted or
    of a case with a version the user edited (an edit stays in every later version), never one
    the user already decided; only gates of the user's groups (the escalation group too, once
    the gate escalated). None for admins and for users
    who do not decide gates. The user's groups are a subquery: counting costs one query.
    """
    if not user.is_authenticated or not user.is_active:
        return Gate.objects.none()
    if user.has_perm(CONFIGURE) or not user.has_perm(DECIDE_GATE):
        return Gate.objects.none()
    groups = Group.objects.filter(user=user).values("pk")
    return (
        Gate.objects.filter(
            status__in=OPEN_GATE_STATUSES,
            case__current_version_id=F("version_id"),
        )
        .filter(
            Q(approver_group__in=groups)
            | Q(escalated_at__isnull=False, escalation_group__in=groups)
        )
        .exclude(case__submitter_id=user.pk)
        .exclude(case__versions__edited_by_id=user.pk)
        .exclude(decisions__decider_id=user.pk)
    )


def visible_gate(user: User | AnonymousUser, gate_id: int) -> Gate:
    """Return one gate of a case the user may read, with its case, version and node loaded.

    Raises Http404 when the gate does not exist or its case is not the user's to see.
    """
    try:
        return Gate.objects.select_related(
            "case", "case__submitter", "case__current_version", "version", "node", "node__parent"
        ).get(pk=gate_id, case__in=visible_cases(user))
    except (Gate.DoesNotExist, ValueError, TypeError):
        raise Http404("No such gate") from None


def unread_notifications(user: User | AnonymousUser) -> QuerySet[Notification]:
    """Return the user's notifications not read yet (none for visitors)."""
    if not user.is_authenticated:
        return Notification.objects.none()
    return Notification.objects.filter(user_id=user.pk, read_at__isnull=True)
