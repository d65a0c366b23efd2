"""The policy what-if: an admin asks what a pending policy version would have done to the plans
of a period; a background task replays them and writes the report.

Asking writes the report row (queued) and its audit event in one transaction and sends the task
once it commits. Replaying reads plan versions and their leaves in batches, classifies each leaf
with the classification the gates are opened with (`gate_policy.facts_of` and
`oversight.policy.classify`, through `oversight.whatif`), and writes nothing but the report: its
progress after every batch, its totals and case rows at the end. No gate is opened, no node
moves, no audit event is written by the replay.

Both policies classify the same facts — today's tool registry and agent trust — so a difference
in the report is the policy's alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.chain import SYSTEM_CHAIN, append_event
from oversight.actions.gate_policy import active_policy, facts_of, registry
from oversight.actions.policies import PolicyConflict, PolicyInvalid, Someone, require_admin
from oversight.dispatch import enqueue_whatif
from oversight.models import PolicyVersion, PolicyWhatIf
from oversight.policy import PolicySettings
from oversight.whatif import WhatIfTally, compare_plan, empty_summary
from planning.models import PlanNode, PlanVersion

logger = logging.getLogger(__name__)

DEFAULT_DAYS = 30
# The longest period one what-if may replay.
MAX_DAYS = 366
# Plan versions read and classified per batch; the progress is written after each.
BATCH = 500
NODE_FIELDS = ("id", "version_id", "key", "agent", "tool", "risk", "inputs", "provenance")

__all__ = [
    "BATCH",
    "DEFAULT_DAYS",
    "MAX_DAYS",
    "default_period",
    "request_whatif",
    "run_whatif",
]


def default_period(now: datetime | None = None) -> tuple[datetime, datetime]:
    """Return the default period: the last 30 days up to now."""
    end = now or timezone.now()
    return end - timedelta(days=DEFAULT_DAYS), end


def _settings(values: Any) -> PolicySettings:
    try:
        return PolicySettings.from_data(values)
    except ValueError:
        # As the gates read an unreadable version (gate_policy.policy_settings).
        return PolicySettings()


def request_whatif(
    admin: Someone,
    version: PolicyVersion,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
) -> PolicyWhatIf:
    """Ask for a what-if of a pending policy version over [start, end) (default: the last 30
    days) against the active policy; return the queued report. The task starts on commit.

    Raises PolicyDenied (audited) for a non-admin; PolicyConflict when the version is not
    pending; PolicyInvalid (field "period") for a period that ends before it starts, lies in the
    future or is longer than 366 days.
    """
    user = require_admin(
        admin, "oversight.policy.denied", step="what-if", policy_version=version.number
    )
    default_start, default_end = default_period()
    start, end = start or default_start, end or default_end
    if end <= start:
        raise PolicyInvalid("period", "the period must end after it starts")
    if start > timezone.now():
        raise PolicyInvalid("period", "the period must start in the past")
    if end - start > timedelta(days=MAX_DAYS):
        raise PolicyInvalid("period", f"the period may be {MAX_DAYS} days at most")
    return _request(user, version.pk, start, end)


@transaction.atomic
def _request(admin: Any, version_pk: int, start: datetime, end: datetime) -> PolicyWhatIf:
    version = PolicyVersion.objects.get(pk=version_pk)
    if version.status != PolicyVersion.Status.PENDING:
        raise PolicyConflict(
            f"policy version {version.number} is {version.status}: a what-if replays a pending "
            "proposal"
        )
    base, base_settings = active_policy()
    report = PolicyWhatIf.objects.create(
        policy_version=version,
        base_version=base if base.pk else None,
        base_values=base_settings.as_data(),
        period_start=start,
        period_end=end,
        summary=empty_summary(),
        created_by=admin,
    )
    append_event(
        "oversight.policy.whatif_requested",
        actor=admin,
        chain=SYSTEM_CHAIN,
        data={
            "whatif": report.pk,
            "policy_version": version.number,
            "base_version": base.number if base.pk else None,
            "period_start": start.isoformat(),
            "period_end": end.isoformat(),
        },
    )
    enqueue_whatif(report.pk)
    return report


def run_whatif(
    whatif_id: int,
    *,
    batch: int = BATCH,
    on_batch: Callable[[int, int], None] | None = None,
) -> PolicyWhatIf:
    """Replay the period's plan versions for a queued what-if and write its report; return it.

    Idempotent: a finished report is returned as it is; a running one (its worker died) starts
    over. `on_batch(done, total)` is called after each batch (the bench times them). A failure
    marks the report failed with the error's name and is raised again.
    """
    report = PolicyWhatIf.objects.select_related("policy_version").get(pk=whatif_id)
    if report.is_finished:
        return report
    versions = PlanVersion.objects.filter(
        created_at__gte=report.period_start, created_at__lt=report.period_end
    )
    total = versions.count()
    now = timezone.now()
    PolicyWhatIf.objects.filter(pk=report.pk).update(
        status=PolicyWhatIf.Status.RUNNING, started_at=now, done=0, total=total
    )
    try:
        tally = _replay(report, versions, total, batch, on_batch)
    except Exception as exc:
        logger.exception("what-if %s failed", report.pk)
        PolicyWhatIf.objects.filter(pk=report.pk).update(
            status=PolicyWhatIf.Status.FAILED,
            error=f"{type(exc).__name__}: the replay stopped; run the what-if again",
            finished_at=timezone.now(),
        )
        raise
    PolicyWhatIf.objects.filter(pk=report.pk).update(
        status=PolicyWhatIf.Status.DONE,
        done=tally.versions,
        total=max(total, tally.versions),
        summary=tally.summary(),
        cases=tally.case_rows(),
        finished_at=timezone.now(),
    )
    report.refresh_from_db()
    return report


def _replay(
    report: PolicyWhatIf,
    versions: Any,
    total: int,
    batch: int,
    on_batch: Callable[[int, int], None] | None,
) -> WhatIfTally:
    active = _settings(report.base_values)
    draft = _settings(report.policy_version.values)
    tools, trust = registry()
    tally = WhatIfTally()
    last_pk = 0
    while True:
        # Keyset pagination on the primary key: each batch is one indexed range read.
        rows = list(
            versions.filter(pk__gt=last_pk).order_by("pk").values_list("pk", "case_id")[:batch]
        )
        if not rows:
            break
        last_pk = rows[-1][0]
        leaves: dict[int, list[PlanNode]] = {pk: [] for pk, _ in rows}
        nodes = (
            PlanNode.objects.filter(version_id__in=leaves, kind=PlanNode.Kind.LEAF)
            .order_by("version_id", "position")
            .only(*NODE_FIELDS)
        )
        for node in nodes.iterator(chunk_size=2000):
            leaves[node.version_id].append(node)
        for pk, case_id in rows:
            facts = [facts_of(node, tools, trust) for node in leaves[pk]]
            tally.add(case_id, compare_plan(facts, active, draft))
        PolicyWhatIf.objects.filter(pk=report.pk).update(done=tally.versions)
        if on_batch is not None:
            on_batch(tally.versions, total)
    return tally
