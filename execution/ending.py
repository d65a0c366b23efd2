"""Ending an attempt: completion (with the worker's next claim), failure policies, stops."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Exists
from django.utils import timezone

from audit.chain import Along, NewEvent, append_event, case_chain
from audit.transitions import Audit, audited
from execution import dispatch, rows, trust
from execution.cases import end_case, fail_and_block, finish_if_done
from execution.claiming import NewAttempt, claim_data, mark_ready, release_ready, take_leaf
from execution.common import (
    LEAF,
    OPEN_LEAF_STATUSES,
    RUNNING_CASE_STATUSES,
    Claim,
    Ended,
    ErrorClass,
    StaleResult,
    max_attempts,
    retry_delay_s,
)
from execution.models import ExecutionControl, LeafAttempt
from execution.replanning import replan_failed_leaf
from execution.trust_actions import outcome_increment, record_outcome
from oversight.actions.opening import open_escalation_gate
from oversight.models import OPEN_GATE_STATUSES, Gate
from planning.models import Case, CaseStatus, NodeStatus, PlanNode
from planning.transitions import move_node, move_nodes

logger = logging.getLogger(__name__)

# Ending ----------------------------------------------------------------------------------------


def locked_attempt(node_id: int, attempt: int, *, share: bool = False) -> tuple[PlanNode, Case]:
    """Lock a running attempt's leaf and its case; raise StaleResult when it lost the leaf.

    `share` takes the case row FOR SHARE rather than FOR UPDATE: completions of one case then run
    side by side (a cancel or an edit still waits for them, and they for it).
    """
    if share and connection.vendor == "postgresql":
        found = rows.leaf_with_case(node_id, claiming=False)
        if found is None:
            raise PlanNode.DoesNotExist(f"no plan leaf {node_id}")
        node, case = found, found.version.case
    else:
        stopped = Exists(ExecutionControl.objects.filter(pk=1, stopped=True))
        node = (
            PlanNode.objects.select_for_update(of=("self",))
            .select_related("version")
            .annotate(stopped=stopped)
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
def record_stale(exc: StaleResult) -> None:
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


def end_attempt(node: PlanNode, attempt: int, outcome: str, **fields: str) -> None:
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
    leaf: PlanNode | None = None,
) -> Ended:
    """Record a leaf's output: it `succeeded`, trust learns, dependents may become ready.

    On a case cancelled meanwhile, a tool's effect that already happened is recorded and the
    leaf ends `succeeded` flagged as finished after the cancel; an LLM's or a person's result is
    not committed (the leaf ends `cancelled`). Raises StaleResult for a stale attempt.

    `leaf` is the leaf as its claim read it (`Claim.node`, with its version): then, on
    PostgreSQL, the completion's first read and its move are one statement when nothing is
    amiss (`rows.complete_in_one`), and the usual read otherwise.
    """
    try:
        return _complete(node_id, attempt, output, kind=kind, keep=keep, worker=worker, leaf=leaf)
    except StaleResult as exc:
        record_stale(exc)
        raise


def _complete(
    node_id: int,
    attempt: int,
    output: Mapping[str, Any],
    *,
    kind: str,
    keep: int,
    worker: str,
    leaf: PlanNode | None,
) -> Ended:
    with transaction.atomic():
        now = timezone.now()
        if leaf is not None and connection.vendor == "postgresql":
            done = _succeed(node_id, attempt, output, now=now, keep=keep, worker=worker, leaf=leaf)
            if done is not None:
                return done
            # Nothing moved: the leaf is stale, or its case no longer runs its version.
        node, case = locked_attempt(node_id, attempt, share=True)
        cancelled = case.status not in RUNNING_CASE_STATUSES
        if cancelled and kind != "tool":
            with audited(chain=case_chain(case.pk)) as audit:
                move_node(
                    node, to=NodeStatus.CANCELLED, audit=audit, finished_at=now, lease_until=None
                )
                end_attempt(node, attempt, LeafAttempt.Outcome.CANCELLED)
                audit.add(
                    NewEvent(
                        "execution.leaf.cancelled",
                        node.agent or None,
                        {"node": node.key, "attempt": attempt, "why": f"the case is {case.status}"},
                    )
                )
            finish_if_done(case)
            return Ended(node_id=node.pk, status=NodeStatus.CANCELLED)
        ended = _succeed(
            node_id, attempt, output, now=now, keep=keep, worker=worker, read=(node, case)
        )
        assert ended is not None
        return ended


def _succeed(
    node_id: int,
    attempt: int,
    output: Mapping[str, Any],
    *,
    now: datetime,
    keep: int,
    worker: str,
    read: tuple[PlanNode, Case] | None = None,
    leaf: PlanNode | None = None,
) -> Ended | None:
    """Move the leaf `running → succeeded` and release, claim and audit what follows: the leaf
    and case `read` under their locks, or (`leaf`, the claim's) read and moved in one statement;
    None when that statement moved nothing."""
    chain = case_chain(read[1].pk if read is not None else leaf.version.case_id)  # type: ignore[union-attr]
    # One event audits the leaf's success, the leaves it released and the one claimed next.
    with audited(chain=chain) as audit:
        moved = {
            "output": dict(output),
            "finished_at": now,
            "lease_until": None,
            "error": "",
            "error_class": "",
        }
        if read is None:
            assert leaf is not None
            dependents = _dependents(leaf)
            done = rows.complete_in_one(
                leaf,
                attempt,
                dependents=dependents,
                audit=audit,
                finished_after_cancel=False,
                **moved,
            )
            if done is None:
                return None
            node, lock = done
            case = node.version.case
            cancelled = False
        else:
            node, case = read
            cancelled = case.status not in RUNNING_CASE_STATUSES
            dependents = [] if cancelled else _dependents(node)
            # On PostgreSQL the move also locks the pending dependents (one round trip less);
            # their release is the next statement, so it sees a parent that ended meanwhile.
            lock = (
                rows.pending_lock(node.version_id, dependents)
                if dependents
                and connection.vendor == "postgresql"
                and case.current_version_id == node.version_id
                else None
            )
            move_node(
                node,
                to=NodeStatus.SUCCEEDED,
                audit=audit,
                along=lock,
                finished_after_cancel=cancelled,
                **moved,
            )
        stopped = bool(node.stopped)  # type: ignore[attr-defined]
        ready = (
            []
            if cancelled
            else mark_ready(
                node.version, candidates=dependents, case=case, audit=audit, locked=lock
            )
        )
        released = [n.key for n in ready]
        started: list[NewAttempt] = []
        claims = (
            _claim_next(node, case, ready[:keep], worker, keep, audit=audit, started=started)
            if keep and not cancelled and not stopped and case.status == CaseStatus.EXECUTING
            else []
        )
        claimed = claims[0] if claims else None
        if not stopped:
            taken = {claim.node_id for claim in claims}
            for other in ready:
                if other.pk not in taken:
                    dispatch.enqueue_leaf(other.pk)
        # The rows every completion of the case shares (the agent's trust, the chain head)
        # are locked last, so completions run side by side until there.
        along = _record_attempts(node, attempt, started, now=now)
        if along is not None:
            audit.along(along)
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
            data["claimed"] = claim_data(claimed, worker)
        if len(claims) > 1:
            # and this one after it (`keep` 2: claimed ahead, while the next runs)
            data["claimed_ahead"] = claim_data(claims[1], worker)
        audit.add(NewEvent("execution.leaf.succeeded", node.agent or None, data))
    if along is not None and not along.count:
        # The agent's first outcome: its trust rows are created (the increment changed none).
        record_outcome(node.agent, "succeeded", now=now)
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
        ahead=claims[1] if len(claims) > 1 else None,
    )


def _record_attempts(
    node: PlanNode, attempt: int, started: Sequence[NewAttempt], *, now: datetime
) -> Along | None:
    """End the succeeded attempt, insert the attempt of the leaf claimed next, and add the success
    to the agent's trust (its rows locked last but the chain head's).

    On PostgreSQL these are returned as writes for the completion's audit append to run in its
    statement (`audit.chain.Along`: one round trip for all); elsewhere they are done here.
    """
    if connection.vendor != "postgresql":
        end_attempt(node, attempt, LeafAttempt.Outcome.SUCCEEDED)
        for new in started:
            LeafAttempt.objects.create(
                node_id=new.node_id, number=new.number, worker=new.worker, started_at=new.started_at
            )
        record_outcome(node.agent, "succeeded", now=now)
        return None
    table = LeafAttempt._meta.db_table
    ctes = [
        f'"ended" AS (UPDATE "{table}" SET "outcome" = %(ended_outcome)s, '  # noqa: S608
        '"finished_at" = %(ended_at)s WHERE "node_id" = %(ended_node)s '
        'AND "number" = %(ended_number)s RETURNING 1)'
    ]
    params: dict[str, Any] = {
        "ended_outcome": LeafAttempt.Outcome.SUCCEEDED,
        "ended_at": now,
        "ended_node": node.pk,
        "ended_number": attempt,
    }
    for i, new in enumerate(started):
        ctes.append(
            f'"started{i}" AS (INSERT INTO "{table}" ("node_id", "number", "worker", '  # noqa: S608
            '"started_at", "finished_at", "outcome", "error_class", "error") '
            f"VALUES (%(started{i}_node)s, %(started{i}_number)s, %(started{i}_worker)s, "
            f"%(started{i}_at)s, NULL, %(started{i}_outcome)s, '', '') RETURNING 1)"
        )
        params |= {
            f"started{i}_node": new.node_id,
            f"started{i}_number": new.number,
            f"started{i}_worker": new.worker,
            f"started{i}_at": new.started_at,
            f"started{i}_outcome": LeafAttempt.Outcome.RUNNING,
        }
    increment, more = outcome_increment(node.agent, "succeeded", now=now)
    return Along(ctes=[*ctes, increment], params=params | more, first="trust")


def _claim_next(
    node: PlanNode,
    case: Case,
    kept: Sequence[PlanNode],
    worker: str,
    count: int,
    *,
    audit: Audit,
    started: list[NewAttempt],
) -> list[Claim]:
    """Claim, in a completing transaction, up to `count` leaves this worker runs next.

    The leaves the completion released (locked already) first, then other ready leaves of the
    same version no other transaction holds (SKIP LOCKED; their queued messages then find them
    taken). Stops at the first leaf its checks refuse (it stays ready, and its message runs it).
    """
    claims: list[Claim] = []
    kept = list(kept)
    while len(claims) < count:
        nxt: PlanNode | None
        if kept:
            nxt = kept.pop(0)
        elif connection.vendor == "postgresql":
            # Not one claimed here already: its move waits for the append (`take_leaf`), so it
            # is still `ready`, and this transaction's own locks do not make SKIP LOCKED skip it.
            nxt = rows.next_ready(node.version_id, besides=[claim.node_id for claim in claims])
        else:
            nxt = (
                PlanNode.objects.select_for_update(of=("self",), skip_locked=True)
                .filter(version_id=node.version_id, kind=LEAF, status=NodeStatus.READY)
                .order_by("position")  # the plan's order, as start_execution sends them
                .first()
            )
        if nxt is None:
            break
        nxt.version = node.version
        taken = take_leaf(nxt, case, worker, audit=audit, started=started)
        if not isinstance(taken, Claim):
            break
        claims.append(taken)
    return claims


def _open_work(case: Case) -> bool:
    """Tell whether the case's current version still has an open leaf or an open gate."""
    version_id = case.current_version_id
    if version_id is not None and connection.vendor == "postgresql":
        return rows.open_work(version_id)
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
            node, case = locked_attempt(node_id, attempt)
            return apply_failure(node, case, attempt, error_class=error_class, error=error)
    except StaleResult as exc:
        record_stale(exc)
        raise


