"""Execution: approved leaves become ready, are claimed by workers, end, and release their
dependents; the reconciler recovers what a lost message or a dead worker left behind.

The database is the truth about what must run (DESIGN §5). A claim is a compare-and-set
`ready → running` that bumps the leaf's attempt number: the number is the worker's fencing
token, and a result sent with an older number is refused. Every claim re-checks, in its own
transaction, that the case still runs, the global stop switch is off, and the approvals the leaf
needs still hold for exactly this version and content hash (R3, R4, O4, O5). Side effects carry an
idempotency key that does not depend on the attempt, so a leaf run twice acts once.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.db.models import Count, Exists, F, OuterRef, Q
from django.utils import timezone

from oversight import dispatch, notify, trust
from oversight.audit import append_event, case_chain
from oversight.models import (
    OPEN_GATE_STATUSES,
    ExecutionControl,
    Gate,
    GateKind,
    GateStatus,
    LeafAttempt,
    TrustScore,
    WorkItem,
)
from planning.models import Agent, Case, CaseStatus, NodeStatus, PlanNode, PlanVersion

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

    ALL = (
        TRANSIENT,
        INVALID_INPUT,
        TOOL_FAILURE,
        POLICY_DENIAL,
        TIMEOUT,
        POISON,
        OUTPUT_INVALID,
    )


# Settings (env-driven in casehub/settings.py) ----------------------------------------------------


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


def lease_s() -> float:
    return _setting("CASEHUB_LEAF_LEASE_S", 30)


def soft_limit_s() -> float:
    return _setting("CASEHUB_LEAF_SOFT_LIMIT_S", 120)


def hard_limit_s() -> float:
    return _setting("CASEHUB_LEAF_HARD_LIMIT_S", 180)


def max_attempts() -> int:
    return int(_setting("CASEHUB_LEAF_MAX_ATTEMPTS", 3))


def max_deliveries() -> int:
    return int(_setting("CASEHUB_LEAF_MAX_DELIVERIES", 3))


def redispatch_after_s() -> float:
    return _setting("CASEHUB_LEAF_REDISPATCH_AFTER_S", 30)


def retry_delay_s(attempt: int, *, rng: random.Random | None = None) -> float:
    """Return the wait before retry number `attempt` (1-based): full jitter, capped."""
    base = _setting("CASEHUB_LEAF_RETRY_BASE_S", 2)
    cap = _setting("CASEHUB_LEAF_RETRY_MAX_S", 60)
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
            _send(node_id)
    return control


# Starting and releasing -------------------------------------------------------------------------


def _send(node_id: int, *, countdown: float | None = None) -> None:
    PlanNode.objects.filter(pk=node_id).update(enqueued_at=timezone.now())
    dispatch.enqueue_leaf(node_id, countdown=countdown)


def _leaves(version: PlanVersion) -> list[PlanNode]:
    return list(PlanNode.objects.filter(version=version, kind=LEAF).order_by("position"))


def start_execution(case: Case, *, actor: User | None) -> list[int]:
    """Start an approved case: it is `executing` and its ready leaves go to the workers.

    Call inside the transaction that approved the plan gate (the case row locked).
    """
    before = case.status
    case.status = CaseStatus.EXECUTING
    case.save(update_fields=["status", "updated_at"])
    append_event(
        "planning.case.executing",
        actor=actor,
        chain=case_chain(case.pk),
        data={"case": case.pk, "before": {"status": before}, "after": {"status": case.status}},
    )
    assert case.current_version_id is not None
    released = release_ready(PlanVersion.objects.get(pk=case.current_version_id))
    if not released:
        # A re-planned version whose steps all ended already (carried over): nothing to run.
        finish_if_done(case)
    return released


def release_ready(
    version: PlanVersion,
    *,
    candidates: Iterable[int] | None = None,
    case: Case | None = None,
    announce: bool = True,
    stopped: bool | None = None,
) -> list[int]:
    """Make `pending` leaves whose dependencies all succeeded `ready`, and send them on commit.

    `candidates` limits the check to those leaf ids (the dependents of a leaf that just ended).
    The candidates are locked in id order, so that of several parents ending at once exactly one
    releases their common child (E11). `case` is the version's case when the caller holds it
    (locked) already. The leaves made ready are audited in one event, or, `announce=False`, by
    the caller. `stopped` is the stop switch when the caller read it already. Returns their ids.
    """
    case = case if case is not None else version.case
    ready = _release(version, candidates=candidates, case=case)
    if ready and announce:
        append_event(
            "execution.leaves.ready",
            chain=case_chain(case.pk),
            data={
                "nodes": [n.key for n in ready],
                "before": {"status": "pending"},
                "after": {"status": "ready"},
            },
        )
    if not (is_stopped() if stopped is None else stopped):
        for node in ready:
            dispatch.enqueue_leaf(node.pk)
    return [n.pk for n in ready]


def _release(
    version: PlanVersion, *, candidates: Iterable[int] | None, case: Case
) -> list[PlanNode]:
    """Make the candidates whose dependencies all succeeded `ready` (locked, in id order)."""
    if case.status not in RUNNING_CASE_STATUSES or case.current_version_id != version.pk:
        return []
    query = PlanNode.objects.filter(version=version, kind=LEAF, status=NodeStatus.PENDING)
    if candidates is not None:
        query = query.filter(pk__in=list(candidates))
    pending = list(query.select_for_update().order_by("pk"))
    if not pending:
        return []
    # Only the statuses of the leaves the candidates wait for (the unique (version, key) index),
    # not the whole plan's: a completion costs the same in a plan of 10 leaves or of 1,000.
    waited_for = {dep for node in pending for dep in node.depends_on}
    statuses = dict(
        PlanNode.objects.filter(version=version, kind=LEAF, key__in=waited_for).values_list(
            "key", "status"
        )
    )
    ready = [
        node
        for node in pending
        if all(statuses.get(dep) == NodeStatus.SUCCEEDED for dep in node.depends_on)
    ]
    if not ready:
        return []
    now = timezone.now()
    # The candidates are locked above: one statement moves them all.
    PlanNode.objects.filter(pk__in=[n.pk for n in ready], status=NodeStatus.PENDING).update(
        status=NodeStatus.READY, enqueued_at=now
    )
    for node in ready:
        node.version = version
        node.status, node.enqueued_at = NodeStatus.READY, now
    return ready


def on_step_approved(gate: Gate, *, actor: User) -> None:
    """A step or escalation gate was approved: the leaf may run once its dependencies are done.

    An escalation approved after a failure runs the leaf again (a new attempt, the same key).
    """
    node = gate.node
    assert node is not None
    PlanNode.objects.filter(pk=node.pk, status=NodeStatus.AWAITING_APPROVAL).update(
        status=NodeStatus.PENDING, error="", error_class=""
    )
    release_ready(gate.version, candidates=[node.pk])


def on_escalation_rejected(gate: Gate, *, actor: User, why: str) -> None:
    """An escalation of a failed leaf was rejected: the leaf fails and its dependents block."""
    node = gate.node
    assert node is not None
    _fail_and_block(node, why=why, actor=actor)
    finish_if_done(Case.objects.select_for_update().get(pk=gate.case_id))


# Claiming ---------------------------------------------------------------------------------


def _approval_problem(node: PlanNode, case: Case, now: datetime) -> str | None:
    """Return why the leaf's approvals do not allow it to run now, or None when they do."""
    if case.current_version_id != node.version_id:
        return f"plan version {node.version.number} is no longer the case's current version"
    gates = list(
        Gate.objects.filter(version=node.version).filter(
            Q(kind=GateKind.PLAN) | Q(kind=GateKind.STEP, node=node)
        )
    )
    plan = [g for g in gates if g.kind == GateKind.PLAN]
    if not plan or plan[0].status != GateStatus.APPROVED:
        return "the plan gate is not approved"
    if plan[0].content_hash != node.version.content_hash:
        return "the plan changed after its approval"
    # The step's live gate: an approval that expired was replaced by a newer gate.
    steps = sorted((g for g in gates if g.kind == GateKind.STEP), key=lambda g: g.pk)
    for gate in steps[-1:]:
        if gate.status != GateStatus.APPROVED:
            return f"the step gate is {gate.status}"
        if gate.content_hash != node.content_hash:
            return "the step changed after its approval (content hash differs)"
        if gate.approval_expires_at is not None and gate.approval_expires_at <= now:
            return f"the step's approval expired at {gate.approval_expires_at.isoformat()}"
    return None


