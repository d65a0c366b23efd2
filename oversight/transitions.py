"""The state machine of a gate's status: its table and its move function.

Nothing else assigns `Gate.status` (a gate is created `pending`, or `approved` when an edit carries
an unchanged step's approval over). See `audit.transitions` for how a move is checked and audited.
"""

from __future__ import annotations

from typing import Any

from audit.transitions import Audit, Transitions, move_row
from oversight.models import Gate, GateStatus

__all__ = ["GATE", "move_gate"]

_S = GateStatus

GATE = Transitions.of(
    "Gate.status",
    {
        # Decided (an approval once the quorum is reached), held past its deadline, or void: its
        # version was replaced or rejected, its case ended, or its step ended in an earlier version.
        _S.PENDING: {_S.APPROVED, _S.REJECTED, _S.EXPIRED, _S.VOID},
        # Held, but still open: it may still be decided, or voided as a pending one.
        _S.EXPIRED: {_S.APPROVED, _S.REJECTED, _S.VOID},
        # An approval that no longer holds (expired, or its content changed) is replaced by a new
        # pending gate: the old one is void.
        _S.APPROVED: {_S.VOID},
        _S.REJECTED: set(),
        _S.VOID: set(),
    },
)


def move_gate(gate: Gate, *, to: str, audit: Audit, **fields: Any) -> str:
    """Move a gate read under its lock to `to`, with the fields that go with it; return its status
    before. Raises IllegalTransition (StaleTransition when it changed meanwhile)."""
    return move_row(GATE, gate, to=to, audit=audit, label=f"{gate.kind} gate {gate.pk}", **fields)
