"""Execution against LangGraph and DBOS on the same DAGs, in one run (DESIGN §9, RELIABILITY P2).

CaseHub: a fresh PostgreSQL database (``CASEHUB_BENCH_EXECUTION_DATABASE_URL``, default
``casehub_bench_execution``), migrated; Redis as the broker (``CASEHUB_BENCH_EXECUTION_REDIS_URL``,
default db 14, flushed at the start and the end); one Celery worker, ``--pool prefork
--concurrency 2`` (two worker processes), ``CONN_MAX_AGE=60`` as `.env.example` deploys it; no
beat (the bench calls the reconciler itself only when a case stops moving, and reports it). The
bench pack (`bench.execution_pack`) plans each case statically; an officer approves the plan
gate; the case runs on the workers until it is `completed`. Makespan = the last leaf's
`finished_at` minus the plan gate's `decided_at` (database clock, the approval's transaction).

LangGraph: a `StateGraph` whose nodes are the same leaves (sleeping / no-op), an edge from every
dependency (a node waits for all of them), `PostgresSaver` on its own database
(``CASEHUB_BENCH_LANGGRAPH_DATABASE_URL``, default ``casehub_bench_langgraph``),
``durability="sync"`` (each superstep's checkpoint is written before the next starts: its most
durable mode) and ``max_concurrency=2`` in the run config (two nodes at a time, as two worker
slots), then again with its default durability (``"async"``: a superstep's checkpoint is written
while the next one runs), so the table shows what per-step durability costs it. It runs in a
process of its own beside the idle CaseHub worker. Its makespan is the wall-clock of `invoke`.

DBOS (`bench.execution_dbos`): its system database of its own
(``CASEHUB_BENCH_DBOS_DATABASE_URL``, default ``casehub_bench_dbos``); each leaf a
``@DBOS.step()``, checkpointed one by one. The 1,000 no-op leaves run once as the steps of one
workflow in layer order (one process: DBOS's cheapest durable step, one checkpoint row each), and
once on its queue; the 200-leaf DAG runs on the queue only. On the queue each leaf is a child
workflow, enqueued once its dependencies are done, run by two worker processes (``worker_concurrency
1`` each, ``global_concurrency 2``: two leaves at a time); DBOS polls its queue and the waits every
10 ms. Its figures are the wall-clock of the workflow and the checkpoint rows it wrote
(``dbos.operation_outputs``). The target compares CaseHub's ms per leaf with DBOS's ms per step in
one workflow.

The DAGs: 200 leaves of 50 ms in 10 layers of 20 (each leaf after 3 leaves of the layer before:
critical path 10 x 50 ms = 0.5 s; total work ÷ 2 slots = 5 s: the bound is 5 s); and 1,000 no-op
leaves in 50 layers of 20, the same construction (wide enough for both slots of both systems,
deep enough that each system persists 50 rounds of completions and releases). The worker's RSS
(its main process and pool children, psutil) is sampled through the 1,000-leaf run, which comes
after the 200-leaf one (imports and caches are warm).

``CASEHUB_BENCH_PROFILE=1`` also times, in the workers, each leaf's claim / run / complete / send
and counts its SQL queries (`bench.execution_profile`), and prints the breakdown.
"""

from __future__ import annotations

