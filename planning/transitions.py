"""The state machines of a case's status and of a plan node's: their tables and move functions.

Nothing else assigns `Case.status` (a case is submitted `planning`). See `audit.transitions` for
how a move is checked and audited.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from audit.transitions import Audit, Transitions, move_row
from planning.models import Case, CaseStatus

__all__ = ["CASE", "move_case"]

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