def apply_failure(
    node: PlanNode, case: Case, attempt: int, *, error_class: str, error: str
) -> Ended:
    now = timezone.now()
    chain = case_chain(case.pk)
    error = error[:4000]
    end_attempt(node, attempt, LeafAttempt.Outcome.FAILED, error_class=error_class, error=error)
    # Only the agent's own failures lower its trust; the trail says which kind this was.
    kind = trust.failure_kind(error_class)
    if kind == "agent":
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
            "failure_kind": kind,
            "trust_lowered": kind == "agent",
        },
    )
    if case.status not in RUNNING_CASE_STATUSES:
        with audited(chain=chain) as audit:
            before = move_node(
                node, to=NodeStatus.CANCELLED, audit=audit, finished_at=now, lease_until=None,
                error=error, error_class=error_class,
            )  # fmt: skip
            audit.add(
                NewEvent(
                    "execution.leaf.cancelled",
                    None,
                    {
                        "node": node.key,
                        "attempt": attempt,
                        "why": f"the case is {case.status}",
                        "before": {"status": before},
                        "after": {"status": NodeStatus.CANCELLED},
                    },
                )
            )
        return Ended(node_id=node.pk, status=NodeStatus.CANCELLED)
    if policy == "retry" and error_class == ErrorClass.TRANSIENT and attempt < max_attempts():
        delay = retry_delay_s(attempt)
        at = now + timedelta(seconds=delay)
        with audited(chain=chain) as audit:
            move_node(
                node, to=NodeStatus.RETRYING, audit=audit, next_attempt_at=at, lease_until=None,
                error=error, error_class=error_class,
            )  # fmt: skip
            audit.add(
                NewEvent(
                    "execution.leaf.retrying",
                    None,
                    {"node": node.key, "attempt": attempt, "retry_in_s": round(delay, 3)},
                )
            )
        transaction.on_commit(lambda: _send_retry(node.pk, delay), robust=True)
        return Ended(node_id=node.pk, status=NodeStatus.RETRYING)
    PlanNode.objects.filter(pk=node.pk).update(
        error=error, error_class=error_class, finished_at=now, lease_until=None
    )
    why = f"{node.key} failed ({error_class}): {error}"
    if policy == "continue":
        fail_and_block(node, why=why, actor=None)
    elif policy == "abort":
        fail_and_block(node, why=why, actor=None)
        end_case(case, CaseStatus.FAILED, reasons=[f"step {why}; failure policy abort"])
        return Ended(node_id=node.pk, status=NodeStatus.FAILED)
    elif policy == "replan" and _replan(node, case, why):
        return Ended(node_id=node.pk, status=NodeStatus.FAILED)
    else:
        with audited(chain=chain) as audit:
            before = move_node(node, to=NodeStatus.AWAITING_APPROVAL, audit=audit)
            audit.add(
                NewEvent(
                    "execution.leaf.escalated",
                    None,
                    {
                        "node": node.key,
                        "attempt": attempt,
                        "failure_policy": policy,
                        "before": {"status": before},
                        "after": {"status": NodeStatus.AWAITING_APPROVAL},
                    },
                )
            )
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
    return bool(replan_failed_leaf(node=node, case=case, why=why))


