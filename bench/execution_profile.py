"""A Celery worker that times each execution step and counts its SQL queries (bench only).

``python -m bench.execution_profile VAR_DIR [celery worker options]`` sets Django up, wraps the
execution functions a leaf goes through (claim, run, complete and what they call, the send to
the broker) with timers, then starts ``celery -A casehub worker`` in the same process: the pool
children fork with the wrappers in place. Each call appends a line to
``VAR_DIR/profile-<pid>.jsonl``: the phase, its milliseconds and the SQL queries of the
worker's thread during it (calls nest: `complete_leaf` contains `release_ready`, which
contains `append_event` …). With ``CASEHUB_BENCH_CPROFILE=1`` each pool process also runs its
`execute_leaf` calls under cProfile and writes the stats to ``VAR_DIR/cprofile-<pid>.prof`` (every
50 calls and at exit; cProfile slows the worker, so its CPU figure is not the plain one). Nothing
in the application changes.
"""

from __future__ import annotations

import atexit
import cProfile
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_counts = threading.local()
_files: dict[int, Any] = {}


def _queries() -> int:
    return int(getattr(_counts, "n", 0))


def _count(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
    _counts.n = _queries() + 1
    return execute(sql, params, many, context)


def _write(var_dir: Path, row: dict[str, Any]) -> None:
    pid = os.getpid()
    handle = _files.get(pid)
    if handle is None:
        handle = _files[pid] = (var_dir / f"profile-{pid}.jsonl").open("a", buffering=1)
    handle.write(json.dumps(row) + "\n")


def _timed(var_dir: Path, phase: str, func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started, before = time.perf_counter(), _queries()
        try:
            return func(*args, **kwargs)
        finally:
            if threading.current_thread() is threading.main_thread():
                ms = (time.perf_counter() - started) * 1000
                _write(var_dir, {"phase": phase, "ms": ms, "queries": _queries() - before})

    return wrapper


def _profiled(var_dir: Path, func: Callable[..., Any]) -> Callable[..., Any]:
    profiles: dict[int, tuple[cProfile.Profile, list[int]]] = {}

    def dump(pid: int) -> None:
        profile, _ = profiles[pid]
        profile.dump_stats(str(var_dir / f"cprofile-{pid}.prof"))

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        pid = os.getpid()
        if pid not in profiles:
            profiles[pid] = (cProfile.Profile(), [0])
            atexit.register(dump, pid)
        profile, calls = profiles[pid]
        profile.enable()
        try:
            return func(*args, **kwargs)
        finally:
            profile.disable()
            calls[0] += 1
            if calls[0] % 50 == 0:
                dump(pid)

    return wrapper


def install(var_dir: Path) -> None:
    """Wrap the execution path's functions with timers and count queries on every connection."""
    import django

    django.setup()
    import importlib

    from django.db.backends.signals import connection_created

    from execution import dispatch, runners

    parts = (
        "common",
        "claiming",
        "ending",
        "work_items",
        "cases",
        "reconcile",
        "worker",
        "actions",
    )
    modules = [
        *(importlib.import_module(f"execution.{part}") for part in parts),
        importlib.import_module("execution.trust_actions"),
        runners,
        dispatch,
    ]

    def on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
        if _count not in connection.execute_wrappers:
            connection.execute_wrappers.append(_count)

    connection_created.connect(on_connection, weak=False)
    phases = (
        "execute_leaf",
        "claim_leaf",
        "take_leaf",
        "_approval_problem",
        "_routing",
        "complete_leaf",
        "mark_ready",
        "_claim_next",
        "finish_if_done",
        "record_outcome",
        "append_event",
        "run",
        "check_output",
        "send_leaf",
    )
    for name in phases:
        # The same wrapper wherever the function is bound: where it is defined and where it is
        # imported (the execution parts import each other's functions by name).
        owner = next((m for m in modules if getattr(getattr(m, name, None), "__module__", "")
                      == m.__name__), None)  # fmt: skip
        if owner is None:
            continue
        label = f"{owner.__name__.rsplit('.', 1)[-1]}.{name}"
        original = getattr(owner, name)
        wrapped = _timed(var_dir, label, original)
        if name == "execute_leaf" and os.environ.get("CASEHUB_BENCH_CPROFILE") == "1":
            wrapped = _profiled(var_dir, wrapped)
        for module in modules:
            if getattr(module, name, None) is original:
                setattr(module, name, wrapped)


if __name__ == "__main__":
    install(Path(sys.argv[1]))
    from celery.bin.celery import main

    sys.argv = ["celery", "-A", "casehub", "worker", *sys.argv[2:]]
    main()
