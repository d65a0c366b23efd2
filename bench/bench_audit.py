"""The audit trail on PostgreSQL (DESIGN §9): append 100,000 events, verify them, export them.

One case chain gets ``CASEHUB_BENCH_AUDIT_EVENTS`` (100,000) events through the real
``append_event``, each in its own transaction, one after another: the row lock on the chain's
head serialises the appends of a chain, so this is the rate of one chain (target ≥ 2,000
appends/s), reported beside the rate of the cheapest write transaction on the same database (one
row updated, committed), which no one-event transaction can beat. Business transactions that
write several events of a chain commit once for all of them: two more chains get
``CASEHUB_BENCH_AUDIT_BATCH_EVENTS`` (20,000) events in transactions of ``BATCH`` (10) events,
once through ``append_events`` (one call a transaction) and once through ten ``append_event``
calls a transaction. ``verify_chain`` then checks the 100,000-event chain (median of three runs,
target ≤ 1 s; in parts at once, ``VERIFY_PROCESSES`` processes, and once in one process for
comparison, with the CPU seconds of all the processes), ``export_case_bundle`` exports it (peak
RSS growth of the process during the export, target ≤ 50 MB: streamed, flat memory) and
``casehub_verify.py`` verifies the bundle offline with the signing key's public half, as an
auditor would (its wall-clock and own peak RSS are reported). The 1-minute load average at the
start and end of the append phase is recorded: the figures are only as quiet as the machine.

The bench owns its database: ``CASEHUB_BENCH_DATABASE_URL`` (default ``casehub_bench`` on the
local PostgreSQL, whose name must contain "bench") is dropped, created and migrated at the start
and dropped at the end (audit events are append-only, so they cannot be deleted), unless
``CASEHUB_BENCH_KEEP_DB=1``. When PostgreSQL cannot be reached the bench says so and is skipped.
Appends and verification run in one child process, the export in a fresh one, so that the
export's memory is measured in a process that has not already grown its heap.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/casehub_bench"
EVENTS = int(os.environ.get("CASEHUB_BENCH_AUDIT_EVENTS", "100000"))
BATCH_EVENTS = int(os.environ.get("CASEHUB_BENCH_AUDIT_BATCH_EVENTS", "20000"))
BATCH = 10  # events a business transaction writes, in the batched runs
CASE_ID = 1  # the benchmarked chain, case:1
BATCH_CASE_ID = 3  # append_events, BATCH events a transaction
CALLS_CASE_ID = 4  # BATCH append_event calls a transaction
WARMUP_CASE_ID = 2  # a short chain exported first, so one-time costs are not counted
WARMUP_EVENTS = 200
EXPORTER = "bench-auditor"
VERIFY_RUNS = 3
MIB = 1024 * 1024
# Runs casehub_verify.py as its command line does, then reports the verifier's own peak RSS:
# VmHWM after exec (a fork's ru_maxrss would carry the Django parent's peak)
VERIFY_WRAPPER = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    with open("/proc/self/status", encoding="ascii") as status:
        sys.stderr.write("".join(line for line in status if line.startswith("VmHWM:")))
"""

TARGETS = {
    "audit.append.per_s": (">=", 2000.0),
    # #22: a single append at 0.8 of the database's commit rate, batched appends at 5,000/s.
    "audit.append.of_commit_floor": (">=", 0.8),
    "audit.append_k10.per_s": (">=", 5000.0),
    "audit.verify.s": ("<=", 1.0),
    "audit.verify.problems": ("<=", 0.0),
    "audit.export.rss_growth_mb": ("<=", 50.0),
    "audit.bundle_verify.ok": (">=", 1.0),
}


def _database_url() -> str:
    return os.environ.get("CASEHUB_BENCH_DATABASE_URL", DEFAULT_URL)


