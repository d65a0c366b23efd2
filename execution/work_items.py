"""Human leaves: a work item in the assignee group's inbox, completed with an output, reminded
half-way to its deadline and escalated at it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import Group, User
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from audit.chain import NewEvent, append_event, case_chain
from audit.transitions import audited
from execution import notices
from execution.common import (
    RUNNING_CASE_STATUSES,
    Claim,
    Ended,
    LeafStopped,
    StaleResult,
    WorkItemConflict,
    is_stopped,
)
from execution.ending import complete_leaf, record_stale
from execution.models import WorkItem
from execution.outputs import check_output
from execution.queries import work_item_groups
from execution.transitions import move_work_item, move_work_items
from oversight.actions.gate_policy import active_policy, role_group
from planning.models import Case, NodeStatus, PlanNode

logger = logging.getLogger(__name__)

# Human leaves ---------------------------------------------------------------------------------


def open_work_item(claim: Claim, *, group_name: str) -> WorkItem:
    """Give a running human leaf to its group as a work item (the leaf waits for it).

    This is the human runner's safe point: under the case's row (a cancel holds it while it
    closes the case's open items), it checks that the case still runs, the stop switch is off
    and the attempt still holds the leaf. Raises LeafStopped otherwise — no item opens, the leaf
    keeps its lease, and the worker ends it at the safe point (`cancelled`, or `ready` again
    after a stop; audited) — and StaleResult for an attempt that lost the leaf.
    """
    _, policy = active_policy()
    with transaction.atomic():
        # The lock order: the case, then the leaf, then the work item (S7, S9).
        case = Case.objects.select_for_update().get(pk=claim.case_id)
        node = PlanNode.objects.select_for_update(of=("self",)).get(pk=claim.node_id)
        if node.status != NodeStatus.RUNNING or node.attempts != claim.attempt:
            raise StaleResult(
                f"attempt {claim.attempt} of {node.key} is stale", node=node, attempt=claim.attempt
            )
        if case.status not in RUNNING_CASE_STATUSES:
            raise LeafStopped(f"the case is {case.status}", cancelled=True)
        if is_stopped():
            raise LeafStopped("execution is stopped", cancelled=False)
        now = timezone.now()
        # The policy's gate deadline: reminded half-way, escalated to its escalation group at it.
        item, created = WorkItem.objects.get_or_create(
            node=node,
            attempt=claim.attempt,
            defaults={
                "case_id": claim.case_id,
                "group": role_group(group_name),
                "created_at": now,
                "deadline": now + timedelta(hours=policy.gate_hours),
                "remind_at": now + timedelta(hours=policy.gate_hours) / 2,
                "escalation_group": role_group(policy.escalation_group),
            },
        )
        # A person takes hours, not seconds: no lease to expire while the item is open.
        PlanNode.objects.filter(pk=node.pk).update(lease_until=None)
        if created:
            append_event(
                "execution.work_item.opened",
                chain=case_chain(claim.case_id),
                data={"node": node.key, "work_item": item.pk, "group": group_name},
            )
            notices.work_item_opened(item)
        return item


def complete_work_item(*, item_id: int, user: User, output: Mapping[str, Any]) -> Ended:
    """Complete an open work item of the user's group with its output; the leaf succeeds.

    The item's group may complete it, and its escalation group too once it escalated. Raises
    WorkItemConflict when the item is not open (or not for the user's groups), whatever output
    validation raises (the runner's schema check, ValueError with the field), and StaleResult
    when the leaf no longer waits for this item's attempt: the refusal is then recorded and the
    item cancelled, in a transaction of their own (the completing one rolled back).
    """
    try:
        return _complete_work_item(item_id=item_id, user=user, output=output)
    except StaleResult as exc:
        _refuse_stale(item_id, user, exc)
        raise


def _complete_work_item(*, item_id: int, user: User, output: Mapping[str, Any]) -> Ended:
    with transaction.atomic():
        # The case's row first (the lock order: case, then its leaves and items), as a cancel
        # takes it before it ends the item's leaf: the two never wait for each other in a circle.
        case_id = WorkItem.objects.filter(pk=item_id).values_list("case_id", flat=True).first()
        if case_id is None:
            raise WorkItemConflict("no such open work item for your groups")
        Case.objects.select_for_update().get(pk=case_id)
        item = (
            WorkItem.objects.select_for_update()
            .select_related("node", "node__version")
            .filter(work_item_groups(user.groups.all()), pk=item_id)
            .first()
        )
        if item is None:
            raise WorkItemConflict("no such open work item for your groups")
        if item.status != WorkItem.Status.OPEN:
            raise WorkItemConflict(f"the work item is {item.status}")
        if item.case.submitter_id == user.pk:
            raise WorkItemConflict("you submitted this case: another person must do this step")
        checked = check_output(item.node, output)
        with audited(chain=case_chain(item.case_id)) as audit:
            move_work_item(
                item,
                to=WorkItem.Status.COMPLETED,
                audit=audit,
                completed_by=user,
                completed_at=timezone.now(),
                output=checked,
            )
            audit.add(
                NewEvent(
                    "execution.work_item.completed",
                    user,
                    {"work_item": item.pk, "node": item.node.key, "output": checked},
                )
            )
        return complete_leaf(item.node_id, item.attempt, checked, kind="human")


def _refuse_stale(item_id: int, user: User, exc: StaleResult) -> None:
    """Record a person's refused result and close the item no attempt waits for any more.

    complete_leaf recorded the refusal already, but inside the completing transaction, which
    the StaleResult rolled back: it is recorded again here, after that rollback.
    """
    with transaction.atomic(), audited(chain=case_chain(exc.node.version.case_id)) as audit:
        # The item's row before the chain head, in the order of a completion.
        cancelled = move_work_items(
            WorkItem.objects.filter(pk=item_id), to=WorkItem.Status.CANCELLED, audit=audit
        )
        record_stale(exc)
        audit.add(
            NewEvent(
                "execution.work_item.refused",
                user,
                {
                    "work_item": item_id,
                    "node": exc.node.key,
                    "attempt": exc.attempt,
                    "why": f"the step no longer waits for this work item: {exc}",
                    "cancelled": bool(cancelled),
                },
            )
        )


# Deadlines -----------------------------------------------------------------------------------

# Only items a running attempt of a running case still waits for are swept (a stale one is
# closed when tried; a case that ended or was cancelled closes its items, S7).
_LIVE = Q(
    status=WorkItem.Status.OPEN,
    node__status=NodeStatus.RUNNING,
    node__attempts=F("attempt"),
    case__status__in=RUNNING_CASE_STATUSES,
)
_SWEEP_BATCH = 500


def _item_data(item: WorkItem, now: datetime) -> dict[str, Any]:
    return {
        "work_item": item.pk,
        "node": item.node.key,
        "attempt": item.attempt,
        "group": item.group.name,
        "deadline": item.deadline.isoformat(),
        "time": now.isoformat(),
    }


def _sweep_step(
    query: Q,
    changes: Callable[[WorkItem], dict[str, Any]],
    action: str,
    tell: Callable[[WorkItem], None],
    now: datetime,
) -> int:
    """Apply one deadline step to each due work item once, even with two schedulers at once.

    Each item is a transaction of its own holding the change, its audit event and the notices.
    The event is appended first, so the sweep waits for the case's chain head holding no other
    lock, and only then takes the item's row, SKIP LOCKED and only if still due: it never waits
    for a row while holding one, so a completion, a cancel or a failing step of the case (which
    take the item and the head in either order) cannot deadlock with it. An item another sweeper
    did, or that is held, rolls its event back and is left.
    """
    done = 0
    due = list(
        WorkItem.objects.select_related("case", "node", "group", "escalation_group")
        .filter(query)
        .order_by("deadline", "id")[:_SWEEP_BATCH]
    )
    for item in due:
        update = changes(item)
        for name, value in update.items():
            setattr(item, name, value)
        data = _item_data(item, now)
        if item.escalated_at is not None and item.escalation_group is not None:
            data["escalation_group"] = item.escalation_group.name
        with transaction.atomic():
            append_event(action, chain=case_chain(item.case_id), data=data)
            still_due = (
                WorkItem.objects.select_for_update(skip_locked=True, of=("self",))
                .filter(Q(pk=item.pk) & query)
                .values_list("pk", flat=True)
            )
            if not list(still_due):
                transaction.set_rollback(True)
                continue
            WorkItem.objects.filter(pk=item.pk).update(**update)
            tell(item)
            done += 1
    return done


def sweep_work_items(now: datetime | None = None) -> dict[str, int]:
    """Remind and escalate the open work items by their deadlines (beat); never complete one.

    - half-way to the deadline: a reminder to the item's group;
    - at the deadline: escalation to its escalation group (the policy's, compliance supervisors
      by default), whose members may complete it from then on; the item shows as overdue.
    Each step happens once per item. Returns how many items took each step.
    """
    now = now or timezone.now()
    _, policy = active_policy()
    # Items opened before the escalation group was stored take today's policy's.
    today: Group | None = None

    def escalation(item: WorkItem) -> dict[str, Any]:
        nonlocal today
        if item.escalation_group is None and today is None:
            today = role_group(policy.escalation_group)
        return {"escalated_at": now, "escalation_group": item.escalation_group or today}

    reminded = _sweep_step(
        _LIVE & Q(reminded_at__isnull=True, remind_at__lte=now),
        lambda item: {"reminded_at": now},
        "execution.work_item.reminded",
        notices.work_item_reminder,
        now,
    )
    escalated = _sweep_step(
        _LIVE & Q(escalated_at__isnull=True, deadline__lte=now),
        escalation,
        "execution.work_item.escalated",
        notices.work_item_escalated,
        now,
    )
    return {"reminded": reminded, "escalated": escalated}
