"""Notifications: the signed-in user marks their own in-app notices read."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from oversight.models import Notification


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


__all__ = ["mark_notifications_read"]
