"""The LLM goal judge of a `verifying` case: asked outside any transaction, then the case ends.

`finish_if_done` makes a case `verifying` when its leaves all ended, the rules hold and a judge is
configured, and sends `oversight.judge_goal` on commit. The task (`judge_case_goal`) takes the
case for one delivery under a lease (`take_goal_judge`: a short transaction), asks the model with
no transaction open and no row locked, then ends the case under its row lock, re-checking that it
is still `verifying` (`end_judged_case`). A second delivery finds the lease held or the case ended
and does nothing; an answer that comes after a cancel is recorded and dropped, audited. The
reconciler sends the task again for a case whose message was lost or whose delivery died
(`resend_goal_judges`); after `CASEHUB_LEAF_MAX_DELIVERIES` lost deliveries the case fails.
While the global stop switch is on, no delivery asks the judge and none is sent again.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.chain import append_event, case_chain
from audit.models import AuditEvent
from execution import dispatch
from execution.cases import end_case
from execution.common import (
    LEAF,
    REDISPATCH_BATCH,
    is_stopped,
    max_deliveries,
    redispatch_after_s,
)
from execution.goal_judge import (
    JudgeAnswer,
    ask_judge,
    judge_lease_s,
    judge_model,
    judge_time_limit_s,
    record_answer,
)
from planning.models import Case, CaseStatus, PlanNode

logger = logging.getLogger(__name__)

STARTED = "execution.goal.judge_started"


@transaction.atomic
def take_goal_judge(case_id: int, *, now: datetime | None = None) -> Case | None:
    """Take a verifying case for one delivery of the judge, under a lease.

    Returns None, changing nothing, when there is nothing to judge: the case is not `verifying`
    (it ended, or was cancelled) or another delivery holds its lease.
    """
    now = now or timezone.now()
    case = Case.objects.select_for_update().filter(pk=case_id).first()
    if case is None or case.status != CaseStatus.VERIFYING:
        return None
    if is_stopped():
        # The global stop holds the judge back like any step: nothing goes to a model. The
        # reconciler sends it again once execution resumes.
        return None
    if case.judge_lease_until is not None and case.judge_lease_until > now:
        return None
    case.judge_lease_until = now + timedelta(seconds=judge_lease_s())
    case.save(update_fields=["judge_lease_until", "updated_at"])
    append_event(
        STARTED,
        chain=case_chain(case.pk),
        data={
            "case": case.pk,
            "model": _judge_of(case),
            "lease_until": case.judge_lease_until.isoformat(),
        },
    )
    return case


def judge_case_goal(case_id: int) -> str:
    """Ask the LLM goal judge about a verifying case and end the case (a task's body).

    Idempotent: a delivery that finds nothing to judge does nothing. The model is called with no
    transaction open: the case row and its audit chain are not locked meanwhile.
    """
    case = take_goal_judge(case_id)
    if case is None:
        return "nothing to judge"
    nodes = list(PlanNode.objects.filter(version_id=case.current_version_id, kind=LEAF))
    answer = ask_judge(case, nodes, model=_judge_of(case))
    return end_judged_case(case_id, answer)


@transaction.atomic
def end_judged_case(case_id: int, answer: JudgeAnswer) -> str:
    """End a verifying case by the judge's answer, its calls and verdict audited (L9).

    A case no longer `verifying` (cancelled meanwhile, or ended by another delivery) keeps its
    status: the answer is recorded and dropped, audited. Returns the case's status.
    """
    case = Case.objects.select_for_update().get(pk=case_id)
    record_answer(case, answer)
    judgement = answer.judgement
    if case.status != CaseStatus.VERIFYING:
        append_event(
            "execution.goal.verdict_dropped",
            chain=case_chain(case.pk),
            data={
                "case": case.pk,
                "model": answer.model,
                "reached": judgement.reached,
                "why": f"the case is {case.status}",
            },
        )
        return case.status
    verification = case.verification if isinstance(case.verification, dict) else {}
    end_case(
        case,
        CaseStatus.COMPLETED if judgement.reached else CaseStatus.FAILED,
        reasons=list(judgement.problems),
        checks=[*map(str, verification.get("checks", [])), *judgement.checks],
    )
    return case.status


def resend_goal_judges(now: datetime | None = None) -> tuple[list[int], list[int]]:
    """Send the judge again for verifying cases whose message was lost or whose delivery died.

    A case is stuck when no delivery took it within the redispatch delay of its last send, or the
    lease of the delivery that took it expired. One whose judge was taken `max_deliveries` times
    without an answer fails instead (the judge could not decide). SKIP LOCKED: two reconcilers
    never act on one case twice. Returns the ids sent again and the ids failed.
    """
    now = now or timezone.now()
    if is_stopped():
        return [], []
    unclaimed_since = now - timedelta(seconds=redispatch_after_s())
    resent: list[int] = []
    failed: list[int] = []
    with transaction.atomic():
        stuck = list(
            Case.objects.select_for_update(skip_locked=True)
            .filter(status=CaseStatus.VERIFYING)
            .filter(
                Q(judge_lease_until__lt=now)
                | Q(judge_lease_until__isnull=True, updated_at__lt=unclaimed_since)
            )
            .order_by("pk")[:REDISPATCH_BATCH]
        )
        for case in stuck:
            chain = case_chain(case.pk)
            taken = AuditEvent.objects.filter(chain=chain, action=STARTED).count()
            lost = case.judge_lease_until is not None
            if lost and taken >= max_deliveries():
                verification = case.verification if isinstance(case.verification, dict) else {}
                end_case(
                    case,
                    CaseStatus.FAILED,
                    reasons=[
                        f"the goal judge ({_judge_of(case)}) could not decide: no answer after "
                        f"{taken} deliveries (their workers were lost or ran out of time)"
                    ],
                    checks=[str(c) for c in verification.get("checks", [])],
                )
                failed.append(case.pk)
                continue
            case.judge_lease_until = None
            # Touch updated_at: a message nobody takes is sent again one delay later, not at once.
            case.save(update_fields=["judge_lease_until", "updated_at"])
            append_event(
                "execution.goal.judge_resent",
                chain=chain,
                data={
                    "case": case.pk,
                    "deliveries": taken,
                    "why": "its delivery's lease expired" if lost else "no delivery took it",
                },
            )
            dispatch.enqueue_goal_judge(case.pk, time_limit_s=judge_time_limit_s())
            resent.append(case.pk)
    return resent, failed


def _judge_of(case: Case) -> str:
    verification = case.verification if isinstance(case.verification, dict) else {}
    return str(verification.get("judge") or judge_model())
