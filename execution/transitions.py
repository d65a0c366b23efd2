"""The state machine of a work item's status: its table and its one move function.

Nothing else assigns `WorkItem.status` (a new item is created `open`). See `audit.transitions`
for how a move is checked and audited.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from audit.transitions import Audit, Moved, Transitions, move_row, move_rows
from execution.models import WorkItem

__all__ = ["WORK_ITEM", "move_work_item", "move_work_items"]

_S = WorkItem.Status

WORK_ITEM = Transitions.of(
    "WorkItem.status",
    {
        # A person completes it; or it closes unanswered: its step ended without it (the case was
        # cancelled or ended, a re-plan replaced the version), or the step no longer waits for
        # this attempt (a person's late result, refused).
        _S.OPEN: {_S.COMPLETED, _S.CANCELLED},
        _S.COMPLETED: set(),
        _S.CANCELLED: set(),
    },
)


def move_work_item(item: WorkItem, *, to: str, audit: Audit, **fields: Any) -> str:
    """Move a work item read under its lock to `to`, with the fields that go with it; return its
    status before. Raises IllegalTransition (StaleTransition when it changed meanwhile)."""
    return move_row(WORK_ITEM, item, to=to, audit=audit, label=f"work item {item.pk}", **fields)


def move_work_items(
    items: QuerySet[WorkItem], *, to: str, audit: Audit, read: tuple[str, ...] = (), **fields: Any
) -> list[Moved]:
    """Move, set-based, the items of the query whose status may move to `to`; return them (with
    the values named in `read`). Raises IllegalTransition as `move_rows` does."""
    return move_rows(WORK_ITEM, items, to=to, audit=audit, read=read, **fields)