import importlib.util
import json
import operator
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from bench.bench_audit import _admin, _recreate
from bench.execution_pack import PATH as PACK_PATH
from bench.execution_pack import SLUG, layered_dag

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/casehub_bench_execution"
DEFAULT_LANGGRAPH_URL = "postgresql://postgres@127.0.0.1:5432/casehub_bench_langgraph"
DEFAULT_DBOS_URL = "postgresql://postgres@127.0.0.1:5432/casehub_bench_dbos"
DEFAULT_REDIS = "redis://127.0.0.1:6379/14"
SLOTS = 2
PASSWORD = "bench-only-password-1"  # noqa: S105 (a throwaway account in a throwaway database)
# The two DAGs (the pack's input schema): the 200-leaf ratio run and the 1,000-leaf overhead run.
LAYERED = {"layers": 10, "width": 20, "fan_in": 3, "sleep_ms": 50}
NOOP = {"layers": 50, "width": 20, "fan_in": 3, "sleep_ms": 0}
SHAPES = {"layered": LAYERED, "noop": NOOP}
CASE_TIMEOUT_S = float(os.environ.get("CASEHUB_BENCH_CASE_TIMEOUT_S", "600"))
# A case that shows no progress for this long gets a reconciler pass (lost messages).
STALL_S = 10.0
# Worker RSS growth over the 1,000-leaf run that still counts as flat.
RSS_FLAT_MB = 20.0

TARGETS = {
    # DESIGN §9: the makespan ≤ 1.10 times the bound, and below LangGraph and DBOS on the same DAG
    "execution.layered.ratio": ("<=", 1.10),
    "execution.layered.ratio_vs_langgraph": ("<=", 1.0),
    "execution.layered.ratio_vs_dbos": ("<=", 1.0),
    # a durable step: ≤ 2 ms and ≤ DBOS's checkpointed step (LangGraph's per-node figure is
    # printed beside them; it checkpoints once per superstep, so it is no target)
    "execution.noop.ms_per_leaf": ("<=", 2.0),
    "execution.noop.ms_per_leaf_vs_dbos": ("<=", 1.0),
    "execution.p2.all_once": (">=", 1.0),
    "execution.p2.chain_ok": (">=", 1.0),
    "execution.p2.queue_left": ("<=", 0.0),
    "execution.p2.rss_growth_mb": ("<=", RSS_FLAT_MB),
}


def bound_s(shape: dict[str, int]) -> float:
    """Return max(critical path, total work ÷ worker slots) of a layered shape, in seconds."""
    leaves = shape["layers"] * shape["width"]
    sleep = shape["sleep_ms"] / 1000
    return max(shape["layers"] * sleep, leaves * sleep / SLOTS)


def _env(url: str, redis_url: str, var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CASEHUB_DB_APP_ROLE", "CASEHUB_DEMO")}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="casehub.settings",
        CASEHUB_VAR_DIR=str(var_dir),
        SECRET_KEY=os.environ.get("SECRET_KEY", "bench-only-not-a-secret"),
        CELERY_BROKER_URL=redis_url,
        CELERY_RESULT_BACKEND=redis_url,
        CONN_MAX_AGE="60",
        CASEHUB_EXTRA_PACKS=PACK_PATH,
        CASEHUB_PLAN_MAX_LEAVES="1000",
        CASEHUB_PLAN_MAX_FANOUT="50",
        OPENAI_BASE_URL="",
        OPENAI_API_KEY="",
        PYTHONPATH=str(ROOT),
    )
    return env


def _redis_flush(redis_url: str) -> None:
    import redis

    redis.Redis.from_url(redis_url, socket_connect_timeout=5).flushdb()