def _agent_and_scores(slug: str) -> tuple[Agent | None, list[TrustScore]]:
    """Return the agent with its trust scores, in one query when it has scores."""
    scores = list(TrustScore.objects.filter(agent__slug=slug).select_related("agent"))
    if scores:
        return scores[0].agent, scores
    return Agent.objects.filter(slug=slug).first(), []


def _routing(node: PlanNode, planned: Agent | None, scores: list[TrustScore]) -> trust.Routing:
    """Check who should run the leaf: the planned agent while it is trusted enough.

    The planned agent's own trust is read first; the other candidates (and their load) only
    when it is not trusted enough or not available.
    """
    from oversight.actions.gates import active_policy

    _, policy = active_policy()
    threshold = policy.trust_threshold
    capabilities = list(planned.capabilities) if planned is not None else []
    if planned is not None and planned.enabled:
        mine = effective_trust(planned, capabilities, scores)
        if mine >= threshold:
            return trust.route(
                node.agent, [trust.Candidate(agent=planned.slug, trust=mine)], threshold=threshold
            )
    able = Agent.objects.filter(enabled=True).prefetch_related("scores")
    if planned is not None:
        able = able.filter(kind=planned.kind)
    running = dict(
        PlanNode.objects.filter(status=NodeStatus.RUNNING)
        .values("agent")
        .annotate(n=Count("pk"))
        .values_list("agent", "n")
    )
    candidates = []
    for agent in able:
        if capabilities and not set(capabilities) & set(agent.capabilities):
            continue
        if node.tool and node.tool not in agent.tools:
            continue
        candidates.append(
            trust.Candidate(
                agent=agent.slug,
                trust=effective_trust(agent, capabilities, list(agent.scores.all())),
                load=running.get(agent.slug, 0),
            )
        )
    return trust.route(node.agent, candidates, threshold=threshold)


def claim_leaf(node_id: int, *, worker: str = "") -> Claim:
    """Claim a ready leaf for `worker`: `ready → running`, attempt + 1, a lease.

    Raises ClaimRefused when the leaf is not ready (already claimed: a duplicate message), when
    the case does not run, when execution is stopped, or when its approvals no longer hold (the
    leaf then waits for a new approval, audited: O4, O5).
    """
    with transaction.atomic():
        claim = _claim(node_id, worker)
    if isinstance(claim, str):
        # The refusal's own changes (the leaf waits for a new approval) are committed above.
        raise ClaimRefused(claim)
    return claim


def _claim(node_id: int, worker: str) -> Claim | str:
    # A leaf another transaction holds is being claimed, released or recovered by it, and that
    # one sends or runs it: this message is not waited for (SKIP LOCKED) but refused.
    node = (
        PlanNode.objects.select_for_update(of=("self",), skip_locked=True)
        .select_related("version", "version__case")
        .annotate(stopped=Exists(ExecutionControl.objects.filter(pk=1, stopped=True)))
        .filter(pk=node_id, kind=LEAF)
        .first()
    )
    if node is None:
        if PlanNode.objects.filter(pk=node_id, kind=LEAF).exists():
            raise ClaimRefused("the leaf is held by another transaction")
        raise ClaimRefused("no such leaf")
    if node.status != NodeStatus.READY:
        raise ClaimRefused(f"the leaf is {node.status}")
    case = node.version.case
    if case.status not in RUNNING_CASE_STATUSES:
        raise ClaimRefused(f"the case is {case.status}")
    if node.stopped:  # type: ignore[attr-defined]
        raise ClaimRefused("execution is stopped")
    taken = _take(node, case, worker)
    if isinstance(taken, str):
        return taken
    if case.status == CaseStatus.APPROVED:
        case.status = CaseStatus.EXECUTING
        case.save(update_fields=["status", "updated_at"])
    append_event(
        "execution.leaf.claimed",
        actor=node.agent or None,
        chain=case_chain(case.pk),
        data=_claim_data(taken, worker),
    )
    return taken


