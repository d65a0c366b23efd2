"""CaseHub's 1,000 no-op leaves alone, run after run, with each group of processes' CPU a leaf.

``python -m bench.execution_cpu [--runs N] [--pause S]`` (bench only; not part of ``make bench``)
sets up the execution module's database, broker and worker as `bench.bench_execution` does
(its functions), runs its 200-leaf DAG once to warm the worker, waits `--pause` seconds (a
worker's connections idle for 5 s close, and their prepared statements go with them: the
whole bench's no-op run starts on fresh connections, after the peers' runs), then runs the no-op
DAG `--runs` times. For each run it prints, a leaf: the wall (as the bench's makespan), the CPU of
the worker's pool processes, of its main process (Celery's consumer), of PostgreSQL (its live
processes and those that ended, which the postmaster reaped), of Redis, and the messages sent
(Redis LPUSH calls); then each column's median.

The wall of the no-op run is about the CPU of all these processes over the machine's two cores
(bench/README.md, "Where the no-op leaf goes"): a change to the hot path shows in the CPU a leaf,
which moves less from run to run than the wall. Compare two versions of the code by running this
from each checkout in turn, alternating.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_execution import (
    DEFAULT_REDIS,
    DEFAULT_URL,
    ROOT,
    _admin,
    _child,
    _env,
    _recreate,
    cpu_s,
    start_worker,
    stop_worker,
)

COLUMNS = ("wall", "pool", "main", "postgres", "redis", "all", "sends")


def _named(prefix: str) -> list[Any]:
    import psutil

    found = []
    for process in psutil.process_iter(["name"]):
        if (process.info["name"] or "").startswith(prefix):
            found.append(process)
    return found


def postgres_cpu() -> float:
    """Return the CPU seconds of PostgreSQL's processes: the live ones, and (the postmaster's
    children's times) those that ended, such as a closed connection's backend."""
    import psutil

    total = 0.0
    for process in _named("postgres"):
        try:
            times = process.cpu_times()
            total += times.user + times.system
            parent = process.parent()
            if parent is None or not (parent.name() or "").startswith("postgres"):
                total += times.children_user + times.children_system  # the postmaster
        except psutil.NoSuchProcess:
            continue
    return total


def _worker_cpu(pid: int) -> tuple[float, float]:
    """Return the CPU seconds of the worker's main process and of its pool processes."""
    import psutil

    main = psutil.Process(pid)
    return cpu_s([main]), cpu_s(main.children(recursive=True))


def _sends(client: Any) -> int:
    """Return the LPUSH calls Redis has served (a Celery message sent is one)."""
    return int(client.info("commandstats").get("cmdstat_lpush", {}).get("calls", 0))


def _snapshot(pid: int, client: Any) -> dict[str, float]:
    main, pool = _worker_cpu(pid)
    return {
        "main": main,
        "pool": pool,
        "postgres": postgres_cpu(),
        "redis": cpu_s(_named("redis-server")),
        "sends": float(_sends(client)),
    }


def measure(runs: int, pause_s: float) -> list[dict[str, float]]:
    """Run the no-op DAG `runs` times on a fresh worker; return each run's figures a leaf."""
    import redis

    admin_url, name = _admin(DEFAULT_URL)
    _recreate(admin_url, name)
    client = redis.Redis.from_url(DEFAULT_REDIS, socket_connect_timeout=5)
    client.flushdb()
    rows: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="casehub-bench-cpu-") as tmp:
            var_dir = Path(tmp)
            env = _env(DEFAULT_URL, DEFAULT_REDIS, var_dir)
            migrate = [sys.executable, "-m", "django", "migrate", "--verbosity", "0", "--no-input"]
            subprocess.run(migrate, cwd=ROOT, env=env, check=True)
            worker = start_worker(env, hostname="bench-cpu")
            try:
                _child(["casehub", "layered", str(worker.pid)], env, var_dir)
                time.sleep(pause_s)
                for _ in range(runs):
                    before = _snapshot(worker.pid, client)
                    run = _child(["casehub", "noop", str(worker.pid)], env, var_dir)
                    after = _snapshot(worker.pid, client)
                    if not (run["all_once"] and run["chain_ok"]):
                        raise RuntimeError(f"the no-op run went wrong: {run['problems']}")
                    leaves = int(run["leaves"])
                    row = {key: (after[key] - before[key]) / leaves for key in before}
                    for key in ("main", "pool", "postgres", "redis"):
                        row[key] *= 1000  # ms a leaf
                    row["wall"] = 1000 * float(run["makespan_s"]) / leaves
                    row["all"] = row["pool"] + row["main"] + row["postgres"] + row["redis"]
                    rows.append(row)
                    print("  " + _line(row), flush=True)
            finally:
                stop_worker(worker)
    finally:
        _recreate(admin_url, name, drop_only=True)
        client.flushdb()
    return rows


def _line(row: dict[str, float]) -> str:
    return " ".join(f"{key} {row[key]:.3f}" for key in COLUMNS)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--pause", type=float, default=7.0, help="seconds after the warm-up")
    args = parser.parse_args(argv)
    print(f"ms of CPU a leaf ({', '.join(COLUMNS)}; sends: messages a leaf)", flush=True)
    rows = measure(args.runs, args.pause)
    median = {key: statistics.median(row[key] for row in rows) for key in COLUMNS}
    print("median " + _line(median), flush=True)


if __name__ == "__main__":
    main()
