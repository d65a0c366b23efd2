"""What every part of execution shares: settings, errors, results, the stop switch."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from audit.chain import append_event
from execution import dispatch
from execution.models import ExecutionControl
from planning.models import Agent, CaseStatus, NodeStatus, PlanNode, PlanVersion

logger = logging.getLogger(__name__)

LEAF = PlanNode.Kind.LEAF
# Leaves that have not ended: the case is not over while one of them remains.
OPEN_LEAF_STATUSES = (
    NodeStatus.PENDING,
    NodeStatus.AWAITING_APPROVAL,
    NodeStatus.READY,
    NodeStatus.RUNNING,
    NodeStatus.RETRYING,
)
ENDED_LEAF_STATUSES = (
    NodeStatus.SUCCEEDED,
    NodeStatus.FAILED,
    NodeStatus.SKIPPED,
    NodeStatus.CANCELLED,
    NodeStatus.BLOCKED,
)
RUNNING_CASE_STATUSES = (CaseStatus.APPROVED, CaseStatus.EXECUTING)
# At most this many ready leaves are sent again by one reconciler pass.
REDISPATCH_BATCH = 100


class ErrorClass:
    """How a failure is classified (shown on the page, decides whether a retry may help)."""

    TRANSIENT = "transient"
    INVALID_INPUT = "invalid_input"
    TOOL_FAILURE = "tool_failure"
    POLICY_DENIAL = "policy_denial"
    TIMEOUT = "timeout"
    POISON = "poison"
    OUTPUT_INVALID = "output_invalid"
    # The installation cannot run the step as configured (an llm agent without a provider): not
    # the agent's failure, and not retried (it fails the same until an operator changes it).
    CONFIGURATION = "configuration"

    ALL = (
        TRANSIENT,
        INVALID_INPUT,
        TOOL_FAILURE,
        POLICY_DENIAL,
        TIMEOUT,
        POISON,
        OUTPUT_INVALID,
        CONFIGURATION,
    )


# Settings (env-driven in casehub/settings.py) ----------------------------------------------------


def leaf_setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


def lease_s() -> float:
    return leaf_setting("CASEHUB_LEAF_LEASE_S", 30)


def soft_limit_s() -> float:
    return leaf_setting("CASEHUB_LEAF_SOFT_LIMIT_S", 120)


def hard_limit_s() -> float:
    return leaf_setting("CASEHUB_LEAF_HARD_LIMIT_S", 180)


def max_attempts() -> int:
    return int(leaf_setting("CASEHUB_LEAF_MAX_ATTEMPTS", 3))


def max_deliveries() -> int:
    return int(leaf_setting("CASEHUB_LEAF_MAX_DELIVERIES", 3))


def redispatch_after_s() -> float:
    return leaf_setting("CASEHUB_LEAF_REDISPATCH_AFTER_S", 30)


def retry_delay_s(attempt: int, *, rng: random.Random | None = None) -> float:
    """Return the wait before retry number `attempt` (1-based): full jitter, capped."""
    base = leaf_setting("CASEHUB_LEAF_RETRY_BASE_S", 2)
    cap = leaf_setting("CASEHUB_LEAF_RETRY_MAX_S", 60)
    return (rng or random).uniform(0, min(cap, base * 2 ** (attempt - 1)))


# Errors and results --------------------------------------------------------------------------


class ClaimRefused(Exception):
    """The leaf cannot be claimed now (not ready, held by a live lease, stopped, not approved)."""


class StaleResult(Exception):
    """A worker's result names an attempt that no longer holds the leaf (fencing)."""

    def __init__(self, message: str, *, node: PlanNode, attempt: int) -> None:
        super().__init__(message)
        self.node = node
        self.attempt = attempt


class LeafStopped(Exception):
    """The leaf must stop at this safe point: the case was cancelled or execution was stopped."""

    def __init__(self, why: str, *, cancelled: bool) -> None:
        super().__init__(why)
        self.cancelled = cancelled


class LeafError(Exception):
    """A leaf's attempt failed; `error_class` says how (transient errors may be retried)."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


class LeafTimeLimit(Exception):
    """The leaf ran past its soft time limit."""


class WaitingForPerson(Exception):
    """A human leaf handed to its group: it ends when the work item is completed."""


class CaseNotRunning(Exception):
    """The case cannot take this command in its current status (409)."""


class WorkItemConflict(Exception):
    """The work item is not open any more, or not this user's to complete (409)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """A worker's hold on one leaf: run it, then report with this attempt number."""

    node_id: int
    case_id: int
    key: str
    attempt: int
    agent: str
    kind: str
    idempotency_key: str
    lease_until: datetime
    # The rows the claim read, for the runner (not read again); absent on a claim rebuilt
    # elsewhere. Their execution fields are those from before the claim.
    node: PlanNode | None = field(default=None, compare=False, repr=False)
    agent_row: Agent | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ended:
    """What ending a leaf released: leaves that became ready (the first may run on this worker)."""

    node_id: int
    status: str
    ready: tuple[int, ...] = field(default_factory=tuple)
    # The leaf this worker claimed in the same transaction, to run next (`keep`).
    claimed: Claim | None = None
    # The one it claimed to run after that (`keep` 2: claimed ahead while `claimed` runs).
    ahead: Claim | None = None


def idempotency_key(node: PlanNode) -> str:
    """Return the key every side effect of this leaf carries, the same for every attempt.

    The key names the case and the leaf (its key), not the version: an edit that leaves a step
    unchanged must not make its effect happen again.
    """
    return f"casehub:case-{node.version.case_id}:leaf-{node.key}"


# The global stop switch ------------------------------------------------------------------------


def is_stopped() -> bool:
    """Tell whether the admins' global stop switch is on."""
    return ExecutionControl.objects.filter(pk=1, stopped=True).exists()


@transaction.atomic
def set_stopped(*, stopped: bool, user: User, reason: str = "") -> ExecutionControl:
    """Turn the global stop switch on or off (admins); on resume, re-send every ready leaf."""
    control, _ = ExecutionControl.objects.select_for_update().get_or_create(pk=1)
    before = control.stopped
    control.stopped = stopped
    control.changed_by = user
    control.changed_at = timezone.now()
    control.reason = reason.strip()
    control.save()
    append_event(
        "execution.control.stopped" if stopped else "execution.control.resumed",
        actor=user,
        data={
            "reason": control.reason,
            "before": {"stopped": before},
            "after": {"stopped": stopped},
        },
    )
    if not stopped:
        for node_id in PlanNode.objects.filter(status=NodeStatus.READY).values_list(
            "pk", flat=True
        ):
            send_leaf(node_id)
    return control


# Starting and releasing -------------------------------------------------------------------------


def send_leaf(node_id: int, *, countdown: float | None = None) -> None:
    PlanNode.objects.filter(pk=node_id).update(enqueued_at=timezone.now())
    dispatch.enqueue_leaf(node_id, countdown=countdown)


def _leaves(version: PlanVersion) -> list[PlanNode]:
    return list(PlanNode.objects.filter(version=version, kind=LEAF).order_by("position"))