def _claim_data(claim: Claim, worker: str) -> dict[str, Any]:
    return {
        "node": claim.key,
        "attempt": claim.attempt,
        "worker": worker,
        "lease_until": claim.lease_until.isoformat(),
        "before": {"status": "ready"},
        "after": {"status": "running"},
    }


def _take(node: PlanNode, case: Case, worker: str) -> Claim | str:
    """Claim a locked `ready` leaf of a running case: approvals, routing, then `running`.

    Returns the claim, or why the leaf may not run now (its state, waiting for a new approval
    or an escalation, is changed and audited in the caller's transaction). The caller audits
    the claim itself: in an event of its own, or in the completion that handed it over.
    """
    now = timezone.now()
    if (why := _approval_problem(node, case, now)) is not None:
        _refuse_for_approval(node, case, why)
        return why
    planned, scores = _agent_and_scores(node.agent)
    routing = _routing(node, planned, scores)
    objects = routing.escalate or routing.agent != node.agent
    # An approved escalation overrules the routing; it is only looked for when routing objects.
    if objects and not _overruled(node):
        PlanNode.objects.filter(pk=node.pk).update(
            status=NodeStatus.AWAITING_APPROVAL, routing=routing.as_data()
        )
        append_event(
            "execution.leaf.routing_escalated",
            chain=case_chain(case.pk),
            data={"node": node.key, "routing": routing.as_data()},
        )
        from oversight.actions.gates import open_escalation_gate

        open_escalation_gate(
            node.version,
            node,
            reason=f"routing of step {node.key}: {routing.rationale}; approve to run it with "
            f"{node.agent} as planned, or edit the plan",
        )
        return routing.rationale
    attempt = node.attempts + 1
    lease_until = now + timedelta(seconds=lease_s())
    PlanNode.objects.filter(pk=node.pk).update(
        status=NodeStatus.RUNNING,
        attempts=attempt,
        lease_until=lease_until,
        started_at=now,
        finished_at=None,
        routing=routing.as_data(),
    )
    LeafAttempt.objects.create(node=node, number=attempt, worker=worker[:255], started_at=now)
    return Claim(
        node_id=node.pk,
        case_id=case.pk,
        key=node.key,
        attempt=attempt,
        agent=node.agent,
        kind=(planned.kind if planned is not None else "") or "",
        idempotency_key=idempotency_key(node),
        lease_until=lease_until,
        node=node,
        agent_row=planned,
    )


def _overruled(node: PlanNode) -> bool:
    return Gate.objects.filter(
        version=node.version, node=node, kind=GateKind.ESCALATION, status=GateStatus.APPROVED
    ).exists()


def _refuse_for_approval(node: PlanNode, case: Case, why: str) -> None:
    """Put a leaf whose approval no longer holds back to waiting, and ask for a new approval."""
    chain = case_chain(case.pk)
    append_event(
        "execution.leaf.claim_refused",
        chain=chain,
        data={"node": node.key, "why": why, "before": {"status": node.status}},
    )
    if node.version_id != case.current_version_id:
        # A replaced version's leaf never runs; the current version has leaves of its own.
        PlanNode.objects.filter(pk=node.pk).update(status=NodeStatus.CANCELLED)
        return
    PlanNode.objects.filter(pk=node.pk).update(status=NodeStatus.AWAITING_APPROVAL)
    step = (
        Gate.objects.filter(version=node.version, node=node, kind=GateKind.STEP)
        .order_by("-pk")
        .first()
    )
    if step is not None and step.status == GateStatus.APPROVED:
        from oversight.actions.gates import reopen_step_gate

        reopen_step_gate(step, why=why)


def lease_holds(node_id: int, attempt: int) -> bool:
    """Tell whether `attempt` still holds the leaf (for a worker about to act)."""
    return PlanNode.objects.filter(pk=node_id, attempts=attempt, status=NodeStatus.RUNNING).exists()


def renew_lease(node_id: int, attempt: int) -> bool:
    """Extend the lease of a running attempt; False when the attempt lost the leaf."""
    until = timezone.now() + timedelta(seconds=lease_s())
    return bool(
        PlanNode.objects.filter(pk=node_id, attempts=attempt, status=NodeStatus.RUNNING).update(
            lease_until=until
        )
    )


def check_safe_point(claim: Claim) -> None:
    """Raise LeafStopped when the leaf must not go on (cancelled case, global stop, lost lease)."""
    row = (
        PlanNode.objects.filter(pk=claim.node_id)
        .values_list("status", "attempts", "version__case__status")
        .first()
    )
    if row is None:
        raise LeafStopped("the leaf is gone", cancelled=True)
    status, attempts, case_status = row
    if case_status not in RUNNING_CASE_STATUSES:
        raise LeafStopped(f"the case is {case_status}", cancelled=True)
    if status != NodeStatus.RUNNING or attempts != claim.attempt:
        raise LeafStopped("this attempt no longer holds the leaf", cancelled=False)
    if is_stopped():
        raise LeafStopped("execution is stopped", cancelled=False)


# Ending ----------------------------------------------------------------------------------------


def _locked_attempt(node_id: int, attempt: int, *, share: bool = False) -> tuple[PlanNode, Case]:
    """Lock a running attempt's leaf and its case; raise StaleResult when it lost the leaf.

    `share` takes the case row FOR SHARE rather than FOR UPDATE: completions of one case then run
    side by side (a cancel or an edit still waits for them, and they for it).
    """
    node = (
        PlanNode.objects.select_for_update(of=("self",))
        .select_related("version")
        .annotate(stopped=Exists(ExecutionControl.objects.filter(pk=1, stopped=True)))
        .get(pk=node_id)
    )
    if share:
        case = _share_locked_case(node.version.case_id)
    else:
        case = Case.objects.select_for_update().get(pk=node.version.case_id)
    if node.status != NodeStatus.RUNNING or node.attempts != attempt:
        raise StaleResult(
            f"attempt {attempt} of {node.key} is stale: the leaf is {node.status} "
            f"at attempt {node.attempts}",
            node=node,
            attempt=attempt,
        )
    return node, case