def stop_at_safe_point(claim: Claim, *, why: str, cancelled: bool) -> Ended:
    """End an attempt that stopped at a safe point: `cancelled`, or `ready` again after a stop."""
    with transaction.atomic():
        try:
            node, case = locked_attempt(claim.node_id, claim.attempt)
        except StaleResult:
            # Its result is not refused: it has none. The new holder carries on.
            return Ended(node_id=claim.node_id, status="stale")
        now = timezone.now()
        with audited(chain=case_chain(case.pk)) as audit:
            if cancelled or case.status not in RUNNING_CASE_STATUSES:
                status = NodeStatus.CANCELLED
                move_node(node, to=status, audit=audit, finished_at=now, lease_until=None)
                end_attempt(node, claim.attempt, LeafAttempt.Outcome.CANCELLED)
            else:
                # Stopped before any effect: the next claim (after resume) runs it with the
                # same key.
                status = NodeStatus.READY
                move_node(node, to=status, audit=audit, lease_until=None, enqueued_at=now)
                end_attempt(node, claim.attempt, LeafAttempt.Outcome.CANCELLED, error=why)
            audit.add(
                NewEvent(
                    "execution.leaf.stopped",
                    None,
                    {"node": node.key, "attempt": claim.attempt, "why": why, "after": status},
                )
            )
        finish_if_done(case)
        return Ended(node_id=node.pk, status=status)


def on_step_approved(gate: Gate, *, actor: User) -> None:
    """A step or escalation gate was approved: the leaf may run once its dependencies are done.

    An escalation approved after a failure runs the leaf again (a new attempt, the same key).
    """
    node = gate.node
    assert node is not None
    with audited(chain=case_chain(gate.case_id)) as audit:
        approved = move_nodes(
            PlanNode.objects.filter(pk=node.pk),
            to=NodeStatus.PENDING,
            from_=(NodeStatus.AWAITING_APPROVAL,),
            audit=audit,
            error="",
            error_class="",
        )
        audit.add(
            *(
                NewEvent(
                    "execution.leaf.approved",
                    actor,
                    {
                        "node": node.key,
                        "gate": gate.pk,
                        "before": {"status": leaf.before},
                        "after": {"status": leaf.after},
                    },
                )
                for leaf in approved
            )
        )
    release_ready(gate.version, candidates=[node.pk])


def on_escalation_rejected(gate: Gate, *, actor: User, why: str) -> None:
    """An escalation of a failed leaf was rejected: the leaf fails and its dependents block."""
    node = gate.node
    assert node is not None
    fail_and_block(node, why=why, actor=actor)
    finish_if_done(Case.objects.select_for_update().get(pk=gate.case_id))
