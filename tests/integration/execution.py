"""Helpers of the execution fault tests: the scripted pack, real workers, waiting for a case."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from execution import actions as execution
from oversight.actions.gates import DecisionInput, decide_gate
from oversight.models import Gate, GateKind, GateStatus
from planning.actions import materialise_plan, submit_case
from planning.catalogue import sync_packs
from planning.models import Case, PlanNode
from tests.conftest import WorkerProcess, running_worker
from tests.fakes.execution_pack import SLUG, effect_counts

PACK_PATH = "tests.fakes.execution_pack.PACK"
# Short leases so that a lost worker is noticed in seconds; limits the tests can pass.
TIMINGS = {
    "CASEHUB_LEAF_LEASE_S": 2,
    "CASEHUB_LEAF_SOFT_LIMIT_S": 6,
    "CASEHUB_LEAF_HARD_LIMIT_S": 16,
    "CASEHUB_LEAF_RETRY_BASE_S": 0,
    "CASEHUB_LEAF_RETRY_MAX_S": 1,
    "CASEHUB_LEAF_REDISPATCH_AFTER_S": 3,
}


class Harness:
    """The scripted pack registered here and in the workers; effects under a temporary dir."""

    def __init__(self, settings: Any, effects: Path) -> None:
        self.settings = settings
        self.effects = effects
        from celery import current_app

        # Messages an earlier test left name rows that are gone: nothing of theirs may run here.
        current_app.control.purge()
        settings.CASEHUB_EXTRA_PACKS = [PACK_PATH]
        for name, value in TIMINGS.items():
            setattr(settings, name, value)
        sync_packs()

    def env(self, **extra: object) -> dict[str, str]:
        return {
            "CASEHUB_EXTRA_PACKS": PACK_PATH,
            "CASEHUB_TEST_EFFECTS_DIR": str(self.effects),
            "OPENAI_BASE_URL": "",
            "OPENAI_API_KEY": "",
            **{name: str(value) for name, value in TIMINGS.items()},
            **{name: str(value) for name, value in extra.items()},
        }

    def worker(self, *, concurrency: int = 2, pool: str = "prefork", **env: object) -> Any:
        # Queued messages are kept: the database decides what they may still do.
        return running_worker(self.env(**env), concurrency=concurrency, pool=pool, purge=False)

    def case(self, submitter: Any, leaves: list[dict[str, Any]]) -> Case:
        """Submit and plan a scripted case (its plan gate pending)."""
        case = submit_case(
            submitter=submitter,
            title="Scripted execution",
            goal="Run the script",
            domain=SLUG,
            strategy="static",
            inputs={"leaves": leaves},
        )
        materialise_plan(case.pk)
        case.refresh_from_db()
        assert case.status == "awaiting_approval", case.error
        return case

    def effects_of(self, case: Case, key: str) -> tuple[int, int]:
        return effect_counts(self.effects, f"casehub:case-{case.pk}:leaf-{key}")


def approve_plan(case: Case, officer: Any) -> None:
    gate = Gate.objects.get(case=case, kind=GateKind.PLAN, status=GateStatus.PENDING)
    decide_gate(gate_id=gate.pk, user=officer, decision=DecisionInput(decision="approve"))


def leaf(case: Case, key: str) -> PlanNode:
    case.refresh_from_db()
    return PlanNode.objects.get(version_id=case.current_version_id, key=key)


def wait_until(
    what: str,
    check: Callable[[], bool],
    *,
    timeout: float = 60,
    reconcile: bool = True,
    workers: tuple[WorkerProcess, ...] = (),
) -> None:
    """Poll `check` (running the reconciler like beat would) until it holds; fail after timeout."""
    deadline = time.monotonic() + timeout
    reconciled = 0.0
    while not check():
        # Like beat, at most once a second (each pass may send leaves again).
        if reconcile and time.monotonic() - reconciled >= 1.0:
            execution.reconcile_execution()
            reconciled = time.monotonic()
        if time.monotonic() > deadline:
            state = list(
                PlanNode.objects.filter(kind="leaf")
                .order_by("pk")
                .values_list("key", "status", "attempts", "enqueued_at", "lease_until")
            )
            logs = "\n".join(w.log()[-3000:] for w in workers)
            pytest.fail(f"timed out waiting for {what}\nleaves: {state}\n{logs}")
        time.sleep(0.2)


def kill(worker: WorkerProcess, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to the worker's whole process group (main process and pool children)."""
    assert worker.process is not None
    os.killpg(worker.process.pid, sig)
    if sig == signal.SIGKILL:
        worker.process.wait(timeout=10)


@contextmanager
def stopped(worker: WorkerProcess) -> Iterator[None]:
    """Freeze a worker (SIGSTOP) for the block, then let it go on (SIGCONT)."""
    kill(worker, signal.SIGSTOP)
    try:
        yield
    finally:
        kill(worker, signal.SIGCONT)