def _share_locked_case(case_id: int) -> Case:
    """Return the case, its row locked FOR SHARE (Django's select_for_update has no such mode)."""
    query = Case.objects.filter(pk=case_id)
    if not connection.features.has_select_for_update:
        return query.get()  # SQLite: one writer at a time anyway
    sql, params = query.query.sql_with_params()
    return Case.objects.raw(f"{sql} FOR SHARE", params)[0]


@transaction.atomic
def _record_stale(exc: StaleResult) -> None:
    """Record a refused result in a transaction of its own (the refusing one rolled back)."""
    node = exc.node
    LeafAttempt.objects.filter(node=node, number=exc.attempt, outcome="running").update(
        outcome=LeafAttempt.Outcome.STALE, finished_at=timezone.now()
    )
    append_event(
        "execution.leaf.result_refused",
        chain=case_chain(node.version.case_id),
        data={
            "node": node.key,
            "attempt": exc.attempt,
            "holder": node.attempts,
            "status": node.status,
            "why": "stale attempt (fencing)",
        },
    )


@functools.lru_cache(maxsize=256)
def _dependents_by_key(version_id: int, stored_at: datetime) -> Mapping[str, tuple[int, ...]]:
    """Return, for one plan version, the ids of the leaves waiting for each leaf key.

    Read once per version and worker process: a stored version's DAG never changes (an edit
    stores a new version), so the whole plan is not read again at every completion.
    """
    found: dict[str, list[int]] = {}
    rows = PlanNode.objects.filter(version_id=version_id, kind=LEAF).values_list("pk", "depends_on")
    for pk, deps in rows:
        for dep in deps:
            found.setdefault(dep, []).append(pk)
    return {key: tuple(pks) for key, pks in found.items()}


@functools.lru_cache(maxsize=256)
def _leaf_keys(version_id: int, stored_at: datetime) -> Mapping[int, str]:
    """Return the keys of one plan version's leaves by id (a stored version never changes).

    Cached by id and time of storing: an id a restored database hands out again is another key.
    """
    return dict(PlanNode.objects.filter(version_id=version_id, kind=LEAF).values_list("pk", "key"))


def _dependents(node: PlanNode) -> list[int]:
    return list(_dependents_by_key(node.version_id, node.version.created_at).get(node.key, ()))


def _end_attempt(node: PlanNode, attempt: int, outcome: str, **fields: str) -> None:
    LeafAttempt.objects.filter(node=node, number=attempt).update(
        outcome=outcome, finished_at=timezone.now(), **fields
    )


def complete_leaf(
    node_id: int,
    attempt: int,
    output: Mapping[str, Any],
    *,
    kind: str = "tool",
    keep: int = 0,
    worker: str = "",
) -> Ended:
    """Record a leaf's output: it `succeeded`, trust learns, dependents may become ready.

    On a case cancelled meanwhile, a tool's effect that already happened is recorded and the
    leaf ends `succeeded` flagged as finished after the cancel; an LLM's or a person's result is
    not committed (the leaf ends `cancelled`). Raises StaleResult for a stale attempt.
    """
    try:
        return _complete(node_id, attempt, output, kind=kind, keep=keep, worker=worker)
    except StaleResult as exc:
        _record_stale(exc)
        raise


def _complete(
    node_id: int, attempt: int, output: Mapping[str, Any], *, kind: str, keep: int, worker: str
) -> Ended:
    with transaction.atomic():
        node, case = _locked_attempt(node_id, attempt, share=True)
        now = timezone.now()
        chain = case_chain(case.pk)
        cancelled = case.status not in RUNNING_CASE_STATUSES
        if cancelled and kind != "tool":
            PlanNode.objects.filter(pk=node.pk).update(
                status=NodeStatus.CANCELLED, finished_at=now, lease_until=None
            )
            _end_attempt(node, attempt, LeafAttempt.Outcome.CANCELLED)
            append_event(
                "execution.leaf.cancelled",
                actor=node.agent or None,
                chain=chain,
                data={"node": node.key, "attempt": attempt, "why": f"the case is {case.status}"},
            )
            finish_if_done(case)
            return Ended(node_id=node.pk, status=NodeStatus.CANCELLED)
        PlanNode.objects.filter(pk=node.pk).update(
            status=NodeStatus.SUCCEEDED,
            output=dict(output),
            finished_at=now,
            lease_until=None,
            error="",
            error_class="",
            finished_after_cancel=cancelled,
        )
        _end_attempt(node, attempt, LeafAttempt.Outcome.SUCCEEDED)
        stopped = bool(node.stopped)  # type: ignore[attr-defined]
        ready = [] if cancelled else _release(node.version, candidates=_dependents(node), case=case)
        released = [n.key for n in ready]
        claimed = (
            _claim_next(node, case, ready[:keep], worker)
            if keep and not cancelled and not stopped and case.status == CaseStatus.EXECUTING
            else None
        )
        if not stopped:
            for other in ready:
                if claimed is None or other.pk != claimed.node_id:
                    dispatch.enqueue_leaf(other.pk)
        # The rows every completion of the case shares (the agent's trust, the chain head) are
        # locked last, so completions run side by side until there.
        record_outcome(node.agent, "succeeded", now=now)
        data: dict[str, Any] = {
            "node": node.key,
            "attempt": attempt,
            "output": dict(output),
            "finished_after_cancel": cancelled,
            "released": sorted(released),
            "before": {"status": "running"},
            "after": {"status": "succeeded"},
        }
        if claimed is not None:
            # This worker runs it next: its claim is audited here, not in an event of its own.
            data["claimed"] = _claim_data(claimed, worker)
        append_event("execution.leaf.succeeded", actor=node.agent or None, chain=chain, data=data)
        # The chain head is held from here to the commit: a completion that ends after this one
        # waits for it and sees it, so the last one to end sees nothing open and ends the case.
        # Its case row lock goes from SHARE to UPDATE then; no other completion of the version
        # can hold it (none has a leaf open). One of a replaced version's leaves might, and
        # wait for the chain head: the database breaks that deadlock and the retry redoes it.
        if claimed is None and not ready and not _open_work(case):
            finish_if_done(case)
        return Ended(
            node_id=node.pk,
            status=NodeStatus.SUCCEEDED,
            ready=tuple(n.pk for n in ready),
            claimed=claimed,
        )


