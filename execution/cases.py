"""A case's end (goal-level verification decides) and its cancellation."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from accounts.roles import ADMIN, OFFICER, SUPERVISOR
from audit.chain import NewEvent, case_chain
from audit.transitions import audited
from execution import dispatch
from execution.common import (
    LEAF,
    OPEN_LEAF_STATUSES,
    RUNNING_CASE_STATUSES,
    CaseNotRunning,
)
from execution.goal_judge import judge_time_limit_s
from execution.models import WorkItem
from execution.transitions import move_work_items
from execution.verdicts import verify_goal
from oversight import notify
from oversight.actions.gates import check_reason
from oversight.actions.opening import void_open_gates
from oversight.models import OPEN_GATE_STATUSES, Gate
from planning.models import Case, CaseStatus, NodeStatus, PlanNode, PlanVersion
from planning.transitions import block_nodes, move_case, move_node, move_nodes

logger = logging.getLogger(__name__)

# Ending the case -------------------------------------------------------------------------------


def finish_if_done(case: Case) -> str | None:
    """End the case once none of its current leaves is open: goal-level verification decides.

    Where an LLM goal judge is configured and the rules hold, the case does not end here: it is
    `verifying` and the judge task is sent on commit (`judging`), so no model is called while
    the case row is locked. Returns the new status, or None while leaves remain. Call with the
    case row locked.
    """
    if case.status not in RUNNING_CASE_STATUSES or case.current_version_id is None:
        return None
    version_id = case.current_version_id
    if PlanNode.objects.filter(
        version_id=version_id, kind=LEAF, status__in=OPEN_LEAF_STATUSES
    ).exists():
        return None
    if Gate.objects.filter(version_id=version_id, status__in=OPEN_GATE_STATUSES).exists():
        return None
    verdict = verify_goal(case)
    if verdict.passed and verdict.judge:
        _await_judge(case, checks=verdict.checks, judge=verdict.judge)
        return case.status
    end_case(
        case,
        CaseStatus.COMPLETED if verdict.passed else CaseStatus.FAILED,
        reasons=list(verdict.reasons),
        checks=list(verdict.checks),
    )
    return case.status


def _await_judge(case: Case, *, checks: Sequence[str], judge: str) -> None:
    """Record that every leaf ended and the rules hold: the case waits for the goal judge."""
    with audited(chain=case_chain(case.pk)) as audit:
        before = move_case(
            case,
            to=CaseStatus.VERIFYING,
            audit=audit,
            judge_lease_until=None,
            # No "passed" yet: the rules' checks and the judge to ask, kept for the verdict.
            verification={"checks": list(checks), "judge": judge},
        )
        audit.add(
            NewEvent(
                "planning.case.verifying",
                None,
                {
                    "case": case.pk,
                    "judge": judge,
                    "checks": list(checks),
                    "before": {"status": before},
                    "after": {"status": case.status},
                },
            )
        )
    dispatch.enqueue_goal_judge(case.pk, time_limit_s=judge_time_limit_s())


# The event of each way a case ends (codes spelt out for tests/audit).
_ENDED: Mapping[str, str] = {
    CaseStatus.COMPLETED: "planning.case.completed",
    CaseStatus.FAILED: "planning.case.failed",
}


def end_case(
    case: Case, status: str, *, reasons: Sequence[str], checks: Sequence[str] = ()
) -> None:
    with audited(chain=case_chain(case.pk)) as audit:
        before = move_case(
            case,
            to=status,
            audit=audit,
            finished_at=timezone.now(),
            verification={
                "passed": status == CaseStatus.COMPLETED,
                "reasons": list(reasons),
                "checks": list(checks),
            },
        )
        if case.current_version_id is not None:
            cancel_open_leaves(
                case.current_version_id, case_id=case.pk, why=f"the case is {status}"
            )
            void_open_gates(
                PlanVersion.objects.get(pk=case.current_version_id), why=f"the case is {status}"
            )
        # After the events of the steps, items and gates it closed.
        audit.add(
            NewEvent(
                _ENDED[status],
                None,
                {
                    "case": case.pk,
                    "before": {"status": before},
                    "after": {"status": status},
                    "verification": case.verification,
                },
            )
        )
    notify.case_finished(case)


def cancel_open_leaves(
    version_id: int, *, case_id: int, why: str, actor: User | None = None
) -> None:
    """End the open leaves of a version `cancelled` and close its open work items.

    A running leaf ends here only when it waits for a person (its worker is at a safe point
    already); the others stop at their next safe point. Each leaf and work item closed is
    audited in an event of its own (`execution.leaf.cancelled`, `execution.work_item.cancelled`),
    in the caller's transaction.
    """
    now = timezone.now()
    with audited(chain=case_chain(case_id)) as audit:
        # A human leaf waiting for its work item has no worker to reach a safe point: it ends here.
        waiting = WorkItem.objects.filter(
            node__version_id=version_id, status=WorkItem.Status.OPEN
        ).values_list("node_id", flat=True)
        leaves = move_nodes(
            PlanNode.objects.filter(pk__in=list(waiting)),
            to=NodeStatus.CANCELLED,
            from_=(NodeStatus.RUNNING,),
            audit=audit,
            finished_at=now,
            lease_until=None,
        )
        leaves += move_nodes(
            PlanNode.objects.filter(version_id=version_id, kind=LEAF),
            to=NodeStatus.CANCELLED,
            from_=(
                NodeStatus.PENDING,
                NodeStatus.AWAITING_APPROVAL,
                NodeStatus.READY,
                NodeStatus.RETRYING,
            ),
            audit=audit,
        )
        closed = move_work_items(
            WorkItem.objects.filter(node__version_id=version_id),
            to=WorkItem.Status.CANCELLED,
            audit=audit,
            read=("node__key", "attempt"),
        )
        audit.add(
            *(
                NewEvent(
                    "execution.leaf.cancelled",
                    actor,
                    {
                        "node": leaf.values["key"],
                        "why": why,
                        "before": {"status": leaf.before},
                        "after": {"status": leaf.after},
                    },
                )
                for leaf in leaves
            ),
            *(
                NewEvent(
                    "execution.work_item.cancelled",
                    actor,
                    {
                        "work_item": item.pk,
                        "node": item.values["node__key"],
                        "attempt": item.values["attempt"],
                        "why": why,
                        "before": {"status": item.before},
                        "after": {"status": item.after},
                    },
                )
                for item in closed
            ),
        )


@transaction.atomic
def cancel_case(*, case_id: int, user: User, reason_code: str, reason: str = "") -> Case:
    """Cancel a case: nothing new starts, queued leaves end `cancelled`, running ones stop at
    their next safe point (E12).

    Raises CaseNotRunning (409) for a case that already ended, PermissionDenied for a user who
    may not cancel it, and ReasonInvalid (422) without a valid `cancel` reason code.
    """
    from django.core.exceptions import PermissionDenied

    code = check_reason(reason_code, "cancel", required=True, text=reason)
    case = Case.objects.select_for_update().get(pk=case_id)
    may = (
        case.submitter_id == user.pk
        or user.groups.filter(name__in=(OFFICER, SUPERVISOR, ADMIN)).exists()
    )
    if not may:
        raise PermissionDenied("only the submitter, compliance officers and admins may cancel")
    ended = (
        CaseStatus.COMPLETED,
        CaseStatus.FAILED,
        CaseStatus.CANCELLED,
        CaseStatus.REJECTED,
        CaseStatus.PLAN_FAILED,
    )
    if case.status in ended:
        raise CaseNotRunning(f"the case is already {case.status}")
    with audited(chain=case_chain(case.pk)) as audit:
        before = move_case(case, to=CaseStatus.CANCELLED, audit=audit, finished_at=timezone.now())
        running = 0
        if case.current_version_id is not None:
            running = PlanNode.objects.filter(
                version_id=case.current_version_id, kind=LEAF, status=NodeStatus.RUNNING
            ).count()
            cancel_open_leaves(
                case.current_version_id, case_id=case.pk, why="the case was cancelled", actor=user
            )
            void_open_gates(
                PlanVersion.objects.get(pk=case.current_version_id),
                why="the case was cancelled",
                actor=user,
            )
        # After the events of the steps, items and gates it closed.
        audit.add(
            NewEvent(
                "planning.case.cancelled",
                user,
                {
                    "case": case.pk,
                    "reason_code": code.code if code else "",
                    # The case page says why in words: planning cannot read the reason codes.
                    "reason_label": code.label if code else "",
                    "reason": reason.strip(),
                    "running_leaves": running,
                    "before": {"status": before},
                    "after": {"status": case.status},
                },
            )
        )
    return case


def fail_and_block(node: PlanNode, *, why: str, actor: User | None) -> list[str]:
    """Fail a leaf and block every leaf downstream of it that still waits; return the keys
    downstream of it. Its event names them; each leaf blocked has an event of its own."""
    depends = dict(
        PlanNode.objects.filter(version_id=node.version_id, kind=LEAF).values_list(
            "key", "depends_on"
        )
    )
    blocked: set[str] = set()
    frontier = {node.key}
    while frontier:
        frontier = {k for k, deps in depends.items() if set(deps) & frontier} - blocked
        blocked |= frontier
    with audited(chain=case_chain(node.version.case_id)) as audit:
        move_node(node, to=NodeStatus.FAILED, audit=audit)
        audit.add(
            NewEvent(
                "execution.leaf.failed",
                actor,
                {"node": node.key, "why": why, "blocked": sorted(blocked)},
            )
        )
        block_nodes(
            PlanNode.objects.filter(version_id=node.version_id, key__in=blocked),
            audit=audit,
            why=f"it needs {node.key}, which failed",
            actor=actor,
        )
    return sorted(blocked)
