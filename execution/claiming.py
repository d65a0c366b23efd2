"""Starting a case, releasing ready leaves, and claiming one for a worker (CAS + fencing)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.db.models import Count, Exists, Q
from django.utils import timezone

from audit.chain import Along, NewEvent, case_chain
from audit.transitions import Audit, audited
from execution import dispatch, rows, trust
from execution.cases import finish_if_done
from execution.common import (
    LEAF,
    RUNNING_CASE_STATUSES,
    Claim,
    ClaimRefused,
    LeafStopped,
    idempotency_key,
    is_stopped,
    lease_s,
)
from execution.models import ExecutionControl, LeafAttempt, TrustScore
from execution.trust_actions import effective_trust
from oversight.actions.gate_policy import active_policy, policy_settings
from oversight.actions.opening import open_escalation_gate, reopen_gate
from oversight.models import Gate, GateKind, GateStatus
from oversight.policy import PolicySettings
from planning.models import Agent, Case, CaseStatus, NodeStatus, PlanNode, PlanVersion
from planning.transitions import (
    move_case,
    move_node,
    move_node_along,
    release_locked,
    release_nodes,
)
from web.db import prepared_cursor

logger = logging.getLogger(__name__)


def start_execution(case: Case, *, actor: User | None) -> list[int]:
    """Start an approved case: it is `executing` and its ready leaves go to the workers.

    Call inside the transaction that approved the plan gate (the case row locked).
    """
    _start(case, actor=actor)
    assert case.current_version_id is not None
    released = release_ready(PlanVersion.objects.get(pk=case.current_version_id))
    if not released:
        # A re-planned version whose steps all ended already (carried over): nothing to run.
        finish_if_done(case)
    return released


def _start(case: Case, *, actor: User | None) -> None:
    """Move an approved case to `executing`, audited."""
    with audited(chain=case_chain(case.pk)) as audit:
        before = move_case(case, to=CaseStatus.EXECUTING, audit=audit)
        audit.add(
            NewEvent(
                "planning.case.executing",
                actor,
                {"case": case.pk, "before": {"status": before}, "after": {"status": case.status}},
            )
        )


def release_ready(
    version: PlanVersion,
    *,
    candidates: Iterable[int] | None = None,
    case: Case | None = None,
    stopped: bool | None = None,
) -> list[int]:
    """Make `pending` leaves whose dependencies all succeeded `ready`, and send them on commit.

    `candidates` limits the check to those leaf ids (the dependents of a leaf that just ended).
    The candidates are locked in id order, so that of several parents ending at once exactly one
    releases their common child (E11). `case` is the version's case when the caller holds it
    (locked) already. The leaves made ready are audited in one event. `stopped` is the stop
    switch when the caller read it already. Returns their ids.
    """
    case = case if case is not None else version.case
    with audited(chain=case_chain(case.pk)) as audit:
        ready = mark_ready(version, candidates=candidates, case=case, audit=audit)
        if ready:
            audit.add(
                NewEvent(
                    "execution.leaves.ready",
                    None,
                    {
                        "nodes": [n.key for n in ready],
                        "before": {"status": "pending"},
                        "after": {"status": "ready"},
                    },
                )
            )
    if not (is_stopped() if stopped is None else stopped):
        for node in ready:
            dispatch.enqueue_leaf(node.pk)
    return [n.pk for n in ready]


def mark_ready(
    version: PlanVersion,
    *,
    candidates: Iterable[int] | None,
    case: Case,
    audit: Audit,
    locked: Along | None = None,
) -> list[PlanNode]:
    """Make the candidates whose dependencies all succeeded `ready` (locked, in id order); the
    caller's `audit` block has the event that names them. `locked` is the lock of the pending
    candidates the caller ran already (`rows.pending_lock`, PostgreSQL)."""
    if case.status not in RUNNING_CASE_STATUSES or case.current_version_id != version.pk:
        return []
    ids = list(candidates) if candidates is not None else None
    if locked is not None:
        # Locked by an earlier statement: this one's snapshot sees every parent that committed
        # meanwhile (E11). It reads what the released leaves' claims check, too.
        if ids is None or not locked.count:
            return []
        ready = release_locked(
            version.pk, ids, audit=audit, enqueued_at=timezone.now(), returning=rows.CLAIM_FACTS
        )
        for node in ready:
            rows.with_claim_facts(node, node.__dict__.pop("returned"))
            node.version = version
        return ready
    if ids is not None and connection.vendor == "postgresql":
        pending = rows.locked_pending(version.pk, ids) if ids else []
    else:
        query = PlanNode.objects.filter(version=version, kind=LEAF, status=NodeStatus.PENDING)
        if ids is not None:
            query = query.filter(pk__in=ids)
        pending = list(query.select_for_update().order_by("pk"))
    if not pending:
        return []
    # The candidates are locked above: one statement checks the statuses of the leaves they wait
    # for (the unique (version, key) index, not the whole plan's: a completion costs the same in
    # a plan of 10 leaves or of 1,000) and moves those whose dependencies all succeeded; on
    # PostgreSQL it also reads what their claims check (the rows are held: no older snapshot).
    postgres = connection.vendor == "postgresql"
    ready = release_nodes(
        pending,
        audit=audit,
        enqueued_at=timezone.now(),
        returning=rows.CLAIM_FACTS if postgres else "",
    )
    if postgres:
        for node in ready:
            rows.with_claim_facts(node, node.__dict__.pop("returned"))
    for node in ready:
        node.version = version
    return ready


# Claiming ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _GateRow:
    """What a claim reads of one of its leaf's gates."""

    pk: int
    kind: str
    status: str
    content_hash: str
    approval_expires_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class _ClaimFacts:
    """The rows a claim checks, read together: the leaf's gates (the plan's and its own, by id),
    its planned agent with its trust scores, and the active policy's settings."""

    gates: list[_GateRow]
    agent: Agent | None
    scores: list[TrustScore]
    policy: PolicySettings