def run() -> dict[str, float]:
    """Run both systems on both DAGs; return the figures (ratios, ms per leaf, checks, RSS)."""
    url = os.environ.get("CASEHUB_BENCH_EXECUTION_DATABASE_URL", DEFAULT_URL)
    lg_url = os.environ.get("CASEHUB_BENCH_LANGGRAPH_DATABASE_URL", DEFAULT_LANGGRAPH_URL)
    redis_url = os.environ.get("CASEHUB_BENCH_EXECUTION_REDIS_URL", DEFAULT_REDIS)
    admin_url, name = _admin(url)
    dbos_url = os.environ.get("CASEHUB_BENCH_DBOS_DATABASE_URL", DEFAULT_DBOS_URL)
    lg_admin, lg_name = _admin(lg_url)
    dbos_admin, dbos_name = _admin(dbos_url)
    if any(importlib.util.find_spec(m) is None for m in ("langgraph", "psutil", "dbos")):
        print("  SKIPPED bench_execution: install the bench extra (.[bench]).", flush=True)
        return {}
    try:
        _recreate(admin_url, name)
        _recreate(lg_admin, lg_name)
        _recreate(dbos_admin, dbos_name)
        _redis_flush(redis_url)
    except Exception as exc:  # nothing to measure on
        print(f"  SKIPPED bench_execution: PostgreSQL or Redis unreachable ({exc}).", flush=True)
        return {}
    try:
        with tempfile.TemporaryDirectory(prefix="casehub-bench-execution-") as tmp:
            var_dir = Path(tmp)
            env = _env(url, redis_url, var_dir)
            subprocess.run(
                [sys.executable, "-m", "django", "migrate", "--verbosity", "0", "--no-input"],
                cwd=ROOT,
                env=env,
                check=True,
            )
            worker_cmd = [sys.executable, "-m", "celery", "-A", "casehub", "worker"]
            if os.environ.get("CASEHUB_BENCH_PROFILE") == "1":
                worker_cmd = [sys.executable, "-m", "bench.execution_profile", str(var_dir)]
            worker = start_worker(env, hostname="bench-execution", command=worker_cmd)
            ours: dict[str, Any] = {}
            theirs: dict[str, Any] = {}
            dbos: dict[str, Any] = {}
            lg_env = {**env, "DATABASE_URL": lg_url}
            dbos_env = {**env, "DATABASE_URL": dbos_url}
            try:
                # Each shape on CaseHub, then at once on LangGraph and on DBOS: all three see the
                # same machine (DBOS after the Celery worker would leave it idle: it stays up).
                for shape in SHAPES:
                    ours[shape] = _child(["casehub", shape, str(worker.pid)], env, var_dir)
                    theirs[shape] = _child(["langgraph", shape], lg_env, var_dir)
                    dbos[shape] = _child(["dbos", shape], dbos_env, var_dir)
                queue_left = _queue_length(redis_url)
            finally:
                stop_worker(worker)
            profile = _read_profile(var_dir)
            stats = _read_cprofile(var_dir)
    finally:
        if os.environ.get("CASEHUB_BENCH_KEEP_DB") != "1":
            _recreate(admin_url, name, drop_only=True)
            _recreate(lg_admin, lg_name, drop_only=True)
            _recreate(dbos_admin, dbos_name, drop_only=True)
        _redis_flush(redis_url)
    figures = _figures(ours, theirs, dbos, queue_left)
    _print_comparison(ours, theirs, dbos, figures)
    if profile:
        _print_profile(profile)
    if stats:
        print(stats, flush=True)
    return figures


