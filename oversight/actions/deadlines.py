"""Gates past their deadline: a reminder at half-time, then escalation or hold, swept by Celery
beat. Each step claims its gates with SKIP LOCKED, so two schedulers act on each gate once."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.chain import NewEvent, case_chain
from audit.transitions import audited
from oversight import notify
from oversight.actions.gate_policy import active_policy
from oversight.models import (
    Gate,
    GateStatus,
)
from oversight.transitions import move_gate

logger = logging.getLogger(__name__)


def _sweep_step(
    query: Q, update: dict[str, Any], action: str, now: datetime, *, to: str | None = None
) -> list[Gate]:
    """Apply one deadline step to each due gate once, even with two schedulers at once.

    Each gate is a transaction of its own: its event is appended first, so the sweep waits for
    the case's chain head holding no other lock, and only then is the gate's row taken, SKIP
    LOCKED and only if still due. It never waits for a row while holding one, so a decision, an
    edit or a failing step of the case (which take the gate and the head in either order) cannot
    deadlock with it. A gate another sweeper did, or that is held, rolls its event back. `to`
    is the status the step moves the gate to, if it moves it.
    """
    done = []
    due = list(
        Gate.objects.select_related("case", "version", "node", "approver_group", "escalation_group")
        .filter(query)
        .order_by("deadline", "id")[:500]
    )
    for gate in due:
        for name, value in update.items():
            setattr(gate, name, value)
        with transaction.atomic(), audited(chain=case_chain(gate.case_id)) as audit:
            audit.add(
                NewEvent(
                    action,
                    None,
                    {
                        "gate": gate.pk,
                        "kind": gate.kind,
                        "deadline": gate.deadline.isoformat(),
                        "time": now.isoformat(),
                    },
                ),
                now=True,
            )
            still_due = list(
                Gate.objects.select_for_update(skip_locked=True, of=("self",))
                .filter(Q(pk=gate.pk) & query)
                .values_list("pk", flat=True)
            )
            if not still_due:
                transaction.set_rollback(True)
                continue
            if to is None:
                Gate.objects.filter(pk=gate.pk).update(**update)
            else:
                move_gate(gate, to=to, audit=audit, **update)
        done.append(gate)
    return done


def sweep_gates(now: datetime | None = None) -> dict[str, int]:
    """Remind, escalate and hold the gates past their deadlines; never approve by time (R5).

    - half-way to the deadline: a reminder to the approver group;
    - at the deadline: escalation to the escalation group, who may decide from then on; the
      deadline moves on by the policy's escalation period;
    - at that deadline: the gate is `expired` — held; the case waits for a decision.
    Returns how many gates took each step.
    """
    now = now or timezone.now()
    _, policy = active_policy()
    pending = Q(status=GateStatus.PENDING)
    reminded = _sweep_step(
        pending & Q(reminded_at__isnull=True, remind_at__lte=now),
        {"reminded_at": now},
        "oversight.gate.reminded",
        now,
    )
    for gate in reminded:
        notify.gate_reminder(gate)
    escalated = _sweep_step(
        pending & Q(escalated_at__isnull=True, deadline__lte=now),
        {"escalated_at": now, "deadline": now + timedelta(hours=policy.escalation_hours)},
        "oversight.gate.escalated",
        now,
    )
    for gate in escalated:
        notify.gate_escalated(gate)
    held = _sweep_step(
        pending & Q(escalated_at__isnull=False, deadline__lte=now),
        {"held_at": now},
        "oversight.gate.held",
        now,
        to=GateStatus.EXPIRED,
    )
    return {"reminded": len(reminded), "escalated": len(escalated), "held": len(held)}