def _admin(url: str) -> tuple[str, str]:
    """Return the URL of the server's `postgres` database and the name of the bench's one."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if parts.scheme not in ("postgres", "postgresql") or not name:
        raise RuntimeError(f"CASEHUB_BENCH_DATABASE_URL must name a PostgreSQL database: {url!r}")
    if "bench" not in name:
        raise RuntimeError(
            f"the bench drops and recreates its database; {name!r} does not look like a bench "
            "database (its name must contain 'bench')"
        )
    return urlunsplit(parts._replace(path="/postgres")), name


def _recreate(admin_url: str, name: str, *, drop_only: bool = False) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        if not drop_only:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def _child(phase: str, url: str, var_dir: Path) -> dict[str, Any]:
    env = {
        key: value
        for key, value in os.environ.items()
        # one role runs migrations and the app here; the bench needs no restricted app role
        if key not in ("CASEHUB_DB_APP_ROLE", "CASEHUB_DEMO")
    }
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="casehub.settings",
        CASEHUB_VAR_DIR=str(var_dir),
        SECRET_KEY=os.environ.get("SECRET_KEY", "bench-only-not-a-secret"),
    )
    out = var_dir / f"{phase}.json"
    subprocess.run(
        [sys.executable, "-m", "bench.bench_audit", phase, str(out)],
        cwd=ROOT,
        env=env,
        check=True,
    )
    return json.loads(out.read_text())


def run() -> dict[str, float]:
    """Return the append rate, verification time, export memory growth and bundle check."""
    url = _database_url()
    admin_url, name = _admin(url)
    try:
        _recreate(admin_url, name)
    except Exception as exc:  # psycopg.OperationalError and friends: no server to measure on
        print(
            f"  SKIPPED bench_audit: PostgreSQL unreachable at {admin_url} ({exc}). Start it or "
            "set CASEHUB_BENCH_DATABASE_URL; the audit figures need PostgreSQL.",
            flush=True,
        )
        return {}
    results: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="casehub-bench-audit-") as tmp:
            var_dir = Path(tmp)
            results.update(_child("append", url, var_dir))
            results.update(_child("export", url, var_dir))
    finally:
        if os.environ.get("CASEHUB_BENCH_KEEP_DB") != "1":
            _recreate(admin_url, name, drop_only=True)
    return results


# The child processes ------------------------------------------------------------------------


def status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0); False when it cannot be reset."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def _setup() -> None:
    import django

    django.setup()


def _leaf_data(i: int) -> dict[str, Any]:
    return {"case": CASE_ID, "leaf": i, "step": f"s{i % 25}", "status": "done", "attempt": 1}


def _append_phase() -> dict[str, float]:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from audit.chain import append_event, case_chain

    call_command("migrate", verbosity=0, interactive=False)
    get_user_model().objects.create_user(EXPORTER)
    for i in range(WARMUP_EVENTS):
        append_event(
            "bench.warmup.event", actor="analyst", chain=case_chain(WARMUP_CASE_ID), data={"i": i}
        )

    load_before = os.getloadavg()[0]
    chain = case_chain(CASE_ID)
    step = max(EVENTS // 10, 1)
    floor_probe = _CommitFloor()
    wall = 0.0
    for first in range(0, EVENTS, step):
        slice_started = time.perf_counter()
        for i in range(first, min(first + step, EVENTS)):
            # each call is its own transaction (autocommit outside atomic)
            append_event(
                "planning.leaf.completed", actor="analyst", chain=chain, data=_leaf_data(i)
            )
        lap = time.perf_counter() - slice_started
        wall += lap
        print(
            f"  appended {min(first + step, EVENTS):>7,} events, "
            f"{(min(first + step, EVENTS) - first) / lap:,.0f}/s in the last slice",
            file=sys.stderr,
            flush=True,
        )
        floor_probe.probe(max(step // 10, 50))  # the floor, between the slices
    floor, floor_in_transaction, event_row_floor = floor_probe.rates()
    batched = _batched_appends()
    load_after = os.getloadavg()[0]
    return {
        "audit.append.events": float(EVENTS),
        "audit.append.wall_s": round(wall, 3),
        "audit.append.per_s": round(EVENTS / wall, 1),
        # The peer in the same run: one row updated by one statement that commits, nothing
        # else. No one-event append can beat it. Beside it the same UPDATE in a transaction.
        "audit.commit_floor.per_s": round(floor, 1),
        "audit.append.of_commit_floor": round(EVENTS / wall / floor, 3),
        "audit.commit_floor_in_transaction.per_s": round(floor_in_transaction, 1),
        "audit.append.of_commit_floor_in_transaction": round(
            EVENTS / wall / floor_in_transaction, 3
        ),
        # what an append must write (a counter row and an event row, one prepared statement)
        "audit.commit_floor_event_row.per_s": round(event_row_floor, 1),
        "audit.append.of_event_row_floor": round(EVENTS / wall / event_row_floor, 3),
        **batched,
        **_verify_figures(chain),
        "audit.loadavg_1m.before": round(load_before, 2),
        "audit.loadavg_1m.after": round(load_after, 2),
    }


def _batched_appends() -> dict[str, float]:
    """Append BATCH_EVENTS events in transactions of BATCH, by append_events and by calls."""
    from django.db import transaction

    from audit.chain import NewEvent, append_event, append_events, case_chain

    transactions = max(BATCH_EVENTS // BATCH, 1)
    batch_chain, calls_chain = case_chain(BATCH_CASE_ID), case_chain(CALLS_CASE_ID)
    started = time.perf_counter()
    for t in range(transactions):
        with transaction.atomic():
            append_events(
                [
                    NewEvent("planning.leaf.completed", "analyst", _leaf_data(t * BATCH + j))
                    for j in range(BATCH)
                ],
                chain=batch_chain,
            )
    batch_wall = time.perf_counter() - started
    started = time.perf_counter()
    for t in range(transactions):
        with transaction.atomic():
            for j in range(BATCH):
                append_event(
                    "planning.leaf.completed",
                    actor="analyst",
                    chain=calls_chain,
                    data=_leaf_data(t * BATCH + j),
                )
    calls_wall = time.perf_counter() - started
    events = transactions * BATCH
    print(
        f"  {events:,} events in transactions of {BATCH}: {events / batch_wall:,.0f}/s by "
        f"append_events, {events / calls_wall:,.0f}/s by append_event calls",
        file=sys.stderr,
        flush=True,
    )
    return {
        "audit.append_k10.events": float(events),
        "audit.append_k10.per_s": round(events / batch_wall, 1),
        "audit.append_k10.transactions_per_s": round(transactions / batch_wall, 1),
        "audit.append_k10_calls.per_s": round(events / calls_wall, 1),
    }


def _cpu_seconds() -> float:
    mine = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


def _verify_figures(chain: str) -> dict[str, float]:
    from audit.chain import VERIFY_PROCESSES, check_chain, verify_chain

    walls: list[float] = []
    cpus: list[float] = []
    problems = 0
    for _ in range(VERIFY_RUNS):
        gc.collect()
        cpu = _cpu_seconds()
        began = time.perf_counter()
        problems = max(problems, len(verify_chain(chain)))
        walls.append(time.perf_counter() - began)
        cpus.append(_cpu_seconds() - cpu)
    gc.collect()
    began = time.perf_counter()
    problems = max(problems, len(check_chain(chain, processes=1).problems))
    one_process = time.perf_counter() - began
    return {
        "audit.verify.s": round(statistics.median(walls), 4),
        "audit.verify.s_best": round(min(walls), 4),
        "audit.verify.processes": float(VERIFY_PROCESSES),
        # the client's CPU seconds (this process and its workers; not the database server's)
        "audit.verify.cpu_s": round(statistics.median(cpus), 4),
        "audit.verify.one_process_s": round(one_process, 4),
        "audit.verify.problems": float(problems),
    }


class _CommitFloor:
    """The database's commit rates, probed in slices between the appends' slices.

    Two writes, each of one row of a table of its own: an UPDATE sent on its own (autocommit:
    one round trip, its own transaction), the cheapest write there is and what a one-event
    append outside a transaction is compared with; and the same UPDATE in
    `transaction.atomic()` (BEGIN, UPDATE, COMMIT: three round trips), what a Django action
    writing one row pays. A third names what an append cannot do without: the writes it must
    make, one statement that moves a counter row on and inserts an event row (into a copy of
    the audit table, its indexes and constraints included, with the values an append writes),
    prepared and committing by itself as an append is, but with no chain to lock, read or hash.
    Probed between the appends, so all see the same database (its WAL, its checkpoints, the
    machine's load at that moment), not a database before or after them.
    """

    STATEMENT = "UPDATE bench_commit_probe SET n = n + 1 WHERE id = 1"
    EVENT_ROW = (
        "WITH h AS (UPDATE bench_commit_probe SET n = n + 1 WHERE id = 2 RETURNING n) "
        "INSERT INTO bench_event_probe (chain, seq, time, actor_kind, actor_label, "
        "actor_user_id, action, data, prev_hash, hash) "
        "SELECT %(chain)s::text, h.n, %(time)s::timestamptz, %(kind)s::text, %(label)s::text, "
        "NULL, %(action)s::text, %(data)s::jsonb, %(prev)s::text, %(hash)s::text FROM h"
    )

    def __init__(self) -> None:
        from django.db import connection

        from audit.models import AuditEvent

        self.rounds = 0
        self.one_statement_s = 0.0
        self.in_transaction_s = 0.0
        self.event_row_s = 0.0
        table = connection.ops.quote_name(AuditEvent._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE bench_commit_probe (id int PRIMARY KEY, n int NOT NULL)")
            cursor.execute("INSERT INTO bench_commit_probe VALUES (1, 0), (2, 0)")
            cursor.execute(f"CREATE TABLE bench_event_probe (LIKE {table} INCLUDING ALL)")

    def probe(self, rounds: int) -> None:
        """Time `rounds` commits of each kind."""
        from django.db import connection, transaction
        from django.utils import timezone

        from web.db import prepared_cursor

        started = time.perf_counter()
        for _ in range(rounds):
            with connection.cursor() as cursor:
                cursor.execute(self.STATEMENT)
        middle = time.perf_counter()
        for _ in range(rounds):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(self.STATEMENT)
        events = time.perf_counter()
        for i in range(self.rounds, self.rounds + rounds):  # a new hash for each row
            with prepared_cursor() as cursor:
                cursor.execute(
                    self.EVENT_ROW,
                    {
                        "chain": f"case:{CASE_ID}",
                        "time": timezone.now(),
                        "kind": "user",
                        "label": "analyst",
                        "action": "planning.leaf.completed",
                        "data": json.dumps(_leaf_data(i)),
                        "prev": "0" * 64,
                        "hash": f"{i:064x}",
                    },
                )
        self.one_statement_s += middle - started
        self.in_transaction_s += events - middle
        self.event_row_s += time.perf_counter() - events
        self.rounds += rounds

    def rates(self) -> tuple[float, float, float]:
        """Return the commits per second: one statement, in a transaction, an event row."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE bench_commit_probe, bench_event_probe")
        return (
            self.rounds / self.one_statement_s,
            self.rounds / self.in_transaction_s,
            self.rounds / self.event_row_s,
        )


