"""The state machines of a case's status and of a plan node's: their tables and move functions.

Nothing else assigns `Case.status` (a case is submitted `planning`) or `PlanNode.status` (a node
is stored `pending`). See `audit.transitions` for how a move is checked and audited.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.utils import timezone

from audit.chain import NewEvent
from audit.transitions import Audit, Moved, Transitions, move_row, move_rows
from planning.models import Case, CaseStatus, NodeStatus, PlanNode

__all__ = ["CASE", "NODE", "block_nodes", "move_case", "move_node", "move_nodes"]

_C = CaseStatus

CASE = Transitions.of(
    "Case.status",
    {
        # Planned into a version awaiting approval, or planning failed for good.
        _C.PLANNING: {_C.AWAITING_APPROVAL, _C.PLAN_FAILED, _C.CANCELLED},
        _C.PLAN_FAILED: set(),
        # Its plan gate approved or rejected (an edit keeps it awaiting approval).
        _C.AWAITING_APPROVAL: {_C.APPROVED, _C.REJECTED, _C.CANCELLED},
        # The approving transaction starts execution at once; the moves of `executing` are open
        # to an approved case too (execution.common.RUNNING_CASE_STATUSES).
        _C.APPROVED: {
            _C.EXECUTING,
            _C.VERIFYING,
            _C.COMPLETED,
            _C.FAILED,
            _C.REJECTED,
            _C.CANCELLED,
            _C.AWAITING_APPROVAL,
        },
        # Every step ended: verified by the rules (then maybe the goal judge), or failed by a
        # step's `abort` policy; rejected by a step gate's rejection under `abort`; re-planned
        # after a failed step into a version awaiting approval.
        _C.EXECUTING: {
            _C.VERIFYING,
            _C.COMPLETED,
            _C.FAILED,
            _C.REJECTED,
            _C.CANCELLED,
            _C.AWAITING_APPROVAL,
        },
        # The goal judge's verdict (or no verdict after too many deliveries).
        _C.VERIFYING: {_C.COMPLETED, _C.FAILED, _C.CANCELLED},
        _C.COMPLETED: set(),
        _C.FAILED: set(),
        _C.CANCELLED: set(),
        _C.REJECTED: set(),
    },
)


def move_case(case: Case, *, to: str, audit: Audit, **fields: Any) -> str:
    """Move a case read under its row lock to `to`, with the fields that go with it; return its
    status before. Raises IllegalTransition (StaleTransition when it changed meanwhile)."""
    return move_row(
        CASE, case, to=to, audit=audit, label=f"case {case.pk}", updated_at=timezone.now(), **fields
    )


_N = NodeStatus
# What a step that ended in an earlier plan version keeps in the new one (planning.versions).
_KEPT = {_N.SUCCEEDED, _N.FAILED, _N.SKIPPED}

NODE = Transitions.of(
    "PlanNode.status",
    {
        # Gated when its version's gates open; released once the steps it needs succeeded;
        # blocked when one of them will not; or keeps what it ended as in an earlier version.
        _N.PENDING: {_N.AWAITING_APPROVAL, _N.READY, _N.BLOCKED, _N.CANCELLED, *_KEPT},
        # Its gate (a step gate or an escalation) approved, rejected (skipped under `continue`,
        # failed under `abort`, or for good after an escalation), or it ended in an earlier version.
        _N.AWAITING_APPROVAL: {_N.PENDING, _N.BLOCKED, _N.CANCELLED, *_KEPT},
        # Claimed by a worker; back to waiting when its approval no longer holds or its routing
        # escalates.
        _N.READY: {_N.RUNNING, _N.PENDING, _N.AWAITING_APPROVAL, _N.BLOCKED, _N.CANCELLED},
        # Its attempt ends: succeeded, failed (for good, or to be retried, or escalated), stopped at
        # a safe point or recovered from a lost worker (ready again), cancelled.
        _N.RUNNING: {
            _N.SUCCEEDED,
            _N.FAILED,
            _N.RETRYING,
            _N.READY,
            _N.AWAITING_APPROVAL,
            _N.CANCELLED,
        },
        # Ready again once its wait is over (or claimed by the retry's own message).
        _N.RETRYING: {
            _N.READY,
            _N.RUNNING,
            _N.PENDING,
            _N.AWAITING_APPROVAL,
            _N.BLOCKED,
            _N.CANCELLED,
        },
        _N.SUCCEEDED: set(),
        _N.FAILED: set(),
        _N.SKIPPED: set(),
        _N.CANCELLED: set(),
        _N.BLOCKED: set(),
    },
)


def move_node(node: PlanNode, *, to: str, audit: Audit, **fields: Any) -> str:
    """Move a plan node read under its lock to `to`, with the fields that go with it; return its
    status before. Raises IllegalTransition (StaleTransition when it changed meanwhile)."""
    return move_row(NODE, node, to=to, audit=audit, label=f"node {node.key} ({node.pk})", **fields)


def move_nodes(
    nodes: QuerySet[PlanNode] | Sequence[PlanNode],
    *,
    to: str,
    audit: Audit,
    from_: Iterable[str] | None = None,
    **fields: Any,
) -> list[Moved]:
    """Move, set-based, the nodes in one of the `from_` statuses (by default every status that may
    move to `to`) to `to`; return them, each with its `key`. `nodes` is a query, or nodes the
    caller locked already. Raises IllegalTransition as `move_rows` does."""
    return move_rows(NODE, nodes, to=to, audit=audit, from_=from_, read=("key",), **fields)


def block_nodes(
    nodes: QuerySet[PlanNode],
    *,
    audit: Audit,
    why: str,
    actor: User | None = None,
    from_: Iterable[str] | None = None,
) -> list[str]:
    """Block the nodes of the query that are still waiting (a running one ends on its own), each
    with an event of its own, `planning.node.blocked`; return their keys."""
    moved = move_nodes(nodes, to=NodeStatus.BLOCKED, audit=audit, from_=from_)
    audit.add(
        *(
            NewEvent(
                "planning.node.blocked",
                actor,
                {
                    "node": node.values["key"],
                    "why": why,
                    "before": {"status": node.before},
                    "after": {"status": node.after},
                },
            )
            for node in moved
        )
    )
    return [node.values["key"] for node in moved]