# One statement (PostgreSQL): every value a claim's checks read, as JSON (`rows.CLAIM_FACTS`),
# when the statement that read or moved the leaf did not read them with it.
_CLAIM_FACTS_SQL = f'SELECT {rows.CLAIM_FACTS} FROM "{PlanNode._meta.db_table}" n WHERE n.id = %s'  # noqa: S608


def _when(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text is not None else None


def _claim_facts(node: PlanNode) -> _ClaimFacts:
    """Read what a claim of `node` checks: read with the leaf already (`rows.with_claim_facts`),
    or one statement on PostgreSQL, three elsewhere."""
    read = node.__dict__.pop("claim_facts", None)  # read for this claim only
    if read is not None:
        return _facts_of(*read)
    if connection.vendor != "postgresql":
        gates = Gate.objects.filter(version_id=node.version_id).filter(
            Q(kind=GateKind.PLAN) | Q(kind__in=(GateKind.STEP, GateKind.ESCALATION), node=node)
        )
        rows = [
            _GateRow(pk=g.pk, kind=g.kind, status=g.status, content_hash=g.content_hash,
                     approval_expires_at=g.approval_expires_at)
            for g in sorted(gates, key=lambda g: g.pk)
        ]  # fmt: skip
        agent, scores = _agent_and_scores(node.agent)
        return _ClaimFacts(gates=rows, agent=agent, scores=scores, policy=active_policy()[1])
    with prepared_cursor() as cursor:
        cursor.execute(_CLAIM_FACTS_SQL, [node.pk])
        return _facts_of(*cursor.fetchone())


def _facts_of(gates: Any, agent_row: Any, score_rows: Any, policy: Any) -> _ClaimFacts:
    """Build the claim's facts from the four JSON values of `rows.CLAIM_FACTS`."""
    agent = None
    if agent_row is not None:
        agent = Agent.from_db(
            DEFAULT_DB_ALIAS,
            _AGENT_FIELDS,
            [agent_row[f.column] for f in Agent._meta.concrete_fields],
        )
    scores = [
        TrustScore.from_db(
            DEFAULT_DB_ALIAS,
            _SCORE_FIELDS,
            [row["id"], row["agent_id"], row["capability"], row["successes"], row["failures"],
             _when(row["updated_at"])],
        )
        for row in score_rows
    ]  # fmt: skip
    return _ClaimFacts(
        gates=[
            _GateRow(
                pk=g["id"],
                kind=g["kind"],
                status=g["status"],
                content_hash=g["content_hash"],
                approval_expires_at=_when(g["expires"]),
            )
            for g in gates
        ],
        agent=agent,
        scores=scores,
        policy=policy_settings(*(policy["number"], policy["values"]) if policy else (None, None)),
    )


_AGENT_FIELDS = [f.attname for f in Agent._meta.concrete_fields]
_SCORE_FIELDS = ["id", "agent_id", "capability", "successes", "failures", "updated_at"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Approvals:
    """What the approvals of a leaf say at its claim."""

    # Why they do not allow it to run now (None: they do).
    problem: str | None = None
    # The approved gate that no longer holds (expired, or its content changed): reopened.
    lapsed: _GateRow | None = None
    # The leaf waits for its plan's gate, not for a gate of its own.
    for_plan: bool = False
    # A gate of the leaf's own (a step gate, or the escalation of its rejection) approved it.
    approved: bool = False


def _approvals(node: PlanNode, case: Case, now: datetime, gates: Sequence[_GateRow]) -> _Approvals:
    """Check the leaf's approvals: its plan's gate, then its own live one, if it has one.

    `gates` are the version's plan gates and the leaf's own, by id.
    """
    if case.current_version_id != node.version_id:
        version = node.version.number
        return _Approvals(problem=f"plan version {version} is no longer the case's current version")
    # The plan's live gate: an approval that expired was replaced by a newer gate (S4).
    plan = next((g for g in reversed(gates) if g.kind == GateKind.PLAN), None)
    if plan is None or plan.status != GateStatus.APPROVED:
        status = plan.status if plan is not None else "missing"
        return _Approvals(problem=f"the plan gate is {status}", for_plan=True)
    if plan.content_hash != node.version.content_hash:
        return _Approvals(problem="the plan changed after its approval", lapsed=plan, for_plan=True)
    if plan.approval_expires_at is not None and plan.approval_expires_at <= now:
        when = plan.approval_expires_at.isoformat()
        why = f"the plan's approval expired at {when}"
        return _Approvals(problem=why, lapsed=plan, for_plan=True)
    # The step's live gate: the newest step gate, or, when that one was rejected, the escalation
    # of the rejection approved after it (S6).
    live = next((g for g in reversed(gates) if g.kind == GateKind.STEP), None)
    if live is not None and live.status == GateStatus.REJECTED:
        later = [g for g in gates if g.kind == GateKind.ESCALATION and g.pk > live.pk]
        if later and later[-1].status == GateStatus.APPROVED:
            live = later[-1]
    if live is None:
        return _Approvals()
    if live.status != GateStatus.APPROVED:
        return _Approvals(problem=f"the step gate is {live.status}")
    if live.content_hash != node.content_hash:
        return _Approvals(
            problem="the step changed after its approval (content hash differs)", lapsed=live
        )
    if live.approval_expires_at is not None and live.approval_expires_at <= now:
        when = live.approval_expires_at.isoformat()
        return _Approvals(problem=f"the step's approval expired at {when}", lapsed=live)
    return _Approvals(approved=True)


def _agent_and_scores(slug: str) -> tuple[Agent | None, list[TrustScore]]:
    """Return the agent with its trust scores, in one query when it has scores."""
    scores = list(TrustScore.objects.filter(agent__slug=slug).select_related("agent"))
    if scores:
        return scores[0].agent, scores
    return Agent.objects.filter(slug=slug).first(), []


def _routing(
    node: PlanNode,
    planned: Agent | None,
    scores: list[TrustScore],
    *,
    approved: bool,
    policy: PolicySettings,
) -> trust.Routing:
    """Check who should run the leaf: the planned agent while it is trusted enough.

    The planned agent's own trust is read first; the other candidates (and their load) only
    when it is not trusted enough or not available. An agent with no outcomes yet runs a step
    a gate of its own `approved` unless the policy's `cold_start` says to escalate it.
    """
    threshold = policy.trust_threshold
    capabilities = list(planned.capabilities) if planned is not None else []
    if planned is not None and planned.enabled:
        mine = effective_trust(planned, capabilities, scores)
        if mine >= threshold:
            return trust.route(
                node.agent, [trust.Candidate(agent=planned.slug, trust=mine)], threshold=threshold
            )
        untried = not any(s.successes or s.failures for s in scores)
        if untried and approved and policy.cold_start == "trusted":
            return trust.cold_start(planned.slug, mine, threshold=threshold)
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
        # A refusal commits too, with its own changes if any (the leaf waits for a new approval).
        raise ClaimRefused(claim)
    return claim


def _claim(node_id: int, worker: str) -> Claim | str:
    # A leaf another transaction holds is being claimed, released or recovered by it, and that
    # one sends or runs it: this message is not waited for (SKIP LOCKED) but refused.
    if connection.vendor == "postgresql":
        node = rows.leaf_with_case(node_id, claiming=True)
    else:
        node = (
            PlanNode.objects.select_for_update(of=("self",), skip_locked=True)
            .select_related("version", "version__case")
            .annotate(stopped=Exists(ExecutionControl.objects.filter(pk=1, stopped=True)))
            .filter(pk=node_id, kind=LEAF)
            .first()
        )
    # A refusal is returned, not raised: its transaction ends in a COMMIT, not a ROLLBACK (which
    # would also drop the connection's prepared statements: psycopg deallocates them all then).
    if node is None:
        status = (
            rows.leaf_status(node_id)
            if connection.vendor == "postgresql"
            else PlanNode.objects.filter(pk=node_id, kind=LEAF)
            .values_list("status", flat=True)
            .first()
        )
        if status is None:
            return "no such leaf"
        if status in (NodeStatus.READY, NodeStatus.RETRYING):
            return "the leaf is held by another transaction"
        return f"the leaf is {status}"  # not claimable (PostgreSQL reads only those it may take)
    if node.status == NodeStatus.RETRYING:
        # A retry's backoff message: the retry starts when its wait is over (S11), not before.
        if node.next_attempt_at is not None and node.next_attempt_at > timezone.now():
            return f"the leaf is retrying until {node.next_attempt_at.isoformat()}"
    elif node.status != NodeStatus.READY:
        return f"the leaf is {node.status}"
    before = node.status
    case = node.version.case
    if case.status not in RUNNING_CASE_STATUSES:
        return f"the case is {case.status}"
    if node.stopped:  # type: ignore[attr-defined]
        return "execution is stopped"
    with audited(chain=case_chain(case.pk)) as audit:
        taken = take_leaf(node, case, worker, audit=audit)
        if isinstance(taken, str):
            return taken
        if case.status == CaseStatus.APPROVED:
            # Started in its approving transaction as a rule: here only if that did not run.
            _start(case, actor=None)
        audit.add(
            NewEvent(
                "execution.leaf.claimed",
                node.agent or None,
                claim_data(taken, worker, before=before),
            )
        )
    return taken


def claim_data(claim: Claim, worker: str, *, before: str = NodeStatus.READY) -> dict[str, Any]:
    return {
        "node": claim.key,
        "attempt": claim.attempt,
        "worker": worker,
        "lease_until": claim.lease_until.isoformat(),
        "before": {"status": str(before)},
        "after": {"status": "running"},
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class NewAttempt:
    """The attempt row a claim starts, for a caller that inserts it with its own writes."""

    node_id: int
    number: int
    worker: str
    started_at: datetime


def take_leaf(
    node: PlanNode,
    case: Case,
    worker: str,
    *,
    audit: Audit,
    started: list[NewAttempt] | None = None,
) -> Claim | str:
    """Claim a locked `ready` (or due `retrying`) leaf of a running case: approvals, routing,
    then `running`.

    Returns the claim, or why the leaf may not run now (its state, waiting for a new approval
    or an escalation, is changed and audited in the caller's transaction). The caller audits
    the claim itself in its `audit` block: in an event of its own, or in the completion that
    handed it over. With `started`, the claim's attempt row is appended there for the caller to
    insert in its transaction (with its other writes, in one statement) instead of here, and on
    PostgreSQL the leaf's move to `running` runs in the statement of the `audit` block's append
    (`planning.transitions.move_node_along`).
    """
    now = timezone.now()
    facts = _claim_facts(node)
    approvals = _approvals(node, case, now, facts.gates)
    if approvals.problem is not None:
        _refuse_for_approval(node, case, approvals)
        return approvals.problem
    planned, scores = facts.agent, facts.scores
    routing = _routing(node, planned, scores, approved=approvals.approved, policy=facts.policy)
    objects = routing.escalate or routing.agent != node.agent
    # An approved escalation overrules the routing; it is only looked for when routing objects.
    if objects and not _overruled(node):
        with audited(chain=case_chain(case.pk)) as escalated:
            move_node(
                node,
                to=NodeStatus.AWAITING_APPROVAL,
                audit=escalated,
                routing=routing.as_data(),
            )
            escalated.add(
                NewEvent(
                    "execution.leaf.routing_escalated",
                    None,
                    {"node": node.key, "routing": routing.as_data()},
                )
            )
        open_escalation_gate(
            node.version,
            node,
            reason=f"routing of step {node.key}: {routing.rationale}; approve to run it with "
            f"{node.agent} as planned, or edit the plan",
        )
        return routing.rationale
    attempt = node.attempts + 1
    lease_until = now + timedelta(seconds=lease_s())
    running: dict[str, Any] = {
        "attempts": attempt,
        "lease_until": lease_until,
        "started_at": now,
        "finished_at": None,
        "next_attempt_at": None,
        "routing": routing.as_data(),
    }
    if started is not None and connection.vendor == "postgresql":
        # In the statement of the caller's append, with the attempt's row: one round trip less
        # (until then the leaf is `ready` in the database, locked by this transaction).
        name = f"claimed{len(started)}"
        move_node_along(node, to=NodeStatus.RUNNING, audit=audit, name=name, **running)
    else:
        move_node(node, to=NodeStatus.RUNNING, audit=audit, **running)
    if started is None:
        LeafAttempt.objects.create(node=node, number=attempt, worker=worker[:255], started_at=now)
    else:
        started.append(
            NewAttempt(node_id=node.pk, number=attempt, worker=worker[:255], started_at=now)
        )
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


def _refuse_for_approval(node: PlanNode, case: Case, approvals: _Approvals) -> None:
    """Put a leaf whose approval no longer holds back to waiting, and ask for a new approval.

    A leaf waiting for its plan's gate is `pending` (a new plan approval releases it with the
    others); one waiting for a gate of its own is `awaiting_approval`. The approval that lapsed
    is reopened once, however many leaves' claims find it (its row is locked to check).
    """
    why = approvals.problem
    assert why is not None
    if node.version_id != case.current_version_id:
        # A replaced version's leaf never runs; the current version has leaves of its own.
        after = NodeStatus.CANCELLED
    else:
        after = NodeStatus.PENDING if approvals.for_plan else NodeStatus.AWAITING_APPROVAL
    with audited(chain=case_chain(case.pk)) as audit:
        before = move_node(node, to=after, audit=audit, next_attempt_at=None)
        audit.add(
            NewEvent(
                "execution.leaf.claim_refused",
                None,
                {
                    "node": node.key,
                    "why": why,
                    "before": {"status": before},
                    "after": {"status": after},
                },
            )
        )
    if after != NodeStatus.CANCELLED and approvals.lapsed is not None:
        lapsed = Gate.objects.select_for_update(of=("self",)).select_related("version", "node")
        gate = lapsed.get(pk=approvals.lapsed.pk)
        if gate.status == GateStatus.APPROVED:
            reopen_gate(gate, why=why)


def lease_holds(node_id: int, attempt: int) -> bool:
    """Tell whether `attempt` still holds the leaf (for a worker about to act)."""
    return PlanNode.objects.filter(pk=node_id, attempts=attempt, status=NodeStatus.RUNNING).exists()


def renew_lease(node_id: int, attempt: int) -> bool:
    """Extend the lease of a running attempt; False when the attempt lost the leaf.

    A step handed to a person holds no lease (its work item holds it): a renewal that comes after
    the item opened leaves it so, or the reconciler would take the step back.
    """
    until = timezone.now() + timedelta(seconds=lease_s())
    return bool(
        PlanNode.objects.filter(
            pk=node_id, attempts=attempt, status=NodeStatus.RUNNING, lease_until__isnull=False
        ).update(lease_until=until)
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
