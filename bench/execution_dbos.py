"""The execution bench's DBOS peer: the same DAGs as DBOS workflows whose leaves are durable steps.

Each leaf is a ``@DBOS.step()`` (sleeping 50 ms or a no-op), so DBOS checkpoints its output in the
system database (``dbos.operation_outputs``) before the workflow goes on. Two ways to run a DAG:

- **In one workflow** (``dag_in_order``): one workflow calls the leaves one after the other in layer
  order (a topological order), in one process: DBOS's cheapest durable step (one checkpoint row a
  step, written before the next step starts). Used for the 1,000-leaf no-op DAG (ms per step).
- **On a queue, two worker processes** (``dag_on_queue``): the workflow is the coordinator; each
  leaf is a child workflow (``leaf_workflow``, which calls the step) enqueued on the queue
  ``bench-leaves`` once all its dependencies have finished (dependency-driven, ``DBOS.wait_first``
  on the running ones). Two worker processes (``python -m bench.bench_execution dbos-worker …``)
  launch DBOS on the same system database, listen to that queue only, ``worker_concurrency=1`` each
  and ``global_concurrency=2``: two leaves at a time, as CaseHub's two Celery pool processes. The
  coordinating process listens to no queue. DBOS polls: the queue and the waits poll every
  ``POLL_S`` (10 ms, against DBOS's 1 s default), the lowest latency it offers without a push.

Every process sets ``executor_id`` of its own (a worker's concurrency counts its executor's
workflows) and the same ``application_version`` (a worker dequeues only its version's workflows).
The system database is ``DATABASE_URL`` (the bench passes ``CASEHUB_BENCH_DBOS_DATABASE_URL``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSConfig, WorkflowHandle

from bench.execution_pack import layered_dag

QUEUE = "bench-leaves"
WORKERS = 2
POLL_S = 0.01
ROOT = Path(__file__).resolve().parent.parent


def _config(executor: str) -> DBOSConfig:
    return {
        "name": "casehub-bench",
        "system_database_url": os.environ["DATABASE_URL"],
        "executor_id": executor,
        "application_version": "casehub-bench",
        "log_level": "ERROR",
    }


@DBOS.step()
def leaf(key: str, ms: int) -> str:
    """Sleep the leaf's milliseconds (nothing for 0) and return its key: one durable step."""
    if ms:
        time.sleep(ms / 1000)
    return key


@DBOS.workflow()
def leaf_workflow(key: str, ms: int) -> str:
    """Run one leaf as a workflow of its own (what the queue runs)."""
    return leaf(key, ms)


@DBOS.workflow()
def dag_in_order(shape: dict[str, int]) -> list[str]:
    """Run every leaf of the DAG as a step of this workflow, in layer order; return the keys."""
    return [leaf(key, shape["sleep_ms"]) for key in layered_dag(shape)]


@DBOS.workflow()
def dag_on_queue(shape: dict[str, int]) -> list[str]:
    """Run the DAG on the queue, each leaf once its dependencies are done; return the keys run."""
    queue = DBOS.retrieve_queue(QUEUE)
    assert queue is not None
    dag = layered_dag(shape)
    waiting = {key: set(deps) for key, deps in dag.items()}
    dependents: dict[str, list[str]] = {key: [] for key in dag}
    for key, deps in dag.items():
        for dep in deps:
            dependents[dep].append(key)
    running: dict[str, WorkflowHandle[str]] = {}
    done: list[str] = []

    def start(keys: list[str]) -> None:
        for key in keys:
            handle = queue.enqueue(leaf_workflow, key, shape["sleep_ms"])
            running[handle.workflow_id] = handle

    start([key for key, deps in waiting.items() if not deps])
    while running:
        finished = DBOS.wait_first(list(running.values()), polling_interval_sec=POLL_S)
        key = running.pop(finished.workflow_id).get_result(polling_interval_sec=POLL_S)
        done.append(key)
        released = []
        for child in dependents[key]:
            waiting[child].discard(key)
            if not waiting[child]:
                released.append(child)
        start(released)
    return done


def _counts() -> dict[str, int]:
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], connect_timeout=5) as conn:
        steps = conn.execute("SELECT count(*) FROM dbos.operation_outputs").fetchone()
        leaves = conn.execute(
            "SELECT count(*) FROM dbos.operation_outputs WHERE function_name LIKE %s",
            ("%leaf",),
        ).fetchone()
        workflows = conn.execute("SELECT count(*) FROM dbos.workflow_status").fetchone()
    assert steps is not None and leaves is not None and workflows is not None
    return {"steps": steps[0], "leaf_steps": leaves[0], "workflows": workflows[0]}


def _measure(workflow: Any, shape: dict[str, int]) -> dict[str, Any]:
    dag = layered_dag(shape)
    before = _counts()
    started, cpu_before = time.monotonic(), time.process_time()
    keys: list[str] = DBOS.start_workflow(workflow, shape).get_result(polling_interval_sec=POLL_S)
    makespan, cpu = time.monotonic() - started, time.process_time() - cpu_before
    after = _counts()
    ran = Counter(keys)
    problems = [f"{k}: ran {ran[k]} times" for k in dag if ran[k] != 1]
    leaf_steps = after["leaf_steps"] - before["leaf_steps"]
    if leaf_steps != len(dag):
        problems.append(f"{leaf_steps} leaf step checkpoints for {len(dag)} leaves")
    return {
        "leaves": len(dag),
        "makespan_s": makespan,
        "all_once": not problems,
        "problems": problems[:20],
        "checkpoints": after["steps"] - before["steps"],
        "workflows": after["workflows"] - before["workflows"],
        "cpu_s": cpu,
    }


def _start_workers() -> list[subprocess.Popen[str]]:
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.bench_execution", "dbos-worker", str(i)],
            cwd=ROOT,
            env=os.environ.copy(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(WORKERS)
    ]
    for worker in workers:
        assert worker.stdout is not None
        line = worker.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"a DBOS worker did not start: {line!r}")
    return workers


def _stop(workers: list[subprocess.Popen[str]]) -> None:
    for worker in workers:
        worker.terminate()
    for worker in workers:
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def run(shape: dict[str, int], *, in_order: bool) -> dict[str, Any]:
    """Run a DAG on the queue of two worker processes (and in one workflow if `in_order`)."""
    DBOS(config=_config("bench-coordinator"))
    DBOS.listen_queues([])
    DBOS.launch()
    try:
        DBOS.register_queue(
            QUEUE,
            worker_concurrency=1,
            global_concurrency=WORKERS,
            polling_interval_sec=POLL_S,
            on_conflict="always_update",
        )
        result: dict[str, Any] = {}
        if in_order:
            result["in_order"] = _measure(dag_in_order, shape)
        workers = _start_workers()
        try:
            result["queue"] = _measure(dag_on_queue, shape)
        finally:
            _stop(workers)
    finally:
        DBOS.destroy()
    return result


def worker(index: int) -> None:
    """Serve the leaf queue until terminated; print `ready` once its queue thread runs."""
    DBOS(config=_config(f"bench-worker-{index}"))
    DBOS.listen_queues([QUEUE])
    DBOS.launch()
    deadline = time.monotonic() + 30
    name = f"queue-worker-{QUEUE}"
    while not any(t.name == name and t.is_alive() for t in threading.enumerate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"DBOS worker {index}: no thread for the queue {QUEUE!r}")
        time.sleep(0.05)
    print("ready", flush=True)
    threading.Event().wait()
