"""The worker's loop: claim, run under a lease and time limits, end, run the next."""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from audit.chain import NewEvent, case_chain
from audit.transitions import audited
from execution import runners
from execution.claiming import claim_leaf, renew_lease
from execution.common import (
    Claim,
    ClaimRefused,
    Ended,
    ErrorClass,
    LeafError,
    LeafStopped,
    LeafTimeLimit,
    StaleResult,
    WaitingForPerson,
    hard_limit_s,
    is_stopped,
    leaf_setting,
    lease_s,
    max_deliveries,
    send_leaf,
    soft_limit_s,
)
from execution.ending import (
    apply_failure,
    complete_leaf,
    end_attempt,
    fail_leaf,
    locked_attempt,
    stop_at_safe_point,
)
from execution.models import LeafAttempt
from observability.runs import leaf_run
from planning.models import NodeStatus
from planning.transitions import move_node

logger = logging.getLogger(__name__)

# The worker's loop ------------------------------------------------------------------------------


class _LeaseKeeper:
    """Renew the lease of the attempt this process runs, every third of the lease, until the hard
    time limit; past it the lease is left to run out and the reconciler times the leaf out.

    One thread per worker process, started with its first leaf and kept: a thread started for
    each leaf cost the worker about 5 % of its busy time on short leaves (py-spy, `python -m bench
    execution`: `Thread.start` waits for the new thread to be scheduled). Between two leaves the
    thread sleeps on; it renews only a claim that is still held when its time comes.
    """

    def __init__(self) -> None:
        self.after_fork()

    def after_fork(self) -> None:
        """Start afresh (in a forked process: it inherits no thread, and maybe a lock one held)."""
        self._cond = threading.Condition()
        self._claim: Claim | None = None
        self._renew_at = 0.0
        self._deadline = 0.0
        # when the thread wakes by itself (inf: only when woken): an earlier renewal must wake it
        self._waiting_until = math.inf
        self._thread: threading.Thread | None = None

    def hold(self, claim: Claim) -> None:
        """Keep `claim`'s lease from now on (and no other's)."""
        with self._cond:
            now = time.monotonic()
            self._claim = claim
            self._renew_at = now + lease_s() / 3
            self._deadline = now + hard_limit_s()
            if self._thread is None or not self._thread.is_alive():
                # the first leaf of this process
                self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
                self._thread.start()
            elif self._renew_at < self._waiting_until:
                self._cond.notify()

    def release(self, claim: Claim) -> None:
        """Stop renewing `claim`'s lease (its attempt ended or was handed on)."""
        with self._cond:
            if self._claim is claim:
                self._claim = None

    def _due(self) -> Claim:
        """Wait until the held claim's lease is due for renewal; return that claim."""
        with self._cond:
            while True:
                claim = self._claim
                if claim is None:
                    self._waiting_until = math.inf
                    self._cond.wait()
                    continue
                now = time.monotonic()
                if now >= self._deadline:
                    self._claim = None
                    continue
                if now >= self._renew_at:
                    self._renew_at = now + lease_s() / 3
                    return claim
                self._waiting_until = self._renew_at
                self._cond.wait(self._renew_at - now)

    def _run(self) -> None:
        while True:
            claim = self._due()
            try:
                if not renew_lease(claim.node_id, claim.attempt):
                    self.release(claim)  # the attempt lost its leaf: nothing left to keep
            except DatabaseError:
                pass
            finally:
                # renewals are rare (a leaf longer than a third of the lease): no idle connection
                connection.close()


_lease_keeper = _LeaseKeeper()
os.register_at_fork(after_in_child=_lease_keeper.after_fork)


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
    _lease_keeper.hold(claim)
    try:
        with runners.soft_time_limit(soft_limit_s()):
            output = runners.run(claim)
    except WaitingForPerson:
        return None
    except LeafStopped as exc:
        why, cancelled = str(exc), exc.cancelled
        return _with_database_retry(
            lambda: stop_at_safe_point(claim, why=why, cancelled=cancelled),
            what="stopping a leaf",
        )
    except LeafTimeLimit as exc:
        error_class, error = ErrorClass.TIMEOUT, str(exc)
    except LeafError as exc:
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
                claim.node_id,
                claim.attempt,
                output,
                kind=claim.kind,
                keep=keep,
                worker=worker,
                leaf=claim.node,
            ),
            what="completing a leaf",
        )
    finally:
        _lease_keeper.release(claim)
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
                node, case = locked_attempt(claim.node_id, claim.attempt)
            except StaleResult:
                return Ended(node_id=claim.node_id, status="stale")
            if node.attempts >= max_deliveries():
                return apply_failure(
                    node, case, claim.attempt, error_class=ErrorClass.TRANSIENT, error=why
                )
            end_attempt(node, claim.attempt, LeafAttempt.Outcome.LOST, error=why)
            with audited(chain=case_chain(case.pk)) as audit:
                move_node(node, to=NodeStatus.READY, audit=audit, lease_until=None)
                audit.add(
                    NewEvent(
                        "execution.leaf.recovered",
                        None,
                        {"node": node.key, "attempt": claim.attempt, "why": why},
                    )
                )
            if not is_stopped():
                send_leaf(node.pk)
            return Ended(node_id=node.pk, status=NodeStatus.READY)

    return _with_database_retry(requeue, what="handing a leaf back")


def inline_s() -> float:
    """Return how long one task keeps running further leaves on its worker before it hands
    the rest back to the queue (other cases' messages wait behind it meanwhile)."""
    return min(leaf_setting("CASEHUB_LEAF_INLINE_S", 10), hard_limit_s())


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
            with leaf_run(
                case_id=claim.case_id, key=claim.key, attempt=claim.attempt, kind=claim.kind
            ) as run:
                ended = _run_claimed(claim, keep=keep, worker=worker)
                run.outcome = "waiting" if ended is None else ended.status
        except StaleResult as exc:
            outcomes.append(f"{claim.node_id} stale: {exc}")
            break
        if ended is None:
            outcomes.append(f"{claim.node_id} waits for a person")
            break
        outcomes.append(f"{claim.node_id} {ended.status}")
        claim = ended.claimed
    return outcomes