def _claim_next(node: PlanNode, case: Case, kept: Sequence[PlanNode], worker: str) -> Claim | None:
    """Claim, in a completing transaction, the leaf this worker runs next.

    The first leaf the completion released (locked already), or else another ready leaf of the
    same version no other transaction holds (SKIP LOCKED; its queued message then finds it taken).
    """
    nxt = (
        kept[0]
        if kept
        else PlanNode.objects.select_for_update(of=("self",), skip_locked=True)
        .filter(version_id=node.version_id, kind=LEAF, status=NodeStatus.READY)
        .order_by("position")  # the plan's order, as start_execution sends them
        .first()
    )
    if nxt is None:
        return None
    nxt.version = node.version
    taken = _take(nxt, case, worker)
    return taken if isinstance(taken, Claim) else None


def _open_work(case: Case) -> bool:
    """Tell whether the case's current version still has an open leaf or an open gate."""
    version_id = case.current_version_id
    return (
        PlanNode.objects.filter(
            version_id=version_id, kind=LEAF, status__in=OPEN_LEAF_STATUSES
        ).exists()
        or Gate.objects.filter(version_id=version_id, status__in=OPEN_GATE_STATUSES).exists()
    )


def fail_leaf(node_id: int, attempt: int, *, error_class: str, error: str) -> Ended:
    """Record a failed attempt and apply the leaf's failure policy.

    `retry` retries transient errors with exponential backoff and jitter up to the maximum
    attempts; `continue` fails the leaf and blocks its dependents; `abort` fails the case;
    `escalate` (and `retry` or `replan` out of options) opens an escalation gate for a person.
    Raises StaleResult for a stale attempt.
    """
    try:
        with transaction.atomic():
            node, case = _locked_attempt(node_id, attempt)
            return _apply_failure(node, case, attempt, error_class=error_class, error=error)
    except StaleResult as exc:
        _record_stale(exc)
        raise


def _apply_failure(
    node: PlanNode, case: Case, attempt: int, *, error_class: str, error: str
) -> Ended:
    now = timezone.now()
    chain = case_chain(case.pk)
    error = error[:4000]
    _end_attempt(node, attempt, LeafAttempt.Outcome.FAILED, error_class=error_class, error=error)
    record_outcome(node.agent, "failed", now=now)
    policy = node.failure_policy or "abort"
    append_event(
        "execution.leaf.attempt_failed",
        actor=node.agent or None,
        chain=chain,
        data={
            "node": node.key,
            "attempt": attempt,
            "error_class": error_class,
            "error": error,
            "failure_policy": policy,
        },
    )
    if case.status not in RUNNING_CASE_STATUSES:
        PlanNode.objects.filter(pk=node.pk).update(
            status=NodeStatus.CANCELLED, finished_at=now, lease_until=None, error=error,
            error_class=error_class,
        )  # fmt: skip
        return Ended(node_id=node.pk, status=NodeStatus.CANCELLED)
    if policy == "retry" and error_class == ErrorClass.TRANSIENT and attempt < max_attempts():
        delay = retry_delay_s(attempt)
        at = now + timedelta(seconds=delay)
        PlanNode.objects.filter(pk=node.pk).update(
            status=NodeStatus.RETRYING, next_attempt_at=at, lease_until=None, error=error,
            error_class=error_class,
        )  # fmt: skip
        append_event(
            "execution.leaf.retrying",
            chain=chain,
            data={"node": node.key, "attempt": attempt, "retry_in_s": round(delay, 3)},
        )
        transaction.on_commit(lambda: _send_retry(node.pk, delay), robust=True)
        return Ended(node_id=node.pk, status=NodeStatus.RETRYING)
    PlanNode.objects.filter(pk=node.pk).update(
        error=error, error_class=error_class, finished_at=now, lease_until=None
    )
    why = f"{node.key} failed ({error_class}): {error}"
    if policy == "continue":
        _fail_and_block(node, why=why, actor=None)
    elif policy == "abort":
        _fail_and_block(node, why=why, actor=None)
        _end_case(case, CaseStatus.FAILED, reasons=[f"step {why}; failure policy abort"])
        return Ended(node_id=node.pk, status=NodeStatus.FAILED)
    elif policy == "replan" and _replan(node, case, why):
        return Ended(node_id=node.pk, status=NodeStatus.FAILED)
    else:
        PlanNode.objects.filter(pk=node.pk).update(status=NodeStatus.AWAITING_APPROVAL)
        from oversight.actions.gates import open_escalation_gate

        open_escalation_gate(
            node.version,
            node,
            reason=f"step {why}; failure policy {policy}: approve to run it again, "
            "reject to fail it",
        )
        return Ended(node_id=node.pk, status=NodeStatus.AWAITING_APPROVAL)
    finish_if_done(case)
    return Ended(node_id=node.pk, status=NodeStatus.FAILED)


def _send_retry(node_id: int, delay: float) -> None:
    dispatch.send_leaf(node_id, countdown=delay)


def _replan(node: PlanNode, case: Case, why: str) -> bool:
    """Hand a failed leaf to re-planning; False when its case cannot be re-planned."""
    hooks = getattr(settings, "CASEHUB_REPLAN_HOOK", None)
    if not hooks:
        return False
    from django.utils.module_loading import import_string

    return bool(import_string(hooks)(node=node, case=case, why=why))


def _fail_and_block(node: PlanNode, *, why: str, actor: User | None) -> list[str]:
    """Fail a leaf and block every leaf downstream of it; return the blocked keys."""
    PlanNode.objects.filter(pk=node.pk).update(status=NodeStatus.FAILED)
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
    PlanNode.objects.filter(
        version_id=node.version_id, key__in=blocked, status__in=OPEN_LEAF_STATUSES
    ).exclude(status=NodeStatus.RUNNING).update(status=NodeStatus.BLOCKED)
    append_event(
        "execution.leaf.failed",
        actor=actor,
        chain=case_chain(node.version.case_id),
        data={"node": node.key, "why": why, "blocked": sorted(blocked)},
    )
    return sorted(blocked)


