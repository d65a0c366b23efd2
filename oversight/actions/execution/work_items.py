"""Human leaves: a work item in the assignee group's inbox, completed with an output."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from oversight import notify
from oversight.actions.execution.common import Claim, Ended, StaleResult, WorkItemConflict
from oversight.actions.execution.ending import complete_leaf
from oversight.audit import append_event, case_chain
from oversight.models import (
    WorkItem,
)
from planning.models import NodeStatus, PlanNode

logger = logging.getLogger(__name__)

# Human leaves ---------------------------------------------------------------------------------


def open_work_item(claim: Claim, *, group_name: str) -> WorkItem:
    """Give a running human leaf to its group as a work item (the leaf waits for it)."""
    from oversight.actions.gates import _group, active_policy

    _, policy = active_policy()
    with transaction.atomic():
        node = PlanNode.objects.select_for_update(of=("self",)).get(pk=claim.node_id)
        if node.status != NodeStatus.RUNNING or node.attempts != claim.attempt:
            raise StaleResult(
                f"attempt {claim.attempt} of {node.key} is stale", node=node, attempt=claim.attempt
            )
        now = timezone.now()
        item, created = WorkItem.objects.get_or_create(
            node=node,
            attempt=claim.attempt,
            defaults={
                "case_id": claim.case_id,
                "group": _group(group_name),
                "created_at": now,
                "deadline": now + timedelta(hours=policy.gate_hours),
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
            notify.work_item_opened(item)
        return item


def complete_work_item(*, item_id: int, user: User, output: Mapping[str, Any]) -> Ended:
    """Complete an open work item of the user's group with its output; the leaf succeeds.

    Raises WorkItemConflict when the item is not open (or not for the user's groups), and
    whatever output validation raises (the runner's schema check, ValueError with the field).
    """
    from oversight.runners import check_output

    with transaction.atomic():
        item = (
            WorkItem.objects.select_for_update()
            .select_related("node", "node__version")
            .filter(pk=item_id, group__in=user.groups.all())
            .first()
        )
        if item is None:
            raise WorkItemConflict("no such open work item for your groups")
        if item.status != WorkItem.Status.OPEN:
            raise WorkItemConflict(f"the work item is {item.status}")
        if item.case.submitter_id == user.pk:
            raise WorkItemConflict("you submitted this case: another person must do this step")
        checked = check_output(item.node, output)
        item.status = WorkItem.Status.COMPLETED
        item.completed_by = user
        item.completed_at = timezone.now()
        item.output = checked
        item.save(update_fields=["status", "completed_by", "completed_at", "output"])
        append_event(
            "execution.work_item.completed",
            actor=user,
            chain=case_chain(item.case_id),
            data={"work_item": item.pk, "node": item.node.key, "output": checked},
        )
        return complete_leaf(item.node_id, item.attempt, checked, kind="human")
