"""Notifications: the signed-in user marks their own in-app notices read; a notice that a gate
waits goes read by itself once every gate it names is decided (or void)."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from oversight.models import OPEN_GATE_STATUSES, Gate, Notification

# The notices that say gates wait for a decision (opened, due, escalated).
GATE_NOTICE_KINDS = ("gate.opened", "gate.reminder", "gate.escalated")


@transaction.atomic
def mark_notifications_read(*, user: User, notification_ids: Iterable[int] | None = None) -> int:
    """Mark the user's unread notifications read (all of them, or those with these ids).

    Only the user's own notices change; returns how many did. Reading is not audited: a notice
    carries no decision, and the decisions it points to are in the trail.
    """
    unread = Notification.objects.filter(user_id=user.pk, read_at__isnull=True)
    if notification_ids is not None:
        unread = unread.filter(pk__in=list(notification_ids))
    return unread.update(read_at=timezone.now())


def read_gate_notices(*, case_id: int) -> int:
    """Mark read every unread notice of the case that said gates wait, once none of its gates
    is open any more (each decided or void); return how many.

    For every user: a notice that "2 gates wait for your decision" is no longer true for anyone
    once they are decided. Called in the transaction that closed the gates.
    """
    unread = list(
        Notification.objects.filter(
            case_id=case_id, kind__in=GATE_NOTICE_KINDS, read_at__isnull=True
        ).values_list("pk", "gate_id", "gate_ids")
    )
    if not unread:
        return 0
    named = {pk: set(ids or ([gate] if gate else [])) for pk, gate, ids in unread}
    still_open = set(
        Gate.objects.filter(
            pk__in=set().union(*named.values()), status__in=OPEN_GATE_STATUSES
        ).values_list("pk", flat=True)
    )
    done = [pk for pk, gates in named.items() if gates and not gates & still_open]
    if not done:
        return 0
    return Notification.objects.filter(pk__in=done).update(read_at=timezone.now())


__all__ = ["GATE_NOTICE_KINDS", "mark_notifications_read", "read_gate_notices"]