def stop_at_safe_point(claim: Claim, *, why: str, cancelled: bool) -> Ended:
    """End an attempt that stopped at a safe point: `cancelled`, or `ready` again after a stop."""
    with transaction.atomic():
        try:
            node, case = _locked_attempt(claim.node_id, claim.attempt)
        except StaleResult:
            # Its result is not refused: it has none. The new holder carries on.
            return Ended(node_id=claim.node_id, status="stale")
        now = timezone.now()
        if cancelled or case.status not in RUNNING_CASE_STATUSES:
            status = NodeStatus.CANCELLED
            PlanNode.objects.filter(pk=node.pk).update(
                status=status, finished_at=now, lease_until=None
            )
            _end_attempt(node, claim.attempt, LeafAttempt.Outcome.CANCELLED)
        else:
            # Stopped before any effect: the next claim (after resume) runs it with the same key.
            status = NodeStatus.READY
            PlanNode.objects.filter(pk=node.pk).update(
                status=status, lease_until=None, enqueued_at=now
            )
            _end_attempt(node, claim.attempt, LeafAttempt.Outcome.CANCELLED, error=why)
        append_event(
            "execution.leaf.stopped",
            chain=case_chain(case.pk),
            data={"node": node.key, "attempt": claim.attempt, "why": why, "after": status},
        )
        finish_if_done(case)
        return Ended(node_id=node.pk, status=status)


# Human leaves ---------------------------------------------------------------------------------


def open_work_item(claim: Claim, *, group_name: str) -> WorkItem:
    """Give a running human leaf to its group as a work item (the leaf waits for it)."""
    from oversight.actions.gates import _group, active_policy

    _, policy = active_policy()
    with transaction.atomic():
        node = PlanNode.objects.select_for_update(of=("self",)).get(pk=claim.node_id)
        if node.status != NodeStatus.RUNNING or node.attempts != claim.attempt:
            raise StaleResult(
                f"attempt {claim.attempt} of {node.key} is stale", node=node, attempt=claim.attempt
            )
        now = timezone.now()
        item, created = WorkItem.objects.get_or_create(
            node=node,
            attempt=claim.attempt,
            defaults={
                "case_id": claim.case_id,
                "group": _group(group_name),
                "created_at": now,
                "deadline": now + timedelta(hours=policy.gate_hours),
            },
        )
        # A person takes hours, not seconds: no lease to expire while the item is open.
        PlanNode.objects.filter(pk=node.pk).update(lease_until=None)
        if created:
            append_event(
                "execution.work_item.opened",
                chain=case_chain(claim.case_id),
                data={"node": node.key, "work_item": item.pk, "group": group_name},
            )
            notify.work_item_opened(item)
        return item


def complete_work_item(*, item_id: int, user: User, output: Mapping[str, Any]) -> Ended:
    """Complete an open work item of the user's group with its output; the leaf succeeds.

    Raises WorkItemConflict when the item is not open (or not for the user's groups), and
    whatever output validation raises (the runner's schema check, ValueError with the field).
    """
    from oversight.runners import check_output

    with transaction.atomic():
        item = (
            WorkItem.objects.select_for_update()
            .select_related("node", "node__version")
            .filter(pk=item_id, group__in=user.groups.all())
            .first()
        )
        if item is None:
            raise WorkItemConflict("no such open work item for your groups")
        if item.status != WorkItem.Status.OPEN:
            raise WorkItemConflict(f"the work item is {item.status}")
        if item.case.submitter_id == user.pk:
            raise WorkItemConflict("you submitted this case: another person must do this step")
        checked = check_output(item.node, output)
        item.status = WorkItem.Status.COMPLETED
        item.completed_by = user
        item.completed_at = timezone.now()
        item.output = checked
        item.save(update_fields=["status", "completed_by", "completed_at", "output"])
        append_event(
            "execution.work_item.completed",
            actor=user,
            chain=case_chain(item.case_id),
            data={"work_item": item.pk, "node": item.node.key, "output": checked},
        )
        return complete_leaf(item.node_id, item.attempt, checked, kind="human")


# Ending the case -------------------------------------------------------------------------------


