"""The worker's loop: claim, run under a lease and time limits, end, run the next."""

from __future__ import annotations

import functools
import logging
import math
import os
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

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
from observability.runs import LeafRunAhead, leaf_run
from planning.models import NodeStatus
from planning.transitions import move_node

logger = logging.getLogger(__name__)

# The worker's loop ------------------------------------------------------------------------------


class _LeaseKeeper:
    """Renew the leases of the attempts this process holds, every third of the lease, until the
    hard time limit; past it a lease is left to run out and the reconciler times the leaf out.

    The process holds the attempt it runs and, while it runs, the one it claimed to run next
    (`_run_overlapped`). One thread per worker process, started with its first leaf and kept: a
    thread started for each leaf cost the worker about 5 % of its busy time on short leaves
    (py-spy, `python -m bench execution`: `Thread.start` waits for the new thread to be
    scheduled). Between leaves the thread sleeps on; it renews only a claim still held when its
    time comes.
    """

    def __init__(self) -> None:
        self.after_fork()

    def after_fork(self) -> None:
        """Start afresh (in a forked process: it inherits no thread, and maybe a lock one held)."""
        self._cond = threading.Condition()
        # the claims held, by (leaf, attempt): the claim, when to renew it, when to stop
        self._claims: dict[tuple[int, int], tuple[Claim, float, float]] = {}
        # when the thread wakes by itself (inf: only when woken): an earlier renewal must wake it
        self._waiting_until = math.inf
        self._thread: threading.Thread | None = None

    def hold(self, claim: Claim) -> None:
        """Keep `claim`'s lease from now on, until the hard time limit from now."""
        with self._cond:
            now = time.monotonic()
            renew_at = now + lease_s() / 3
            self._claims[claim.node_id, claim.attempt] = (claim, renew_at, now + hard_limit_s())
            if self._thread is None or not self._thread.is_alive():
                # the first leaf of this process
                self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
                self._thread.start()
            elif renew_at < self._waiting_until:
                self._cond.notify()

    def release(self, claim: Claim) -> None:
        """Stop renewing `claim`'s lease (its attempt ended or was handed on)."""
        with self._cond:
            held = self._claims.get((claim.node_id, claim.attempt))
            if held is not None and held[0] is claim:
                del self._claims[claim.node_id, claim.attempt]

    def _due(self) -> list[Claim]:
        """Wait until a held claim's lease is due for renewal; return the claims that are."""
        with self._cond:
            while True:
                now = time.monotonic()
                due: list[Claim] = []
                wake = math.inf
                for key, (claim, renew_at, deadline) in list(self._claims.items()):
                    if now >= deadline:
                        del self._claims[key]
                    elif now >= renew_at:
                        self._claims[key] = (claim, now + lease_s() / 3, deadline)
                        due.append(claim)
                    else:
                        wake = min(wake, renew_at)
                if due:
                    return due
                self._waiting_until = wake
                self._cond.wait(None if wake == math.inf else wake - now)

    def _run(self) -> None:
        while True:
            for claim in self._due():
                try:
                    if not renew_lease(claim.node_id, claim.attempt):
                        self.release(claim)  # the attempt lost its leaf: nothing left to keep
                except DatabaseError:
                    pass
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


@dataclass(frozen=True, slots=True)
class _Ran:
    """How a leaf's run came out: its output (it succeeded), or how its attempt ends (`end`:
    recorded when called; None for a step handed to a person)."""

    output: Mapping[str, Any] | None = None
    end: Callable[[], Ended | None] | None = None


