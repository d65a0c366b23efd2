"""Notifications: an in-app notice per user and an e-mail, when a gate or a work item opens, is due
or escalates, and when a submitter's case could not be planned, is decided or ends.

The notices are rows written in the caller's transaction; the e-mails go once it commits (a mail
server that is down loses no notice and undoes nothing: the error is logged).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from functools import partial

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mass_mail
from django.db import transaction
from django.urls import reverse

from oversight.models import Gate, Notification
from planning.models import Case, PlanVersion

logger = logging.getLogger(__name__)


def _gate_url(gate: Gate) -> str:
    return reverse("oversight:gate-detail", args=[gate.pk])


def _case_url(case: Case) -> str:
    return reverse("planning:case-detail", args=[case.pk])


def members(
    groups: Iterable[int], *, except_user: int | None, case: Case | None = None
) -> list[User]:
    users = User.objects.filter(groups__in=list(groups), is_active=True).distinct()
    if except_user is not None:
        users = users.exclude(pk=except_user)
    if case is not None:
        # Who edited a version of the case cannot approve its gates: no "waits for you" for them.
        users = users.exclude(
            pk__in=PlanVersion.objects.filter(case=case, edited_by__isnull=False).values(
                "edited_by"
            )
        )
    return list(users.order_by("pk"))


def _send_mail(messages: list[tuple[str, str, str, list[str]]]) -> None:
    try:
        send_mass_mail(messages)
    except Exception:
        logger.exception("sending %s notification e-mail(s) failed", len(messages))


def notify_users(
    users: Sequence[User],
    *,
    kind: str,
    message: str,
    url: str,
    case: Case | None,
    gate: Gate | None,
    subject: str,
    gates: Sequence[Gate] = (),
) -> None:
    """Write one notice per user (about `gates`, linking `gate`) and send its e-mails on commit."""
    if not users:
        return
    gate_ids = [g.pk for g in gates] or ([gate.pk] if gate is not None else [])
    Notification.objects.bulk_create(
        [
            Notification(
                user=u, case=case, gate=gate, gate_ids=gate_ids, kind=kind, message=message, url=url
            )
            for u in users
        ]
    )
    link = f"{settings.CASEHUB_BASE_URL.rstrip('/')}{url}"
    mails = [
        (subject, f"{message}\n\n{link}\n", settings.DEFAULT_FROM_EMAIL, [u.email])
        for u in users
        if u.email
    ]
    if mails:
        transaction.on_commit(partial(_send_mail, mails), robust=True)


def gates_opened(case: Case, gates: Sequence[Gate]) -> None:
    """Tell each gate's approver group (never the case's submitter) that it waits for them."""
    by_group: dict[int, list[Gate]] = {}
    for gate in gates:
        by_group.setdefault(gate.approver_group_id, []).append(gate)
    for group_id, group_gates in by_group.items():
        users = members([group_id], except_user=case.submitter_id, case=case)
        first = group_gates[0]
        count = len(group_gates)
        what = f"{count} gates wait" if count > 1 else f"a {first.kind} gate waits"
        notify_users(
            users,
            kind="gate.opened",
            message=f"Case #{case.pk} “{case.title}”: {what} for your decision.",
            url=_gate_url(first),
            case=case,
            gate=first,
            gates=group_gates,
            subject=f"[CaseHub] Case #{case.pk}: {what} for your decision",
        )


def gate_reminder(gate: Gate) -> None:
    """Remind the approver group that a gate is half-way to its deadline."""
    users = members([gate.approver_group_id], except_user=gate.case.submitter_id, case=gate.case)
    notify_users(
        users,
        kind="gate.reminder",
        message=(
            f"Reminder: the {gate.kind} gate of case #{gate.case_id} is due "
            f"{gate.deadline:%Y-%m-%d %H:%M} UTC."
        ),
        url=_gate_url(gate),
        case=gate.case,
        gate=gate,
        subject=f"[CaseHub] Reminder: case #{gate.case_id} gate due",
    )


def gate_escalated(gate: Gate) -> None:
    """Tell the escalation group that a gate passed its deadline and is theirs to decide too."""
    group = gate.escalation_group_id or gate.approver_group_id
    users = members([group], except_user=gate.case.submitter_id, case=gate.case)
    notify_users(
        users,
        kind="gate.escalated",
        message=(
            f"Escalated: the {gate.kind} gate of case #{gate.case_id} passed its deadline "
            "undecided. It waits for a decision; nothing runs until then."
        ),
        url=_gate_url(gate),
        case=gate.case,
        gate=gate,
        subject=f"[CaseHub] Escalated: case #{gate.case_id} gate overdue",
    )


def case_decided(case: Case, *, approved: bool, by: User) -> None:
    """Tell the submitter that their case's plan was approved or rejected."""
    submitter = User.objects.filter(pk=case.submitter_id, is_active=True).first()
    if submitter is None:
        return
    outcome = "approved" if approved else "rejected"
    notify_users(
        [submitter],
        kind=f"case.{outcome}",
        message=f"Your case #{case.pk} “{case.title}” was {outcome} by {by.get_username()}.",
        url=_case_url(case),
        case=case,
        gate=None,
        subject=f"[CaseHub] Case #{case.pk} {outcome}",
    )


def case_finished(case: Case) -> None:
    """Tell the submitter that their case completed or failed."""
    submitter = User.objects.filter(pk=case.submitter_id, is_active=True).first()
    if submitter is None:
        return
    notify_users(
        [submitter],
        kind=f"case.{case.status}",
        message=f"Your case #{case.pk} “{case.title}” {case.status}.",
        url=_case_url(case),
        case=case,
        gate=None,
        subject=f"[CaseHub] Case #{case.pk} {case.status}",
    )


def case_plan_failed(case: Case) -> None:
    """Tell the submitter that their case could not be planned (a `CASEHUB_PLAN_FAILED_HOOKS`
    entry, called in the failing transaction)."""
    submitter = User.objects.filter(pk=case.submitter_id, is_active=True).first()
    if submitter is None:
        return
    notify_users(
        [submitter],
        kind="case.plan_failed",
        message=(
            f"Your case #{case.pk} “{case.title}” could not be planned. "
            "Its page says why, and offers to edit and resubmit it."
        ),
        url=_case_url(case),
        case=case,
        gate=None,
        subject=f"[CaseHub] Case #{case.pk} could not be planned",
    )


__all__ = [
    "case_decided",
    "case_finished",
    "case_plan_failed",
    "gate_escalated",
    "gate_reminder",
    "gates_opened",
]