def finish_if_done(case: Case) -> str | None:
    """End the case once none of its current leaves is open: goal-level verification decides.

    Returns the new status, or None while leaves remain. Call with the case row locked.
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
    from oversight.runners import verify_goal

    verdict = verify_goal(case)
    _end_case(
        case,
        CaseStatus.COMPLETED if verdict.passed else CaseStatus.FAILED,
        reasons=list(verdict.reasons),
        checks=list(verdict.checks),
    )
    return case.status


def _end_case(
    case: Case, status: str, *, reasons: Sequence[str], checks: Sequence[str] = ()
) -> None:
    before = case.status
    now = timezone.now()
    case.status = status
    case.finished_at = now
    case.verification = {
        "passed": status == CaseStatus.COMPLETED,
        "reasons": list(reasons),
        "checks": list(checks),
    }
    case.save(update_fields=["status", "finished_at", "verification", "updated_at"])
    if case.current_version_id is not None:
        _cancel_open_leaves(case.current_version_id)
        from oversight.actions.gates import void_open_gates

        void_open_gates(
            PlanVersion.objects.get(pk=case.current_version_id), why=f"the case is {status}"
        )
    append_event(
        f"planning.case.{status}",
        chain=case_chain(case.pk),
        data={
            "case": case.pk,
            "before": {"status": before},
            "after": {"status": status},
            "verification": case.verification,
        },
    )
    notify.case_finished(case)


def _cancel_open_leaves(version_id: int) -> None:
    # A human leaf waiting for its work item has no worker to reach a safe point: it ends here.
    waiting = WorkItem.objects.filter(
        node__version_id=version_id, status=WorkItem.Status.OPEN
    ).values_list("node_id", flat=True)
    PlanNode.objects.filter(pk__in=list(waiting), status=NodeStatus.RUNNING).update(
        status=NodeStatus.CANCELLED, finished_at=timezone.now(), lease_until=None
    )
    PlanNode.objects.filter(
        version_id=version_id,
        kind=LEAF,
        status__in=(
            NodeStatus.PENDING,
            NodeStatus.AWAITING_APPROVAL,
            NodeStatus.READY,
            NodeStatus.RETRYING,
        ),
    ).update(status=NodeStatus.CANCELLED)
    WorkItem.objects.filter(node__version_id=version_id, status=WorkItem.Status.OPEN).update(
        status=WorkItem.Status.CANCELLED
    )


@transaction.atomic
def cancel_case(*, case_id: int, user: User, reason_code: str, reason: str = "") -> Case:
    """Cancel a case: nothing new starts, queued leaves end `cancelled`, running ones stop at
    their next safe point (E12).

    Raises CaseNotRunning (409) for a case that already ended, PermissionDenied for a user who
    may not cancel it, and ReasonInvalid (422) without a valid `cancel` reason code.
    """
    from django.core.exceptions import PermissionDenied

    from oversight.actions.gates import check_reason
    from oversight.roles import ADMIN, OFFICER, SUPERVISOR

    code = check_reason(reason_code, "cancel", required=True)
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
    before = case.status
    case.status = CaseStatus.CANCELLED
    case.finished_at = timezone.now()
    case.save(update_fields=["status", "finished_at", "updated_at"])
    running = 0
    if case.current_version_id is not None:
        running = PlanNode.objects.filter(
            version_id=case.current_version_id, kind=LEAF, status=NodeStatus.RUNNING
        ).count()
        _cancel_open_leaves(case.current_version_id)
        from oversight.actions.gates import void_open_gates

        void_open_gates(
            PlanVersion.objects.get(pk=case.current_version_id),
            why="the case was cancelled",
            actor=user,
        )
    append_event(
        "planning.case.cancelled",
        actor=user,
        chain=case_chain(case.pk),
        data={
            "case": case.pk,
            "reason_code": code.code if code else "",
            "reason": reason.strip(),
            "running_leaves": running,
            "before": {"status": before},
            "after": {"status": case.status},
        },
    )
    return case


# Trust ------------------------------------------------------------------------------------------


def effective_trust(
    agent: Agent, capabilities: Sequence[str], rows: Sequence[TrustScore] | None = None
) -> float:
    """Return the agent's learned trust for `capabilities` (the lowest; the prior without data).

    `rows` are the agent's scores when the caller read them already.
    """
    found = {s.capability: s for s in (rows if rows is not None else agent.scores.all())}
    now = timezone.now().timestamp()
    scores = []
    for capability in capabilities or ["*"]:
        row = found.get(capability)
        evidence = (
            trust.evidence_at(row.successes, row.failures, now)
            if row is not None
            else trust.Evidence()
        )
        scores.append(trust.score(agent.trust, evidence))
    return min(scores)


def record_outcome(agent_slug: str, outcome: trust.Outcome, *, now: datetime) -> None:
    """Add an outcome to the agent's trust for each of its capabilities (caller's transaction).

    One increment of the stored weighted sums, no row read or locked first: completions of
    every case share an agent's rows, so they must not queue behind each other here.
    """
    if outcome not in trust.OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    w = trust.weight(now.timestamp())
    column = "successes" if outcome == "succeeded" else "failures"
    changed = TrustScore.objects.filter(agent__slug=agent_slug).update(
        **{column: F(column) + w}, updated_at=now
    )
    if changed:
        return
    agent = Agent.objects.filter(slug=agent_slug).first()
    if agent is None:
        return
    TrustScore.objects.bulk_create(
        [
            TrustScore(agent=agent, capability=c, successes=0.0, failures=0.0, updated_at=now)
            for c in list(agent.capabilities) or ["*"]
        ],
        ignore_conflicts=True,
    )
    TrustScore.objects.filter(agent=agent).update(**{column: F(column) + w}, updated_at=now)


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

    def as_data(self) -> dict[str, list[int]]:
        return {
            "finished": list(self.finished),
            "resent": list(self.resent),
            "recovered": list(self.recovered),
            "timed_out": list(self.timed_out),
            "dead_lettered": list(self.dead_lettered),
            "retried": list(self.retried),
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
        due = list(
            PlanNode.objects.select_for_update(skip_locked=True)
            .filter(status=NodeStatus.RETRYING, next_attempt_at__lte=now)
            .values_list("pk", flat=True)
        )
        for pk in due:
            PlanNode.objects.filter(pk=pk).update(status=NodeStatus.READY, next_attempt_at=None)
            retried.append(pk)
            if not stopped:
                _send(pk)
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
                _send(pk)
                resent.append(pk)
    with transaction.atomic():
        expired = list(
            PlanNode.objects.select_for_update(of=("self",), skip_locked=True)
            .select_related("version")
            .filter(status=NodeStatus.RUNNING, lease_until__lt=now)
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
                PlanNode.objects.filter(pk=node.pk).update(
                    status=NodeStatus.CANCELLED, lease_until=None, finished_at=now
                )
                _end_attempt(node, attempt, LeafAttempt.Outcome.LOST)
                continue
            if held >= hard_limit_s():
                timed_out.append(node.pk)
                _apply_failure(
                    node,
                    case,
                    attempt,
                    error_class=ErrorClass.TIMEOUT,
                    error=f"no result within the hard time limit of {hard_limit_s():g} s",
                )
                continue
            _end_attempt(node, attempt, LeafAttempt.Outcome.LOST, error="lease expired")
            if attempt >= max_deliveries():
                dead.append(node.pk)
                PlanNode.objects.filter(pk=node.pk).update(
                    status=NodeStatus.AWAITING_APPROVAL,
                    lease_until=None,
                    error_class=ErrorClass.POISON,
                    error=f"dead-lettered: its worker was lost {attempt} times in a row",
                )
                append_event(
                    "execution.leaf.dead_lettered",
                    chain=chain,
                    data={"node": node.key, "attempts": attempt},
                )
                from oversight.actions.gates import open_escalation_gate

                open_escalation_gate(
                    node.version,
                    node,
                    reason=f"step {node.key} was dead-lettered: its worker was lost {attempt} "
                    "times; approve to run it once more, reject to fail it",
                )
                continue
            recovered.append(node.pk)
            PlanNode.objects.filter(pk=node.pk).update(status=NodeStatus.READY, lease_until=None)
            append_event(
                "execution.leaf.recovered",
                chain=chain,
                data={
                    "node": node.key,
                    "attempt": attempt,
                    "why": "its lease expired (worker lost or stopped)",
                    "before": {"status": "running"},
                    "after": {"status": "ready"},
                },
            )
            if not stopped:
                _send(node.pk)
    finished = _finish_forgotten_cases()
    return Reconciled(
        finished=tuple(finished),
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


# The worker's loop ------------------------------------------------------------------------------


class _LeaseRenewer(threading.Thread):
    """Renew a running attempt's lease every third of it, until the hard time limit."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(name=f"lease-{claim.node_id}", daemon=True)
        self.claim = claim
        self.done = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + hard_limit_s()
        try:
            while not self.done.wait(lease_s() / 3):
                # Past the hard limit the lease is left to run out: the reconciler times it out.
                if time.monotonic() >= deadline:
                    return
                try:
                    if not renew_lease(self.claim.node_id, self.claim.attempt):
                        return
                except DatabaseError:
                    connection.close()
        finally:
            connection.close()

    def stop(self) -> None:
        self.done.set()