def _run(claim: Claim) -> _Ran:
    """Run the claimed leaf under its lease and soft time limit; return how it came out."""
    _lease_keeper.hold(claim)
    try:
        with runners.soft_time_limit(soft_limit_s()):
            output = runners.run(claim)
    except WaitingForPerson:
        _lease_keeper.release(claim)
        return _Ran(end=lambda: None)
    except LeafStopped as exc:
        why, cancelled = str(exc), exc.cancelled
        return _ending(
            claim,
            lambda: stop_at_safe_point(claim, why=why, cancelled=cancelled),
            what="stopping a leaf",
        )
    except LeafTimeLimit as exc:
        error_class, error = ErrorClass.TIMEOUT, str(exc)
    except LeafError as exc:
        if isinstance(exc.__cause__, OperationalError | InterfaceError):
            lost = exc.__cause__
            return _Ran(end=lambda: _released(claim, lambda: _lost_database(claim, lost)))
        error_class, error = exc.error_class, str(exc)
    except (OperationalError, InterfaceError) as exc:
        caught = exc
        return _Ran(end=lambda: _released(claim, lambda: _lost_database(claim, caught)))
    except Exception as exc:
        logger.exception("leaf %s failed", claim.key)
        error_class, error = ErrorClass.TOOL_FAILURE, f"{type(exc).__name__}: {exc}"
    except BaseException:
        _lease_keeper.release(claim)  # the process is leaving: the lease runs out
        raise
    else:
        return _Ran(output=output)
    return _ending(
        claim,
        lambda: fail_leaf(claim.node_id, claim.attempt, error_class=error_class, error=error),
        what="failing a leaf",
    )


def _ending(claim: Claim, action: Callable[[], Ended], *, what: str) -> _Ran:
    return _Ran(end=lambda: _released(claim, lambda: _with_database_retry(action, what=what)))


def _released[T](claim: Claim, action: Callable[[], T]) -> T:
    """Run `action` (the attempt's end), then stop keeping the claim's lease."""
    try:
        return action()
    finally:
        _lease_keeper.release(claim)


def _complete(claim: Claim, output: Mapping[str, Any], *, keep: int, worker: str) -> Ended:
    """Record the leaf's success (`complete_leaf`), claiming up to `keep` leaves to run next."""
    return _released(
        claim,
        lambda: _with_database_retry(
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
        ),
    )


def _run_claimed(claim: Claim, *, keep: int = 0, worker: str = "") -> Ended | None:
    ran = _run(claim)
    if ran.end is not None:
        return ran.end()
    assert ran.output is not None
    return _complete(claim, ran.output, keep=keep, worker=worker)


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
    if claim is not None and overlapping():
        return _run_overlapped(claim, started=started, worker=worker)
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


# Running the next leaf while the last one's end is recorded ------------------------------------


def overlap_min_s() -> float:
    """Return how long a leaf must have run for its success to be recorded on the completer
    thread while the next leaf runs; a shorter one's is recorded on the worker's own thread."""
    return leaf_setting("CASEHUB_LEAF_OVERLAP_MIN_MS", 2) / 1000


def overlapping() -> bool:
    """Tell whether this worker records a leaf's success on its completer thread while it runs
    the next leaf: on PostgreSQL, outside a transaction (the completer's connection must see
    what this one committed), unless `CASEHUB_LEAF_OVERLAP` is 0."""
    return (
        connection.vendor == "postgresql"
        and not connection.in_atomic_block
        and bool(leaf_setting("CASEHUB_LEAF_OVERLAP", 1))
    )


class _Completer:
    """A thread that records the successes of one worker thread's leaves (`complete_leaf`), one
    at a time, in the order they come, on a database connection of its own.

    Its connection is closed when no success has come for `IDLE_S` seconds, as a task's
    connection would be.
    """

    IDLE_S = 5.0

    def __init__(self) -> None:
        self.after_fork()

    def after_fork(self) -> None:
        """Start afresh (in a forked process: it inherits no thread)."""
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Ended], Future[Ended]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], Ended]) -> Future[Ended]:
        """Run `job` on the completer thread after the jobs before it; return its future."""
        future: Future[Ended] = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="completer", daemon=True)
                self._thread.start()
            self._jobs.put((job, future))
        return future

    def stop(self) -> None:
        """Let the thread finish its jobs, close its connection and end (tests, shutdown)."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None and thread.is_alive():
                self._jobs.put(None)
        if thread is not None:
            thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            try:
                item = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                connection.close()  # idle: no connection kept open for nothing
                continue
            if item is None:
                connection.close()
                return
            job, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = job()
            except BaseException as exc:  # handed to the worker, which raises it
                future.set_exception(exc)
            else:
                future.set_result(result)


# One completer for each thread that runs leaves: a prefork worker process has one, a worker on
# the threads pool one per pool thread (their completions do not wait for each other).
_completers = threading.local()
_every_completer: weakref.WeakSet[_Completer] = weakref.WeakSet()


def _completer() -> _Completer:
    completer: _Completer | None = getattr(_completers, "completer", None)
    if completer is None:
        completer = _completers.completer = _Completer()
        _every_completer.add(completer)
    return completer


def _completers_after_fork() -> None:
    for completer in list(_every_completer):
        completer.after_fork()


os.register_at_fork(after_in_child=_completers_after_fork)


def stop_completer() -> None:
    """End this process's completer threads, closing their database connections."""
    for completer in list(_every_completer):
        completer.stop()


