"""Liveness: a case is never left running with nothing that can move it (RELIABILITY S12).

A case that runs (`approved`, `executing`) moves while its current version has an open gate, a
leaf that is `ready` or `retrying` or `running` under a lease, or the case has an open work item;
a `verifying` case moves while its goal judge is in flight (the reconciler sends it again when
its message or delivery is lost: `judging.resend_goal_judges`). A case with none of these is
stuck: `why_stuck` says why (a pure read), `stuck_cases` lists them, and the reconciler repairs
each one under its case row (`repair_stuck_cases`, audited as `execution.case.stuck`):

- every leaf ended: the case ends by goal-level verification (`finish_if_done`);
- a `pending` leaf whose dependencies all succeeded (its release was lost) is made ready;
- a `running` leaf with no lease and no open work item (no worker, no person holds it) is made
  ready again, with the same idempotency key;
- a leaf `awaiting_approval` with no open gate gets an escalation gate of its own (approve: it
  runs; reject: it fails);
- anything else (leaves that wait for steps that can no longer succeed) gets a case-level
  escalation gate; once approved, the reconciler cancels the open leaves and the goal decides;
  once rejected, the case fails.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from audit.chain import NewEvent, append_event, case_chain
from audit.transitions import audited
from execution.cases import cancel_open_leaves, end_case, finish_if_done
from execution.claiming import release_ready
from execution.common import LEAF, OPEN_LEAF_STATUSES, REDISPATCH_BATCH, is_stopped, send_leaf
from execution.models import WorkItem
from oversight.actions.opening import open_escalation_gate
from oversight.models import OPEN_GATE_STATUSES, Gate, GateKind, GateStatus
from planning.models import Case, CaseStatus, NodeStatus, PlanNode, PlanVersion
from planning.transitions import move_node

logger = logging.getLogger(__name__)

STUCK = "execution.case.stuck"
# The statuses liveness answers for: the case runs, or waits for its goal judge.
LIVE_CASE_STATUSES = (CaseStatus.APPROVED, CaseStatus.EXECUTING, CaseStatus.VERIFYING)
MOVING_LEAF = Q(status__in=(NodeStatus.READY, NodeStatus.RETRYING)) | Q(
    status=NodeStatus.RUNNING, lease_until__isnull=False
)


def _movable() -> Q:
    """What lets a running case move: as subqueries on the case row."""
    version = OuterRef("current_version_id")
    gate = Gate.objects.filter(version_id=version, status__in=OPEN_GATE_STATUSES)
    leaf = PlanNode.objects.filter(version_id=version, kind=LEAF).filter(MOVING_LEAF)
    item = WorkItem.objects.filter(case_id=OuterRef("pk"), status=WorkItem.Status.OPEN)
    return Q(Exists(gate)) | Q(Exists(leaf)) | Q(Exists(item))


def stuck_cases() -> dict[int, str]:
    """Return the stuck cases, by id, with why each is stuck (a read; changes nothing)."""
    running = (
        Case.objects.filter(status__in=(CaseStatus.APPROVED, CaseStatus.EXECUTING))
        .exclude(_movable())
        .order_by("pk")
    )
    found: dict[int, str] = {}
    for case in running.select_related(None)[: REDISPATCH_BATCH * 10]:
        if (why := why_stuck(case)) is not None:
            found[case.pk] = why
    return found


def why_stuck(case: Case) -> str | None:
    """Return why a case that should move cannot, or None when something can move it."""
    if case.status == CaseStatus.VERIFYING:
        # Its judge is in flight: a lost message or delivery is sent again by the reconciler,
        # which fails the case after too many lost deliveries.
        return None
    if case.status not in LIVE_CASE_STATUSES:
        return None
    if case.current_version_id is None:
        return f"the case is {case.status} without a plan version"
    if Case.objects.filter(pk=case.pk).filter(_movable()).exists():
        return None
    open_leaves = dict(
        PlanNode.objects.filter(
            version_id=case.current_version_id, kind=LEAF, status__in=OPEN_LEAF_STATUSES
        ).values_list("key", "status")
    )
    if not open_leaves:
        return (
            f"the case is {case.status}, every step of plan version "
            f"{_number(case)} ended and no gate is open, but the case did not end"
        )
    listed = ", ".join(f"{key} ({status})" for key, status in sorted(open_leaves.items()))
    return (
        f"the case is {case.status} with no open gate, no step ready, retrying or running under "
        f"a lease and no open work item; open steps: {listed}"
    )


def _number(case: Case) -> int:
    assert case.current_version_id is not None
    return int(
        PlanVersion.objects.filter(pk=case.current_version_id).values_list("number", flat=True)[0]
    )


# The reconciler's repair ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Repair:
    """What the reconciler did to one stuck case."""

    case_id: int
    why: str
    action: str


def repair_stuck_cases(now: datetime | None = None) -> list[Repair]:
    """Repair every stuck case, each under its case row (SKIP LOCKED: two reconcilers never act
    on one case twice; a case another transaction holds is moving anyway)."""
    now = now or timezone.now()
    repairs: list[Repair] = []
    for case_id in list(stuck_cases())[:REDISPATCH_BATCH]:
        with transaction.atomic():
            case = Case.objects.select_for_update(skip_locked=True).filter(pk=case_id).first()
            if case is None or (why := why_stuck(case)) is None:
                continue
            action = _repair(case, why, now)
            logger.warning("case %s was stuck (%s): %s", case.pk, why, action)
            repairs.append(Repair(case_id=case.pk, why=why, action=action))
    return repairs


def _stuck_event(case: Case, why: str, action: str, **data: Any) -> None:
    append_event(
        STUCK,
        chain=case_chain(case.pk),
        data={"case": case.pk, "why": why, "action": action, **data},
    )


def _repair(case: Case, why: str, now: datetime) -> str:
    if case.current_version_id is None:
        _stuck_event(case, why, "failed: there is no plan to run")
        end_case(case, CaseStatus.FAILED, reasons=[f"no way forward: {why}"])
        return "failed"
    version = PlanVersion.objects.get(pk=case.current_version_id)
    leaves = list(
        PlanNode.objects.select_for_update(of=("self",))
        .filter(version=version, kind=LEAF, status__in=OPEN_LEAF_STATUSES)
        .order_by("pk")
    )
    if not leaves:
        _stuck_event(case, why, "verified: every step ended, the goal decides")
        finish_if_done(case)
        return "verified"
    succeeded = set(
        PlanNode.objects.filter(
            version=version, kind=LEAF, status=NodeStatus.SUCCEEDED
        ).values_list("key", flat=True)
    )
    releasable = [
        n.pk for n in leaves if n.status == NodeStatus.PENDING and set(n.depends_on) <= succeeded
    ]
    if releasable:
        # Its release was lost: the dependencies all succeeded.
        _stuck_event(case, why, "released: steps whose dependencies all succeeded")
        release_ready(version, candidates=releasable, case=case)
        return "released"
    orphans = [n for n in leaves if n.status == NodeStatus.RUNNING]
    if orphans:
        _stuck_event(case, why, "recovered: running steps that nothing holds")
        stopped = is_stopped()
        for node in orphans:
            with audited(chain=case_chain(case.pk)) as audit:
                move_node(node, to=NodeStatus.READY, audit=audit, lease_until=None, enqueued_at=now)
                audit.add(
                    NewEvent(
                        "execution.leaf.recovered",
                        None,
                        {
                            "node": node.key,
                            "attempt": node.attempts,
                            "why": "it was running with no lease and no open work item",
                            "before": {"status": "running"},
                            "after": {"status": "ready"},
                        },
                    )
                )
            if not stopped:
                send_leaf(node.pk)
        return "recovered"
    waiting = [n for n in leaves if n.status == NodeStatus.AWAITING_APPROVAL]
    if waiting:
        _stuck_event(case, why, "escalated: steps waiting for an approval no gate asks for")
        for node in waiting:
            open_escalation_gate(
                version,
                node,
                reason=f"step {node.key} waits for an approval but no gate of it is open; "
                "approve to run it, reject to fail it",
            )
        return "escalated"
    decided = (
        Gate.objects.filter(version=version, kind=GateKind.ESCALATION, node__isnull=True)
        .exclude(status__in=OPEN_GATE_STATUSES)
        .order_by("-pk")
        .first()
    )
    if decided is not None and decided.status == GateStatus.APPROVED:
        keys = sorted(n.key for n in leaves)
        _stuck_event(
            case,
            why,
            "ended: the escalation was approved; its open steps are cancelled",
            gate=decided.pk,
            cancelled=keys,
            before={"status": NodeStatus.PENDING},
            after={"status": NodeStatus.CANCELLED},
        )
        cancel_open_leaves(
            version.pk, case_id=case.pk, why="the case's escalation was approved: no way forward"
        )
        finish_if_done(case)
        return "ended"
    if decided is not None and decided.status == GateStatus.REJECTED:
        _stuck_event(case, why, "failed: the escalation was rejected", gate=decided.pk)
        end_case(case, CaseStatus.FAILED, reasons=[f"no way forward: {why}; escalation rejected"])
        return "failed"
    gate = open_escalation_gate(
        version,
        None,
        reason=f"no way forward: {why}. Approve to cancel the open steps and end the case by "
        "goal verification; reject to fail it",
    )
    _stuck_event(case, why, "escalated: the case has no way forward", gate=gate.pk)
    return "escalated"
