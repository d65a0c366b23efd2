"""The no-op leaves' claim and completion in one process, without Celery's worker (bench only).

``python -m bench.execution_loop [--layers L] [--cprofile] [--callgrind [--keep DIR]] [--plans]``
recreates the execution module's database (``casehub_bench_execution``), plans the bench pack's
no-op DAG (`bench.execution_pack`, L layers of 20; a warm-up case of two layers first) and
approves its gate, then runs its leaves here, in this one process, through the worker's own
`execution.worker.execute_leaf`: each call claims a ready leaf and runs it and the leaves its
completions claim for it, as a worker's task does, until none is left in hand; then the next
ready leaf is taken as its queued message would be. The messages the completions send (Redis
db 14) are not consumed; the leaves they name run through the loop instead.

It prints, a leaf: the wall, this process's CPU, PostgreSQL's CPU and the SQL statements run on
this thread's connection (the completer thread's are not counted). `--cprofile` prints the loop's
top functions by CPU time. `--callgrind` runs the loop under valgrind's callgrind, instrumented
only while the leaves run (`--keep DIR`: its files are copied there, for callgrind_annotate), and
prints the instructions a leaf: counted, not timed, so that two versions of the code can be
compared on a busy machine (PostgreSQL's side is not counted). `--plans` prints how PostgreSQL
planned the connection's prepared statements; it sets ``CASEHUB_LEAF_OVERLAP=0`` (every statement
on that one connection), as a comparison of instruction counts should too.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_execution import DEFAULT_REDIS, DEFAULT_URL, NOOP, ROOT, _admin, _env, _recreate
from bench.execution_cpu import postgres_cpu

WORKER = "loop@bench"


def _case(layers: int, name: str) -> tuple[int, int]:
    """Plan the no-op DAG of `layers` layers and approve it; return its case and version ids."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from accounts import roles
    from bench.execution_pack import SLUG
    from oversight.actions.gates import DecisionInput, decide_gate
    from oversight.models import Gate
    from planning.actions import materialise_plan, submit_case
    from planning.models import Case, CaseStatus

    roles.sync_roles()
    users = get_user_model().objects
    people = []
    for who, role in ((f"{name}-analyst", roles.ANALYST), (f"{name}-officer", roles.OFFICER)):
        user = users.create_user(who, password="bench-only-password-1")  # noqa: S106
        user.groups.add(Group.objects.get(name=role))
        people.append(user)
    analyst, officer = people
    shape = {**NOOP, "layers": layers}
    case = submit_case(
        submitter=analyst,
        title=f"Loop of {layers * shape['width']} no-op leaves",
        goal="Run no-op leaves",
        domain=SLUG,
        strategy="static",
        inputs=shape,
    )
    materialise_plan(case.pk)
    case = Case.objects.get(pk=case.pk)
    if case.status != CaseStatus.AWAITING_APPROVAL:
        raise RuntimeError(f"the loop's case is {case.status}")
    gate = Gate.objects.get(case=case)
    decide_gate(gate_id=gate.pk, user=officer, decision=DecisionInput(decision="approve"))
    assert case.current_version_id is not None
    return case.pk, case.current_version_id


def _next_ready(version_id: int) -> int | None:
    from planning.models import PlanNode

    return (
        PlanNode.objects.filter(version_id=version_id, kind="leaf", status="ready")
        .order_by("position")
        .values_list("pk", flat=True)
        .first()
    )


def _callgrind(on: bool) -> None:
    # valgrind's own tool: instrumentation on for the loop only (the process started with it off)
    command = ["callgrind_control", "--instr=on" if on else "--instr=off", str(os.getpid())]
    subprocess.run(command, check=True, capture_output=True)


