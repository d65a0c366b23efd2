"""The notices about work items: opened for the group, a reminder, an escalation."""

from __future__ import annotations

from django.urls import reverse

from execution.models import WorkItem
from oversight import notify


def work_item_opened(item: WorkItem) -> None:
    """Tell the work item's group (never the case's submitter) that a step waits for a person."""
    case = item.case
    users = notify.members([item.group_id], except_user=case.submitter_id, case=case)
    notify.notify_users(
        users,
        kind="work_item.opened",
        message=f"Case #{case.pk} “{case.title}”: step {item.node.key} waits for you to do it.",
        url=reverse("execution:work-item", args=[item.pk]),
        case=case,
        gate=None,
        subject=f"[CaseHub] Case #{case.pk}: a step waits for you",
    )


def work_item_reminder(item: WorkItem) -> None:
    """Remind the work item's group that it is half-way to its deadline."""
    case = item.case
    users = notify.members([item.group_id], except_user=case.submitter_id, case=case)
    notify.notify_users(
        users,
        kind="work_item.reminder",
        message=(
            f"Reminder: step {item.node.key} of case #{case.pk} waits for you; it is due "
            f"{item.deadline:%Y-%m-%d %H:%M} UTC."
        ),
        url=reverse("execution:work-item", args=[item.pk]),
        case=case,
        gate=None,
        subject=f"[CaseHub] Reminder: case #{case.pk} step due",
    )


def work_item_escalated(item: WorkItem) -> None:
    """Tell the escalation group that a work item passed its deadline and is theirs to do too."""
    case = item.case
    group = item.escalation_group_id or item.group_id
    users = notify.members([group], except_user=case.submitter_id, case=case)
    notify.notify_users(
        users,
        kind="work_item.escalated",
        message=(
            f"Escalated: step {item.node.key} of case #{case.pk} “{case.title}” passed its "
            "deadline undone. You may do it now; the case waits for it."
        ),
        url=reverse("execution:work-item", args=[item.pk]),
        case=case,
        gate=None,
        subject=f"[CaseHub] Escalated: case #{case.pk} step overdue",
    )