def start_worker(
    env: dict[str, str], *, hostname: str, command: list[str] | None = None
) -> subprocess.Popen[bytes]:
    """Start the bench's Celery worker: prefork, `SLOTS` processes (`command`: what runs it)."""
    return subprocess.Popen(
        [
            *(command or [sys.executable, "-m", "celery", "-A", "casehub", "worker"]),
            *("--pool", "prefork", "--concurrency", str(SLOTS)),
            *("--loglevel", "WARNING", "--hostname", f"{hostname}@%h"),
        ],
        cwd=ROOT,
        env=env,
    )


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """Stop the worker (warm shutdown; killed after 30 s)."""
    worker.terminate()
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _child(args: list[str], env: dict[str, str], var_dir: Path) -> dict[str, Any]:
    out = var_dir / f"{'-'.join(args[:2])}.json"
    subprocess.run(
        [sys.executable, "-m", "bench.bench_execution", *args[:2], str(out), *args[2:]],
        cwd=ROOT,
        env=env,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _queue_length(redis_url: str) -> int:
    import redis

    client = redis.Redis.from_url(redis_url, socket_connect_timeout=5)
    return int(client.llen("celery"))


def _ms_per(run: dict[str, Any]) -> float:
    return 1000 * float(run["makespan_s"]) / int(run["leaves"])


def _figures(
    ours: dict[str, Any], theirs: dict[str, Any], dbos: dict[str, Any], queue_left: int
) -> dict[str, float]:
    layered, noop = ours["layered"], ours["noop"]
    lg_layered, lg_noop = theirs["layered"]["sync"], theirs["noop"]["sync"]
    lgd_layered, lgd_noop = theirs["layered"]["default"], theirs["noop"]["default"]
    db_layered = dbos["layered"]["queue"]
    db_steps, db_queue = dbos["noop"]["in_order"], dbos["noop"]["queue"]
    bound = bound_s(LAYERED)
    ratio = layered["makespan_s"] / bound
    lg_ratio = lg_layered["makespan_s"] / bound
    db_ratio = db_layered["makespan_s"] / bound
    ms_per = _ms_per(noop)
    lg_ms_per = _ms_per(lg_noop)
    db_ms_per = _ms_per(db_steps)
    rss = noop["rss_mb"]
    peers = (lg_layered, lg_noop, lgd_layered, lgd_noop, db_layered, db_steps, db_queue)
    both_once = all(run["all_once"] for run in (layered, noop, *peers))
    return {
        "execution.layered.bound_s": round(bound, 3),
        "execution.layered.makespan_s": round(layered["makespan_s"], 3),
        "execution.layered.wall_s": round(layered["wall_s"], 3),
        "execution.layered.ratio": round(ratio, 4),
        "execution.layered.langgraph_makespan_s": round(lg_layered["makespan_s"], 3),
        "execution.layered.langgraph_ratio": round(lg_ratio, 4),
        "execution.layered.ratio_vs_langgraph": round(ratio / lg_ratio, 4),
        "execution.layered.langgraph_default_makespan_s": round(lgd_layered["makespan_s"], 3),
        "execution.layered.langgraph_default_ratio": round(lgd_layered["makespan_s"] / bound, 4),
        "execution.layered.dbos_makespan_s": round(db_layered["makespan_s"], 3),
        "execution.layered.dbos_ratio": round(db_ratio, 4),
        "execution.layered.ratio_vs_dbos": round(ratio / db_ratio, 4),
        "execution.noop.makespan_s": round(noop["makespan_s"], 3),
        "execution.noop.ms_per_leaf": round(ms_per, 3),
        "execution.noop.langgraph_ms_per_node": round(lg_ms_per, 3),
        "execution.noop.ms_per_leaf_vs_langgraph": round(ms_per / lg_ms_per, 4),
        "execution.noop.langgraph_default_ms_per_node": round(_ms_per(lgd_noop), 3),
        "execution.noop.langgraph_default_checkpoints": float(lgd_noop["checkpoints"]),
        "execution.noop.dbos_ms_per_step": round(db_ms_per, 3),
        "execution.noop.dbos_checkpoints": float(db_steps["checkpoints"]),
        "execution.noop.dbos_queue_ms_per_leaf": round(_ms_per(db_queue), 3),
        "execution.noop.dbos_queue_checkpoints": float(db_queue["checkpoints"]),
        "execution.noop.dbos_queue_workflows": float(db_queue["workflows"]),
        "execution.noop.ms_per_leaf_vs_dbos": round(ms_per / db_ms_per, 4),
        "execution.noop.events_per_leaf": round(noop["events"] / noop["leaves"], 3),
        "execution.noop.langgraph_checkpoints": float(lg_noop["checkpoints"]),
        "execution.noop.worker_cpu_ms_per_leaf": round(
            1000 * noop["worker_cpu_s"] / noop["leaves"], 3
        ),
        "execution.noop.langgraph_cpu_ms_per_node": round(
            1000 * lg_noop["cpu_s"] / lg_noop["leaves"], 3
        ),
        "execution.noop.dbos_cpu_ms_per_step": round(
            1000 * db_steps["cpu_s"] / db_steps["leaves"], 3
        ),
        "execution.p2.leaves": float(noop["leaves"]),
        "execution.p2.all_once": 1.0 if both_once else 0.0,
        "execution.p2.chain_ok": 1.0 if layered["chain_ok"] and noop["chain_ok"] else 0.0,
        "execution.p2.queue_left": float(queue_left),
        "execution.p2.reconciler_passes": float(layered["reconciled"] + noop["reconciled"]),
        "execution.p2.rss_start_mb": round(rss["start"], 1),
        "execution.p2.rss_peak_mb": round(rss["peak"], 1),
        "execution.p2.rss_end_mb": round(rss["end"], 1),
        "execution.p2.rss_growth_mb": round(rss["end"] - rss["start"], 1),
    }


def _print_comparison(
    ours: dict[str, Any], theirs: dict[str, Any], dbos: dict[str, Any], f: dict[str, float]
) -> None:
    print(
        f"  200 x 50 ms, bound {f['execution.layered.bound_s']:.2f} s: CaseHub "
        f"{f['execution.layered.makespan_s']:.2f} s (ratio {f['execution.layered.ratio']:.3f}, "
        f"target ≤ 1.10 and below LangGraph and DBOS), DBOS "
        f"{f['execution.layered.dbos_makespan_s']:.2f} s "
        f"(ratio {f['execution.layered.dbos_ratio']:.3f}), LangGraph sync "
        f"{f['execution.layered.langgraph_makespan_s']:.2f} s "
        f"(ratio {f['execution.layered.langgraph_ratio']:.3f}), LangGraph default "
        f"{f['execution.layered.langgraph_default_makespan_s']:.2f} s "
        f"(ratio {f['execution.layered.langgraph_default_ratio']:.3f})",
        flush=True,
    )
    print(
        f"  1,000 no-op: CaseHub {f['execution.noop.ms_per_leaf']:.2f} ms/leaf "
        f"({f['execution.noop.events_per_leaf']:.1f} audit events per leaf), DBOS "
        f"{f['execution.noop.dbos_ms_per_step']:.2f} ms/step in one workflow "
        f"({f['execution.noop.dbos_checkpoints']:g} step checkpoints) and "
        f"{f['execution.noop.dbos_queue_ms_per_leaf']:.2f} ms/leaf on its queue "
        f"({f['execution.noop.dbos_queue_checkpoints']:g} step checkpoints, "
        f"{f['execution.noop.dbos_queue_workflows']:g} workflows)",
        flush=True,
    )
    print(
        "  1,000 no-op: LangGraph sync "
        f"{f['execution.noop.langgraph_ms_per_node']:.2f} ms/node "
        f"({f['execution.noop.langgraph_checkpoints']:g} checkpoints), LangGraph default "
        f"{f['execution.noop.langgraph_default_ms_per_node']:.2f} ms/node "
        f"({f['execution.noop.langgraph_default_checkpoints']:g} checkpoints) "
        "(target: CaseHub ≤ DBOS and ≤ 2 ms; LangGraph checkpoints once a superstep)",
        flush=True,
    )
    print(
        f"  P2: every leaf once {bool(f['execution.p2.all_once'])}, chains verify "
        f"{bool(f['execution.p2.chain_ok'])}, queue left {f['execution.p2.queue_left']:g}, "
        f"worker RSS start/peak/end {f['execution.p2.rss_start_mb']:.1f}/"
        f"{f['execution.p2.rss_peak_mb']:.1f}/{f['execution.p2.rss_end_mb']:.1f} MB "
        f"(flat: growth ≤ {RSS_FLAT_MB:g} MB)",
        flush=True,
    )
    runs = {
        "CaseHub": [ours["layered"], ours["noop"]],
        "LangGraph": [r for shape in SHAPES for r in theirs[shape].values()],
        "DBOS": [r for shape in SHAPES for r in dbos[shape].values()],
    }
    for label, results in runs.items():
        problems = [p for run in results for p in run.get("problems", [])]
        if problems:
            print(f"  {label} problems: {problems[:10]}", flush=True)


# Profile (CASEHUB_BENCH_PROFILE=1) ------------------------------------------------------------


def _read_profile(var_dir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in var_dir.glob("profile-*.jsonl"):
        rows.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return rows


def _read_cprofile(var_dir: Path, top: int = 25) -> str:
    """Return the top lines (by own time, then cumulative) of the pool processes' cProfile."""
    import io
    import pstats

    paths = sorted(str(p) for p in var_dir.glob("cprofile-*.prof"))
    if not paths:
        return ""
    out = io.StringIO()
    stats = pstats.Stats(*paths, stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def _print_profile(rows: list[dict[str, Any]]) -> None:
    by_phase: dict[str, list[float]] = {}
    queries: dict[str, list[int]] = {}
    for row in rows:
        by_phase.setdefault(row["phase"], []).append(row["ms"])
        queries.setdefault(row["phase"], []).append(row["queries"])
    print("  worker profile per call (ms: median, mean; SQL queries: mean):", flush=True)
    for phase, times in sorted(by_phase.items()):
        print(
            f"    {phase:<22} n={len(times):>5}  {statistics.median(times):7.2f}  "
            f"{statistics.fmean(times):7.2f}  q={statistics.fmean(queries[phase]):6.1f}",
            flush=True,
        )


# The CaseHub child: plan, approve, wait, check ---------------------------------------------------


def _processes(pid: int) -> list[Any]:
    import psutil  # type: ignore[import-untyped]

    try:
        main = psutil.Process(pid)
        return [main, *main.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _rss_mb(pid: int) -> float:
    """Return the RSS of the worker's main process and its pool children together, in MiB."""
    import psutil

    total = 0
    for proc in _processes(pid):
        try:
            total += proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / (1024 * 1024)


def _cpu_s(pid: int) -> float:
    """Return the CPU seconds (user + system) the worker's processes have used so far."""
    return cpu_s(_processes(pid))


def cpu_s(processes: Iterable[Any]) -> float:
    """Return the CPU seconds (user + system) the processes have used so far (psutil's; one
    gone meanwhile counts nothing)."""
    import psutil

    total = 0.0
    for proc in processes:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


class _RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while True:
            self.samples.append(_rss_mb(self.pid))
            if self.done.wait(0.25):
                break
        self.samples.append(_rss_mb(self.pid))


def _casehub(shape: str, out: Path, worker_pid: int) -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from accounts import roles
    from oversight.tasks import ping

    roles.sync_roles()
    users = get_user_model().objects
    people = []
    for name, role in (("bench-analyst", roles.ANALYST), ("bench-officer", roles.OFFICER)):
        user = users.filter(username=name).first()
        if user is None:
            user = users.create_user(name, password=PASSWORD)
            user.groups.add(Group.objects.get(name=role))
        people.append(user)
    # The worker answers (imports done, connected to the broker and the database).
    ping.apply_async(args=["bench-officer"]).get(timeout=90)
    analyst, officer = people
    result = _run_case(analyst, officer, SHAPES[shape], worker_pid=worker_pid)
    out.write_text(json.dumps(result))


def _run_case(
    analyst: Any, officer: Any, shape: dict[str, int], *, worker_pid: int
) -> dict[str, Any]:
    from django.db.models import Max

    from audit.chain import case_chain, verify_chain
    from audit.models import AuditEvent
    from execution import actions as execution
    from execution.models import LeafAttempt
    from oversight.actions.gates import DecisionInput, decide_gate
    from oversight.models import Gate, GateKind
    from planning.actions import materialise_plan, submit_case
    from planning.models import Case, CaseStatus, PlanNode

    leaves = shape["layers"] * shape["width"]
    case = submit_case(
        submitter=analyst,
        title=f"Bench DAG of {leaves} leaves",
        goal=f"Run {leaves} leaves of {shape['sleep_ms']} ms",
        domain=SLUG,
        strategy="static",
        inputs=shape,
    )
    materialise_plan(case.pk)  # the worker may have planned it first: then this one skips
    deadline = time.monotonic() + 60
    while Case.objects.get(pk=case.pk).status == CaseStatus.PLANNING:
        if time.monotonic() > deadline:
            raise RuntimeError("the bench case was not planned within 60 s")
        time.sleep(0.1)
    case.refresh_from_db()
    if case.status != CaseStatus.AWAITING_APPROVAL:
        raise RuntimeError(f"the bench case is {case.status}: {getattr(case, 'error', '')}")
    gates = list(Gate.objects.filter(case=case))
    if [g.kind for g in gates] != [GateKind.PLAN]:
        raise RuntimeError(f"the bench case opened gates {[g.kind for g in gates]}, not one plan")
    sampler = _RssSampler(worker_pid)
    sampler.start()
    cpu_before = _cpu_s(worker_pid)
    started = time.monotonic()
    decide_gate(gate_id=gates[0].pk, user=officer, decision=DecisionInput(decision="approve"))
    reconciled = 0
    last_progress, last_done = time.monotonic(), -1
    while True:
        status = Case.objects.filter(pk=case.pk).values_list("status", flat=True).get()
        if status not in (CaseStatus.APPROVED, CaseStatus.EXECUTING):
            break
        done = PlanNode.objects.filter(version_id=case.current_version_id, status="succeeded")
        count = done.count()
        now = time.monotonic()
        if count != last_done:
            last_progress, last_done = now, count
        elif now - last_progress > STALL_S:
            found = execution.reconcile_execution().as_data()
            reconciled += 1
            print(f"  stalled at {count}/{leaves}: reconciler pass {found}", flush=True)
            last_progress = now
        if os.environ.get("CASEHUB_BENCH_VERBOSE") == "1" and int(now - started) != int(
            now - started - 0.05
        ):
            print(f"    {now - started:5.1f} s: {count}/{leaves} succeeded", flush=True)
        if now - started > CASE_TIMEOUT_S:
            raise RuntimeError(f"the bench case did not end within {CASE_TIMEOUT_S:g} s")
        time.sleep(0.05)
    wall = time.monotonic() - started
    print(
        f"  CaseHub, {leaves} leaves of {shape['sleep_ms']} ms: ended in {wall:.2f} s", flush=True
    )
    cpu = _cpu_s(worker_pid) - cpu_before
    sampler.done.set()
    sampler.join()
    case.refresh_from_db()
    gate = Gate.objects.get(pk=gates[0].pk)
    nodes = PlanNode.objects.filter(version_id=case.current_version_id, kind="leaf")
    last = nodes.aggregate(last=Max("finished_at"))["last"]
    assert gate.decided_at is not None and last is not None
    chain = case_chain(case.pk)
    events = AuditEvent.objects.filter(chain=chain)
    succeeded = Counter(
        e["node"]
        for e in events.filter(action="execution.leaf.succeeded").values_list("data", flat=True)
    )
    problems: list[str] = []
    if case.status != CaseStatus.COMPLETED:
        problems.append(f"case {case.status}: {case.verification}")
    rows = list(nodes.values_list("pk", "key", "status", "attempts"))
    runs = Counter(LeafAttempt.objects.filter(node__in=nodes).values_list("node_id", flat=True))
    expected = layered_dag(shape)
    if {key for _, key, _, _ in rows} != set(expected):
        problems.append("the stored leaves are not the DAG's")
    for pk, key, status, attempts in rows:
        if status != "succeeded" or attempts != 1 or runs[pk] != 1 or succeeded[key] != 1:
            problems.append(f"{key}: {status}, {attempts} attempts, {succeeded[key]} events")
    broken = verify_chain(chain)
    result: dict[str, Any] = {
        "leaves": len(rows),
        "makespan_s": (last - gate.decided_at).total_seconds(),
        "wall_s": wall,
        "events": events.filter(action__startswith="execution.leaf.").count(),
        "chain_ok": not broken,
        "all_once": not problems,
        "problems": problems[:20] + [str(p) for p in broken[:5]],
        "reconciled": reconciled,
        "worker_cpu_s": cpu,
    }
    samples = sampler.samples
    result["rss_mb"] = {"start": samples[0], "peak": max(samples), "end": samples[-1]}
    return result


# The LangGraph child -----------------------------------------------------------------------------


def _langgraph(shape: str, out: Path) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    url = os.environ["DATABASE_URL"]
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
        # Its most durable mode, then its default ("async": a superstep's checkpoint is written
        # while the next superstep runs).
        result = {
            "sync": _run_graph(saver, SHAPES[shape], f"{shape}-sync", "sync"),
            "default": _run_graph(saver, SHAPES[shape], f"{shape}-default", None),
        }
    out.write_text(json.dumps(result))


class State(TypedDict):
    """The LangGraph run's state: the key of every node that ran, in the order they ran."""

    done: Annotated[list[str], operator.add]


def _run_graph(
    saver: Any, shape: dict[str, int], thread: str, durability: str | None
) -> dict[str, Any]:
    from langgraph.graph import START, StateGraph

    dag = layered_dag(shape)
    seconds = shape["sleep_ms"] / 1000

    def node(key: str) -> Any:
        def leaf(state: State) -> dict[str, list[str]]:
            if seconds:
                time.sleep(seconds)
            return {"done": [key]}

        return leaf

    builder = StateGraph(State)
    for key in dag:
        builder.add_node(key, node(key))
    for key, deps in dag.items():
        # A list of sources is a join: the node runs once all of them have run.
        builder.add_edge(list(deps) if deps else START, key)
    graph = builder.compile(checkpointer=saver)
    config: Any = {
        "configurable": {"thread_id": thread},
        "max_concurrency": SLOTS,
        "recursion_limit": shape["layers"] + 10,
    }
    started, cpu_before = time.monotonic(), time.process_time()
    if durability is None:
        final: Any = graph.invoke({"done": []}, config)
    else:
        final = graph.invoke({"done": []}, config, durability=durability)
    makespan, cpu = time.monotonic() - started, time.process_time() - cpu_before
    done = Counter(final["done"])
    problems = [f"{k}: ran {done[k]} times" for k in dag if done[k] != 1]
    checkpoints = sum(1 for _ in saver.list({"configurable": {"thread_id": thread}}))
    return {
        "leaves": len(dag),
        "makespan_s": makespan,
        "all_once": not problems,
        "problems": problems[:20],
        "checkpoints": checkpoints,
        "cpu_s": cpu,
    }


# The DBOS child ----------------------------------------------------------------------------------


def _dbos(shape: str, out: Path) -> None:
    from bench import execution_dbos

    result = execution_dbos.run(SHAPES[shape], in_order=shape == "noop")
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[1:2] == ["casehub"]:
        _casehub(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1:2] == ["langgraph"]:
        _langgraph(sys.argv[2], Path(sys.argv[3]))
    elif sys.argv[1:2] == ["dbos"]:
        _dbos(sys.argv[2], Path(sys.argv[3]))
    elif sys.argv[1:2] == ["dbos-worker"]:
        from bench import execution_dbos

        execution_dbos.worker(int(sys.argv[2]))
    else:
        raise SystemExit(
            "usage: python -m bench.bench_execution casehub SHAPE OUT.json WORKER_PID\n"
            "       python -m bench.bench_execution langgraph SHAPE OUT.json\n"
            "       python -m bench.bench_execution dbos SHAPE OUT.json\n"
            "       python -m bench.bench_execution dbos-worker INDEX"
        )