def _print_plans() -> None:
    """Print how PostgreSQL planned this connection's prepared statements: a generic plan kept
    for every run, or a custom plan made at each run (the planner's work every time)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans, left(regexp_replace(statement, '\\s+', ' ', "
            "'g'), 100) FROM pg_prepared_statements ORDER BY generic_plans + custom_plans DESC"
        )
        print("generic custom statement")
        for generic, custom, text in cursor.fetchall():
            print(f"{generic:>7} {custom:>6} {text}")


def _loop(layers: int, *, profile: bool, callgrind: bool, plans: bool) -> dict[str, Any]:
    """Run the case's leaves here; return the figures."""
    import django

    django.setup()
    from django.db import connection
    from django.db.models import Count

    from execution.models import LeafAttempt
    from execution.worker import execute_leaf, stop_completer
    from planning.models import Case, PlanNode

    # a case of two layers first: the imports, the caches and the prepared statements
    _, warm = _case(2, "warm")
    while (leaf := _next_ready(warm)) is not None:
        execute_leaf(leaf, worker=WORKER)
    stop_completer()
    case_id, version_id = _case(layers, "loop")
    statements: list[int] = [0]

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements[0] += 1
        return execute(sql, params, many, context)

    # CPU time, not wall: the waits for PostgreSQL are not what a change here can shorten
    profiler = cProfile.Profile(time.thread_time) if profile else None
    calls = 0
    with connection.execute_wrapper(count):
        if callgrind:
            _callgrind(True)
        wall, cpu, server = time.perf_counter(), time.process_time(), postgres_cpu()
        if profiler is not None:
            profiler.enable()
        while (leaf := _next_ready(version_id)) is not None:
            execute_leaf(leaf, worker=WORKER)
            calls += 1
        stop_completer()
        if profiler is not None:
            profiler.disable()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        server = postgres_cpu() - server
        if callgrind:
            _callgrind(False)
    # the completer thread's statements run on its own connection: not counted above
    leaves = PlanNode.objects.filter(version_id=version_id, status="succeeded").count()
    measured = leaves
    attempts = (
        LeafAttempt.objects.filter(node__version_id=version_id)
        .values("node_id")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
        .count()
    )
    case = Case.objects.get(pk=case_id)
    if plans:
        _print_plans()
    if profiler is not None:
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(int(os.environ.get("CASEHUB_BENCH_TOP", "40")))
    return {
        "case": case.status,
        "leaves": measured,
        "tasks": calls,
        "leaves_twice": attempts,
        "wall_ms_per_leaf": 1000 * wall / measured,
        "cpu_ms_per_leaf": 1000 * cpu / measured,
        "postgres_cpu_ms_per_leaf": 1000 * server / measured,
        "statements_per_leaf_main_thread": statements[0] / measured,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=50)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument(
        "--plans", action="store_true", help="print the prepared statements' plans (no overlap)"
    )
    parser.add_argument("--keep", type=Path, help="a folder to copy callgrind's files to")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # in the child process, with the bench's environment
        result = _loop(
            args.layers, profile=args.cprofile, callgrind=args.callgrind, plans=args.plans
        )
        Path(args.child).write_text(json.dumps(result))
        return
    admin_url, name = _admin(DEFAULT_URL)
    _recreate(admin_url, name)
    import redis

    client = redis.Redis.from_url(DEFAULT_REDIS, socket_connect_timeout=5)
    client.flushdb()
    try:
        with tempfile.TemporaryDirectory(prefix="casehub-bench-loop-") as tmp:
            var_dir = Path(tmp)
            env = _env(DEFAULT_URL, DEFAULT_REDIS, var_dir)
            # a task keeps its leaves however slow the loop runs (under valgrind): the same work
            env.setdefault("CASEHUB_LEAF_INLINE_S", "3600")
            migrate = [sys.executable, "-m", "django", "migrate", "--verbosity", "0", "--no-input"]
            subprocess.run(migrate, cwd=ROOT, env=env, check=True)
            out = var_dir / "loop.json"
            command = [sys.executable, "-m", "bench.execution_loop", "--child", str(out)]
            command += ["--layers", str(args.layers)]
            command += ["--cprofile"] if args.cprofile else []
            if args.plans:  # every statement on this process's one connection
                command += ["--plans"]
                env["CASEHUB_LEAF_OVERLAP"] = "0"
            grind = var_dir / "callgrind.out"
            if args.callgrind:
                command = [
                    "valgrind",
                    "--tool=callgrind",
                    "--instr-atstart=no",
                    f"--callgrind-out-file={grind}.%p",  # a fork writes its own
                    *command,
                    "--callgrind",
                ]
            subprocess.run(command, cwd=ROOT, env=env, check=True)
            result = json.loads(out.read_text())
            if args.callgrind:
                result["instructions_per_leaf"] = _instructions(grind) / result["leaves"]
                if args.keep is not None:  # for callgrind_annotate
                    args.keep.mkdir(parents=True, exist_ok=True)
                    for path in var_dir.glob(grind.name + "*"):
                        shutil.copy(path, args.keep / path.name)
    finally:
        _recreate(admin_url, name, drop_only=True)
        client.flushdb()
    for key, value in result.items():
        print(f"{key}: {value:,.3f}" if isinstance(value, float) else f"{key}: {value}")


def _instructions(out: Path) -> float:
    """Return the instructions callgrind counted (its `totals` line, in each file it wrote)."""
    total = 0
    for path in out.parent.glob(out.name + "*"):
        found = re.search(r"^totals: (\d+)", path.read_text(), re.MULTILINE)
        if found:
            total += int(found.group(1))
    return float(total)


if __name__ == "__main__":
    main()