def _with_database_retry[T](action: Callable[[], T], *, what: str) -> T:
    """Run `action`, retrying a few times over a lost database connection (E5).

    Each try is a whole transaction, so a connection lost mid-way leaves no half state. Raises the
    last error when the database stays away: the lease then runs out and the reconciler recovers.
    """
    delay = 0.2
    for attempt in range(1, 6):
        try:
            return action()
        except (OperationalError, InterfaceError):
            connection.close()
            if attempt == 5:
                raise
            logger.warning("database lost during %s; try %s again in %.1f s", what, attempt, delay)
            time.sleep(delay)
            delay = min(delay * 2, 3.0)
    raise AssertionError("unreachable")


def _run_claimed(claim: Claim, *, keep: int = 0, worker: str = "") -> Ended | None:
    from oversight import runners

    renewer = _LeaseRenewer(claim)
    renewer.start()
    try:
        with runners.soft_time_limit(soft_limit_s()):
            output = runners.run(claim)
    except runners.WaitingForPerson:
        return None
    except LeafStopped as exc:
        why, cancelled = str(exc), exc.cancelled
        return _with_database_retry(
            lambda: stop_at_safe_point(claim, why=why, cancelled=cancelled),
            what="stopping a leaf",
        )
    except runners.LeafTimeLimit as exc:
        error_class, error = ErrorClass.TIMEOUT, str(exc)
    except runners.LeafError as exc:
        if isinstance(exc.__cause__, OperationalError | InterfaceError):
            return _lost_database(claim, exc.__cause__)
        error_class, error = exc.error_class, str(exc)
    except (OperationalError, InterfaceError) as exc:
        return _lost_database(claim, exc)
    except Exception as exc:
        logger.exception("leaf %s failed", claim.key)
        error_class, error = ErrorClass.TOOL_FAILURE, f"{type(exc).__name__}: {exc}"
    else:
        return _with_database_retry(
            lambda: complete_leaf(
                claim.node_id, claim.attempt, output, kind=claim.kind, keep=keep, worker=worker
            ),
            what="completing a leaf",
        )
    finally:
        renewer.stop()
    return _with_database_retry(
        lambda: fail_leaf(claim.node_id, claim.attempt, error_class=error_class, error=error),
        what="failing a leaf",
    )


def _lost_database(claim: Claim, exc: BaseException) -> Ended:
    """Hand back an attempt that lost CaseHub's own database mid-run: it is not the leaf's failure.

    The leaf is ready again for another attempt (its effects carry the same idempotency key),
    like a leaf whose worker was lost; after as many deliveries it fails as transient.
    """
    connection.close()
    why = f"database connection lost: {exc}"[:500]

    def requeue() -> Ended:
        with transaction.atomic():
            try:
                node, case = _locked_attempt(claim.node_id, claim.attempt)
            except StaleResult:
                return Ended(node_id=claim.node_id, status="stale")
            if node.attempts >= max_deliveries():
                return _apply_failure(
                    node, case, claim.attempt, error_class=ErrorClass.TRANSIENT, error=why
                )
            _end_attempt(node, claim.attempt, LeafAttempt.Outcome.LOST, error=why)
            PlanNode.objects.filter(pk=node.pk).update(status=NodeStatus.READY, lease_until=None)
            append_event(
                "execution.leaf.recovered",
                chain=case_chain(case.pk),
                data={"node": node.key, "attempt": claim.attempt, "why": why},
            )
            if not is_stopped():
                _send(node.pk)
            return Ended(node_id=node.pk, status=NodeStatus.READY)

    return _with_database_retry(requeue, what="handing a leaf back")


def inline_s() -> float:
    """Return how long one task keeps running further leaves on its worker before it hands
    the rest back to the queue (other cases' messages wait behind it meanwhile)."""
    return min(_setting("CASEHUB_LEAF_INLINE_S", 10), hard_limit_s())


def execute_leaf(node_id: int, *, worker: str) -> list[str]:
    """Claim and run a leaf, then, while time allows, the leaf its completion claimed for this
    worker (one it made ready, or another ready leaf of the case), and so on.

    Returns what happened to each leaf ("12 succeeded", "13 refused: the leaf is running").
    A duplicate message, a stopped switch or a cancelled case is a refusal, not an error.
    """
    started = time.monotonic()
    outcomes: list[str] = []
    try:
        claim: Claim | None = _with_database_retry(
            functools.partial(claim_leaf, node_id, worker=worker), what="claiming a leaf"
        )
    except ClaimRefused as exc:
        return [f"{node_id} refused: {exc}"]
    while claim is not None:
        keep = 1 if time.monotonic() - started < inline_s() else 0
        try:
            ended = _run_claimed(claim, keep=keep, worker=worker)
        except StaleResult as exc:
            outcomes.append(f"{claim.node_id} stale: {exc}")
            break
        if ended is None:
            outcomes.append(f"{claim.node_id} waits for a person")
            break
        outcomes.append(f"{claim.node_id} {ended.status}")
        claim = ended.claimed
    return outcomes