def _export_phase(var_dir: Path) -> dict[str, float]:
    import shutil

    from django.contrib.auth import get_user_model

    from audit.export import export_case_bundle
    from audit.signing import current_key

    exporter = get_user_model().objects.get(username=EXPORTER)
    # a short chain first: imports, the signing key's creation, the first queries are not counted
    export_case_bundle(case_id=WARMUP_CASE_ID, exporter=exporter).file.close()
    gc.collect()
    baseline = status_kib("VmRSS")
    exact = _reset_peak()
    started = time.perf_counter()
    bundle = export_case_bundle(case_id=CASE_ID, exporter=exporter)
    wall = time.perf_counter() - started
    # VmHWM, reset to the RSS before the export, is its peak; without the reset, the process's
    # lifetime peak, which can only overstate the growth
    peak = status_kib("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    growth_mib = max(peak - baseline, 0) / 1024
    manifest = bundle.summary.manifest
    if manifest["event_count"] != EVENTS:
        raise RuntimeError(f"the bundle holds {manifest['event_count']} events, not {EVENTS}")

    path = var_dir / "bundle.zip"
    with bundle.file, path.open("wb") as copy:
        shutil.copyfileobj(bundle.file, copy, 1 << 20)
    key = current_key()
    began = time.perf_counter()
    checked = subprocess.run(
        [
            sys.executable,
            "-c",
            VERIFY_WRAPPER,
            str(ROOT / "casehub_verify.py"),
            str(path),
            "--public-key",
            key.public_key.hex(),
        ],
        capture_output=True,
        text=True,
    )
    verify_wall = time.perf_counter() - began
    ok = checked.returncode == 0 and "INTACT" in checked.stdout and "AUTHENTIC" in checked.stdout
    if not ok:
        print(checked.stdout, checked.stderr, sep="\n", file=sys.stderr)
    hwm = [line.split()[1] for line in checked.stderr.splitlines() if line.startswith("VmHWM:")]
    return {
        "audit.export.s": round(wall, 3),
        "audit.export.rss_growth_mb": round(growth_mib, 2),
        "audit.export.bundle_mb": round(path.stat().st_size / MIB, 2),
        "audit.bundle_verify.s": round(verify_wall, 3),
        "audit.bundle_verify.peak_rss_mb": round(int(hwm[-1]) / 1024, 1) if hwm else -1.0,
        "audit.bundle_verify.ok": 1.0 if ok else 0.0,
    }


def _main(phase: str, out: Path) -> None:
    sys.path.insert(0, str(ROOT))
    _setup()
    if phase == "append":
        figures = _append_phase()
    elif phase == "export":
        figures = _export_phase(out.parent)
    else:
        raise SystemExit(f"unknown phase {phase!r}")
    out.write_text(json.dumps(figures))


if __name__ == "__main__":
    _main(sys.argv[1], Path(sys.argv[2]))
