"""The reconciler: lost messages, expired leases, time-outs and dead letters (beat)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from audit.chain import NewEvent, case_chain
from audit.transitions import audited
from execution.cases import finish_if_done
from execution.common import (
    LEAF,
    OPEN_LEAF_STATUSES,
    REDISPATCH_BATCH,
    RUNNING_CASE_STATUSES,
    ErrorClass,
    hard_limit_s,
    is_stopped,
    max_deliveries,
    redispatch_after_s,
    send_leaf,
)
from execution.ending import apply_failure, end_attempt
from execution.judging import resend_goal_judges
from execution.liveness import repair_stuck_cases
from execution.models import LeafAttempt
from oversight.actions.opening import open_escalation_gate
from oversight.models import OPEN_GATE_STATUSES, Gate
from planning.models import Case, CaseStatus, NodeStatus, PlanNode
from planning.transitions import move_node

logger = logging.getLogger(__name__)

# The reconciler ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconciled:
    """What one reconciler pass did, by leaf id."""

    resent: tuple[int, ...] = ()
    recovered: tuple[int, ...] = ()
    timed_out: tuple[int, ...] = ()
    dead_lettered: tuple[int, ...] = ()
    retried: tuple[int, ...] = ()
    # Cases (by id) whose end no completion got to decide (its worker died right after it).
    finished: tuple[int, ...] = ()
    # Verifying cases whose goal judge was sent again (a lost message or a dead delivery).
    judges_resent: tuple[int, ...] = ()

    def as_data(self) -> dict[str, list[int]]:
        return {
            "finished": list(self.finished),
            "resent": list(self.resent),
            "recovered": list(self.recovered),
            "timed_out": list(self.timed_out),
            "dead_lettered": list(self.dead_lettered),
            "retried": list(self.retried),
            "judges_resent": list(self.judges_resent),
        }


def reconcile_execution(now: datetime | None = None) -> Reconciled:
    """Recover what messages and workers lost: safe to run often and from two schedulers.

    Re-sends ready leaves sent longer ago than the redispatch delay (a lost message: E3, E4);
    makes retrying leaves whose wait is over ready; recovers running leaves whose lease expired
    (a dead or stopped worker: E1, E10) — re-run with the same idempotency key, or, past the hard
    time limit, timed out (E9), or, after too many deliveries, dead-lettered with an escalation
    gate (E2). Each leaf is locked with SKIP LOCKED, so two reconcilers never act twice.
    """
    now = now or timezone.now()
    stopped = is_stopped()
    resent: list[int] = []
    retried: list[int] = []
    recovered: list[int] = []
    timed_out: list[int] = []
    dead: list[int] = []
    with transaction.atomic():
        # By case, so two reconcilers take the cases' chain heads in one order.
        due = list(
            PlanNode.objects.select_for_update(of=("self",), skip_locked=True)
            .select_related("version")
            .only("pk", "key", "status", "attempts", "version__case_id")
            .filter(status=NodeStatus.RETRYING, next_attempt_at__lte=now)
            .order_by("version__case_id", "pk")
        )
        for node in due:
            with audited(chain=case_chain(node.version.case_id)) as audit:
                move_node(node, to=NodeStatus.READY, audit=audit, next_attempt_at=None)
                audit.add(
                    NewEvent(
                        "execution.leaf.retry_ready",
                        None,
                        {
                            "node": node.key,
                            "attempt": node.attempts,
                            "why": "its wait before the next attempt is over",
                            "before": {"status": "retrying"},
                            "after": {"status": "ready"},
                        },
                    )
                )
            retried.append(node.pk)
            if not stopped:
                send_leaf(node.pk)
    if not stopped:
        stale_before = now - timedelta(seconds=redispatch_after_s())
        with transaction.atomic():
            # The oldest first, a bounded batch a pass: a long queue behind busy workers is not
            # lost, and re-sending all of it every pass would only grow it.
            lost = list(
                PlanNode.objects.select_for_update(skip_locked=True)
                .filter(status=NodeStatus.READY)
                .filter(Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=stale_before))
                .order_by("enqueued_at", "pk")
                .values_list("pk", flat=True)[:REDISPATCH_BATCH]
            )
            for pk in lost:
                send_leaf(pk)
                resent.append(pk)
    with transaction.atomic():
        expired = list(
            PlanNode.objects.select_for_update(of=("self",), skip_locked=True)
            .select_related("version")
            .filter(status=NodeStatus.RUNNING, lease_until__lt=now)
            .order_by("version__case_id", "pk")
        )
        for node in expired:
            case = Case.objects.select_for_update().get(pk=node.version.case_id)
            chain = case_chain(case.pk)
            # The worker renews the lease until the hard limit and no further: a lease that
            # covered the whole limit belonged to an attempt alive until then (it timed out); a
            # shorter one to a worker that died or stopped early (it is recovered).
            held = (
                (node.lease_until - node.started_at).total_seconds()
                if node.started_at and node.lease_until
                else 0.0
            )
            attempt = node.attempts
            if case.status not in RUNNING_CASE_STATUSES:
                with audited(chain=chain) as audit:
                    move_node(
                        node,
                        to=NodeStatus.CANCELLED,
                        audit=audit,
                        lease_until=None,
                        finished_at=now,
                    )
                    end_attempt(node, attempt, LeafAttempt.Outcome.LOST)
                    audit.add(
                        NewEvent(
                            "execution.leaf.cancelled",
                            None,
                            {
                                "node": node.key,
                                "attempt": attempt,
                                "why": f"its lease expired and the case is {case.status}",
                                "before": {"status": "running"},
                                "after": {"status": "cancelled"},
                            },
                        )
                    )
                continue
            if held >= hard_limit_s():
                timed_out.append(node.pk)
                apply_failure(
                    node,
                    case,
                    attempt,
                    error_class=ErrorClass.TIMEOUT,
                    error=f"no result within the hard time limit of {hard_limit_s():g} s",
                )
                continue
            end_attempt(node, attempt, LeafAttempt.Outcome.LOST, error="lease expired")
            if attempt >= max_deliveries():
                dead.append(node.pk)
                with audited(chain=chain) as audit:
                    move_node(
                        node,
                        to=NodeStatus.AWAITING_APPROVAL,
                        audit=audit,
                        lease_until=None,
                        error_class=ErrorClass.POISON,
                        error=f"dead-lettered: its worker was lost {attempt} times in a row",
                    )
                    audit.add(
                        NewEvent(
                            "execution.leaf.dead_lettered",
                            None,
                            {"node": node.key, "attempts": attempt},
                        )
                    )
                open_escalation_gate(
                    node.version,
                    node,
                    reason=f"step {node.key} was dead-lettered: its worker was lost {attempt} "
                    "times; approve to run it once more, reject to fail it",
                )
                continue
            recovered.append(node.pk)
            with audited(chain=chain) as audit:
                move_node(node, to=NodeStatus.READY, audit=audit, lease_until=None)
                audit.add(
                    NewEvent(
                        "execution.leaf.recovered",
                        None,
                        {
                            "node": node.key,
                            "attempt": attempt,
                            "why": "its lease expired (worker lost or stopped)",
                            "before": {"status": "running"},
                            "after": {"status": "ready"},
                        },
                    )
                )
            if not stopped:
                send_leaf(node.pk)
    finished = _finish_forgotten_cases()
    judges_resent, judges_failed = resend_goal_judges(now)
    repair_stuck_cases(now)  # liveness: a running case that nothing can move (S12)
    return Reconciled(
        finished=tuple(finished + judges_failed),
        judges_resent=tuple(judges_resent),
        resent=tuple(resent),
        recovered=tuple(recovered),
        timed_out=tuple(timed_out),
        dead_lettered=tuple(dead),
        retried=tuple(retried),
    )


def _finish_forgotten_cases() -> list[int]:
    """End running cases whose current version has no open leaf and no open gate left."""
    open_leaves = PlanNode.objects.filter(
        version_id=OuterRef("current_version_id"), kind=LEAF, status__in=OPEN_LEAF_STATUSES
    )
    open_gates = Gate.objects.filter(
        version_id=OuterRef("current_version_id"), status__in=OPEN_GATE_STATUSES
    )
    finished: list[int] = []
    with transaction.atomic():
        cases = list(
            Case.objects.select_for_update(skip_locked=True)
            .filter(status=CaseStatus.EXECUTING, current_version__isnull=False)
            .exclude(Exists(open_leaves))
            .exclude(Exists(open_gates))[:REDISPATCH_BATCH]
        )
        for case in cases:
            if finish_if_done(case) is not None:
                finished.append(case.pk)
    return finished