type _Pending = tuple[Claim, LeafRunAhead, Future[Ended]]


def _run_overlapped(first: Claim, *, started: float, worker: str) -> list[str]:
    """`execute_leaf`'s loop, each leaf's success recorded while the next leaf runs.

    A completion claims the leaf this worker runs after the one running now (`keep`: up to two
    in hand, the first completion claims two), so the next leaf can start as soon as a leaf
    ends: its claim committed already, in the completion before. The success of the leaf that
    ended goes to the completer thread, and the worker waits for it before it hands over the
    next one (one completion at a time, in order). A failure, a stop or a step handed to a
    person is recorded here, as in the plain loop, after the completion in flight, and so is the
    success of a leaf that ran for less than `overlap_min_s` (it claims only the next leaf).
    """
    outcomes: list[str] = []
    claims: deque[Claim] = deque([first])
    pending: _Pending | None = None
    try:
        while claims or pending is not None:
            if not claims:
                assert pending is not None
                done, pending = pending, None
                claims.extend(_joined(done, outcomes))
                continue
            claim = claims.popleft()
            timing = LeafRunAhead(
                case_id=claim.case_id, key=claim.key, attempt=claim.attempt, kind=claim.kind
            )
            run_started = time.monotonic()
            try:
                with timing.running():
                    ran = _run(claim)
            except BaseException:
                timing.end("error")
                raise
            ran_s = time.monotonic() - run_started
            if pending is not None:
                done, pending = pending, None
                claims.extend(_joined(done, outcomes))
            if ran.output is None:
                assert ran.end is not None
                claims.extend(_ended_here(claim, timing, ran.end, outcomes))
                continue
            inline = time.monotonic() - started < inline_s()
            output = ran.output
            if ran_s < overlap_min_s():
                # A leaf this short would not hide the completion, and handing it to the
                # completer thread costs more than it saves: its success is recorded here, and
                # it claims the next leaf unless one is in hand (the plain loop's `keep`).
                keep = max(0, 1 - len(claims)) if inline else 0
                end = functools.partial(_complete, claim, output, keep=keep, worker=worker)
                claims.extend(_ended_here(claim, timing, end, outcomes))
                continue
            keep = max(0, 2 - len(claims)) if inline else 0
            pending = (
                claim,
                timing,
                _completer().submit(
                    functools.partial(_complete, claim, output, keep=keep, worker=worker)
                ),
            )
    finally:
        if pending is not None:  # leaving on an error: the completion in flight ends first
            try:
                _joined(pending, outcomes)
            except BaseException:
                logger.exception("completing leaf %s failed", pending[0].key)
    return outcomes


def _joined(pending: _Pending, outcomes: list[str]) -> list[Claim]:
    """Wait for a completion on the completer thread; return the leaves it claimed."""
    claim, timing, future = pending
    return _recorded(claim, timing, future.result, outcomes)


def _ended_here(
    claim: Claim, timing: LeafRunAhead, end: Callable[[], Ended | None], outcomes: list[str]
) -> list[Claim]:
    """Record, on this thread, an attempt that did not succeed; return what it claimed."""
    return _recorded(claim, timing, end, outcomes)


def _recorded(
    claim: Claim, timing: LeafRunAhead, end: Callable[[], Ended | None], outcomes: list[str]
) -> list[Claim]:
    """Take the attempt's end (`end()`: None for a step handed to a person), note it in
    `outcomes` and the leaf's timing; return the leaves it claimed for this worker."""
    try:
        ended = end()
    except StaleResult as exc:
        timing.end("error")
        outcomes.append(f"{claim.node_id} stale: {exc}")
        return []
    except BaseException:
        timing.end("error")
        raise
    if ended is None:
        timing.end("waiting")
        outcomes.append(f"{claim.node_id} waits for a person")
        return []
    timing.end(ended.status)
    outcomes.append(f"{claim.node_id} {ended.status}")
    return [c for c in (ended.claimed, ended.ahead) if c is not None]
