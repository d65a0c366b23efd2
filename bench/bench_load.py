"""Fifty officers at once through the real stack (RELIABILITY P1), then the same behind 200 ms of
added latency to PostgreSQL and Redis (P4).

The bench owns a PostgreSQL database (``CASEHUB_BENCH_LOAD_DATABASE_URL``, default
``casehub_bench_load``; its name must contain "bench"), dropped and created at the start and
dropped at the end, and a Redis database (``CASEHUB_BENCH_LOAD_REDIS_URL``, default
``redis://127.0.0.1:6379/13``), emptied at the start and the end. A child process migrates, creates
``OFFICERS`` officer accounts and two analysts, and plans real INV-1042 invoice cases through
``submit_case`` and ``materialise_plan`` (each a plan gate and a signed step gate), enough for both
phases. Each phase starts gunicorn (two gthread workers of four threads, as ``make run``; database
connections kept for 60 s, ``CONN_MAX_AGE``) and a Celery worker on Redis, runs ``USERS`` locust
users (``bench/load_users.py``) for its time, then
has two officers race on each of ``RACES`` pending plan gates (one through the form, one through
the API, released together): exactly one decision and one 409 each. A child process then counts,
from the database, the ``oversight.gate.decided`` events and the decisions stored against what the
users were told was decided, looks for duplicate decisions (an officer twice on one gate, more
approvals than the quorum, a decision after a rejection, events that do not match the rows), and
verifies every audit chain (``verify_anchored_chain``, as ``GET /api/audit/verify`` does).

Phase ``load``: the app talks to PostgreSQL and Redis directly. Phase ``load.delay``: through
``bench/delay_proxy.py``, 100 ms each way (200 ms added to every round trip, and to each new
connection), with the same users. The officers arrive one a second (locust's spawn rate) and
sign in (each sign-in hashes the password: Argon2id, about a quarter of a second of CPU); the
measured window opens when the last has signed in and lasts the phase's time. Latencies are
exact (every request is recorded); p50/p95/p99 are over the browsing and deciding requests
started in the window, and the sign-ins are reported apart. The p95 target applies to the
direct phase; in both phases the targets are no 5xx over the whole run (a 503 from ``/health`` is
its documented answer when a dependency is unhealthy, counted apart), no request without an
answer, decided events equal to the decisions the users were told of, no duplicate decision and
every chain verified.

``python -m bench load`` runs the short form (``SHORT_S`` of load, ``SHORT_DELAY_S`` under delay);
``python -m bench load --minutes 10`` the long one (the delay phase lasts a fifth of it).
``run_short`` is the suite's form (``tests/bench/test_load_short.py``): the direct phase alone,
a handful of officers on threads (``bench/load_threads.py``, no locust), correctness only.
"""

from __future__ import annotations

import http.cookiejar
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.bench_audit import _admin, _recreate
from bench.bench_pages import _free_port
from bench.delay_proxy import ProxyThread

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/casehub_bench_load"
DEFAULT_REDIS = "redis://127.0.0.1:6379/13"
USERS = 50
SPAWN_RATE = 1.0  # officers arriving (and signing in) per second
WAIT_S = (2.0, 10.0)  # an officer's pause between two tasks (6 s on average)
SIGN_IN_LIMIT_S = 480.0  # the users' run ends if they have not all signed in by then
OFFICERS = 10
RACES = 10
SHORT_S = 45.0
SHORT_DELAY_S = 30.0
DELAY_EACH_WAY_S = 0.1
CASES_PER_LOAD_S = 1.5  # pending cases seeded per second of load (decisions run at about 1/s)
# Throwaway accounts in a throwaway database.
PASSWORD = "bench-only-password-1"  # noqa: S105

TARGETS = {
    "load.p95_ms": ("<=", 500.0),
    "load.5xx": ("<=", 0.0),
    "load.no_answer": ("<=", 0.0),
    "load.unexpected": ("<=", 0.0),
    "load.events_minus_decisions": ("<=", 0.0),
    "load.decisions_minus_events": ("<=", 0.0),
    "load.duplicate_decisions": ("<=", 0.0),
    "load.chain_problems": ("<=", 0.0),
    "load.race.lost": ("<=", 0.0),
    "load.delay.5xx": ("<=", 0.0),
    "load.delay.no_answer": ("<=", 0.0),
    "load.delay.unexpected": ("<=", 0.0),
    "load.delay.events_minus_decisions": ("<=", 0.0),
    "load.delay.decisions_minus_events": ("<=", 0.0),
    "load.delay.duplicate_decisions": ("<=", 0.0),
    "load.delay.chain_problems": ("<=", 0.0),
    "load.delay.race.lost": ("<=", 0.0),
}


def _env(url: str, redis_url: str, var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CASEHUB_DB_APP_ROLE", "CASEHUB_DEMO")}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="casehub.settings",
        CASEHUB_VAR_DIR=str(var_dir),
        SECRET_KEY=os.environ.get("SECRET_KEY", "bench-only-not-a-secret"),
        CELERY_BROKER_URL=redis_url,
        # Plain HTTP on loopback: cookies without the Secure flag.
        SECURE_COOKIES="0",
        # Persistent database connections, as a deployment in front of PostgreSQL sets them: a
        # new connection per request costs PostgreSQL a process and, behind the delay proxy,
        # several round trips before the first query.
        CONN_MAX_AGE=os.environ.get("CONN_MAX_AGE", "60"),
    )
    return env


def _child(command: str, env: dict[str, str], var_dir: Path, *args: str) -> dict[str, Any]:
    out = var_dir / f"{command}.json"
    subprocess.run(
        [sys.executable, "-m", "bench.bench_load", command, str(out), *args],
        cwd=ROOT,
        env=env,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _redis_flush(redis_url: str) -> None:
    import redis

    redis.Redis.from_url(redis_url, socket_connect_timeout=5).flushdb()


def _through(url: str, port: int) -> str:
    """Return `url` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _wait_for(port: int, timeout: float = 180.0) -> None:
    """Wait until gunicorn answers /health (200, or 503 before the worker's first heartbeat)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=60):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("gunicorn did not answer /health in time")


def _tracebacks(log: Path) -> int:
    return log.read_text(errors="replace").count("Traceback (most recent call last)")


@contextmanager
def _stack(env: dict[str, str], logs: Path) -> Iterator[int]:
    """Run gunicorn and a Celery worker on `env`, logging to `logs`; yield the web port."""
    port = _free_port()
    web_log = (logs / "gunicorn.log").open("ab")
    worker_log = (logs / "worker.log").open("ab")
    web = subprocess.Popen(
        [
            *(sys.executable, "-m", "gunicorn", "casehub.wsgi:application"),
            *("--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "4"),
            *("--worker-class", "gthread", "--graceful-timeout", "10", "--no-control-socket"),
            *("--log-level", "warning"),
        ],
        cwd=ROOT,
        env=env,
        stdout=web_log,
        stderr=subprocess.STDOUT,
    )
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "casehub", "worker", "--loglevel", "WARNING"),
            *("--pool", "threads", "--concurrency", "2", "--hostname", f"bench-load-{port}@%h"),
            *("--without-mingle", "--without-gossip"),
        ],
        cwd=ROOT,
        env=env,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for(port)
        yield port
    finally:
        for process in (web, worker):
            process.terminate()
        for process in (web, worker):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        web_log.close()
        worker_log.close()


@dataclass(frozen=True)
class Users:
    """How many simulated officers, how they arrive and pause, and on what they run."""

    count: int = USERS
    spawn_rate: float = SPAWN_RATE
    wait: tuple[float, float] = WAIT_S
    threaded: bool = False  # bench/load_threads.py in this process instead of locust


def _users(port: int, seconds: float, seeded: dict[str, Any], var_dir: Path, users: Users) -> Any:
    out = var_dir / "users-out.json"
    config = {
        "host": f"http://127.0.0.1:{port}",
        "users": users.count,
        "spawn_rate": users.spawn_rate,
        "seconds": seconds,
        "wait": users.wait,
        "sign_in_limit": SIGN_IN_LIMIT_S,
        "stop_timeout": 150.0,
        "officers": seeded["officers"],
        "password": PASSWORD,
        "reject_code": seeded["reject_code"],
        "out": str(out),
    }
    if users.threaded:
        from bench.load_threads import run_users

        return run_users(config) | {"users": users.count}
    path = var_dir / "users.json"
    path.write_text(json.dumps(config))
    subprocess.run([sys.executable, "-m", "bench.load_users", str(path)], cwd=ROOT, check=True)
    return json.loads(out.read_text()) | {"users": users.count}


# The race: two officers, one gate, one moment ---------------------------------------------------


class _Session:
    """A signed-in officer on the pages (cookies) and on the API (bearer token)."""

    def __init__(self, port: int, username: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect()
        )
        page = self.opener.open(f"{self.base}/login/", timeout=120).read().decode()
        self._post_form("/login/", {"username": username, "password": PASSWORD}, page)
        body = json.dumps({"username": username, "password": PASSWORD}).encode()
        request = urllib.request.Request(
            f"{self.base}/api/auth/token", data=body, headers={"Content-Type": "application/json"}
        )
        self.token = json.loads(self.opener.open(request, timeout=120).read())["token"]

    def _post_form(self, path: str, fields: dict[str, str], page: str) -> int:
        token = page.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
        body = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(
            f"{self.base}{path}",
            data=body,
            headers={"Referer": f"{self.base}{path}", "Origin": self.base},
        )
        return self._status(request)

    def _status(self, request: urllib.request.Request) -> int:
        try:
            with self.opener.open(request, timeout=120) as response:
                response.read()
                return int(response.status)
        except urllib.error.HTTPError as exc:
            exc.read()
            return int(exc.code)

    def api(self, path: str, payload: Any = None) -> Any:
        request = urllib.request.Request(
            f"{self.base}/api{path}",
            data=None if payload is None else json.dumps(payload).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with self.opener.open(request, timeout=120) as response:
            return json.loads(response.read())

    def api_status(self, path: str, payload: Any) -> int:
        request = urllib.request.Request(
            f"{self.base}/api{path}",
            data=json.dumps(payload).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        return self._status(request)

    def page(self, path: str) -> str:
        with self.opener.open(f"{self.base}{path}", timeout=120) as response:
            return str(response.read().decode())


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 302 is the answer we count, not the page it leads to


def _race_one(first: _Session, second: _Session, gate: dict[str, Any]) -> dict[str, int]:
    """Release the first officer's form post and the second's API call on one gate together."""
    page = first.page(f"/gates/{gate['id']}/")
    form = {
        "decision": "approve",
        "version": str(gate["version"]),
        "content_hash": gate["content_hash"],
        "detail_opened": "1",
    }
    payload = {
        "decision": "approve",
        "version": gate["version"],
        "content_hash": gate["content_hash"],
    }
    statuses: dict[str, int] = {}
    barrier = threading.Barrier(2)

    def by_form() -> None:
        barrier.wait()
        statuses["form"] = first._post_form(f"/gates/{gate['id']}/decide", form, page)

    def by_api() -> None:
        barrier.wait()
        statuses["api"] = second.api_status(f"/gates/{gate['id']}/decision", payload)

    threads = [threading.Thread(target=by_form), threading.Thread(target=by_api)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


def _race(port: int, officers: list[str], races: int = RACES) -> dict[str, int]:
    """Have two officers decide each of `races` pending plan gates at once; count the outcomes."""
    first, second = _Session(port, officers[0]), _Session(port, officers[1])
    listed = first.api("/gates?status=pending&kind=plan&limit=100")
    outcomes: Counter[str] = Counter()
    for gate in [g for g in listed["items"] if not g["decisions"]][:races]:
        statuses = _race_one(first, second, gate)
        won = (statuses.get("form") == 302) + (statuses.get("api") == 200)
        lost = (statuses.get("form") == 409) + (statuses.get("api") == 409)
        outcomes["gates"] += 1
        outcomes["decided"] += won
        outcomes["ok" if (won, lost) == (1, 1) else "lost"] += 1
        if (won, lost) != (1, 1):
            print(f"  race on gate {gate['id']}: {statuses}", flush=True)
    return dict(outcomes)


# Figures ------------------------------------------------------------------------------------


def _percentile(values: list[float], fraction: float) -> float:
    """Return the exact percentile (nearest rank) of `values`."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


SIGN_INS = ("POST /login/ POST", "POST /api/auth/token")


def _figures(
    prefix: str, users: Any, race: dict[str, int], counts: dict[str, Any]
) -> dict[str, float]:
    everything = [r for r in users["requests"] if not r[0].endswith(" /health")]
    health = [r for r in users["requests"] if r[0].endswith(" /health")]
    # The measured requests: browsing and deciding, started once every officer had signed in.
    measured = [r for r in everything if r[3] >= 0 and r[0] not in SIGN_INS]
    times = [ms for _, _, ms, _ in measured]
    sign_ins = [ms for name, _, ms, _ in everything if name in SIGN_INS]
    decided = sum(v for k, v in users["decisions"].items() if k.startswith("decided."))
    actions = decided + race.get("decided", 0)
    statuses = Counter(status for _, status, _, _ in everything)
    seconds = max(users["seconds"], 1e-9)
    figures = {
        f"{prefix}.users": float(users["users"]),
        f"{prefix}.sign_in_s": round(users["sign_in_s"], 1),
        f"{prefix}.sign_in.p95_ms": round(_percentile(sign_ins, 0.95), 1),
        f"{prefix}.seconds": round(users["seconds"], 1),
        f"{prefix}.requests": float(len(measured)),
        f"{prefix}.requests_per_s": round(len(measured) / seconds, 1),
        f"{prefix}.p50_ms": round(_percentile(times, 0.50), 1),
        f"{prefix}.p95_ms": round(_percentile(times, 0.95), 1),
        f"{prefix}.p99_ms": round(_percentile(times, 0.99), 1),
        f"{prefix}.max_ms": round(max(times, default=0.0), 1),
        # Over the whole run, sign-ins included.
        f"{prefix}.5xx": float(sum(n for s, n in statuses.items() if s >= 500)),
        f"{prefix}.no_answer": float(statuses.get(0, 0) + (not users["window_opened"])),
        f"{prefix}.unexpected": float(
            sum(v for k, v in users["decisions"].items() if k.startswith("unexpected."))
        ),
        f"{prefix}.decisions_unanswered": float(
            sum(
                v
                for k, v in users["decisions"].items()
                if k.startswith("unexpected.") and k.endswith(".0")
            )
        ),
        f"{prefix}.conflicts_409": float(
            sum(v for k, v in users["decisions"].items() if k.startswith("conflict."))
        ),
        f"{prefix}.decisions": float(actions),
        f"{prefix}.decided_events": float(counts["decided_events"]),
        f"{prefix}.events_minus_decisions": float(counts["decided_events"] - actions),
        f"{prefix}.decisions_minus_events": float(actions - counts["decided_events"]),
        f"{prefix}.decision_rows": float(counts["decision_rows"]),
        f"{prefix}.duplicate_decisions": float(counts["duplicates"]),
        f"{prefix}.chains_verified": float(counts["chains"]),
        f"{prefix}.chain_problems": float(counts["chain_problems"]),
        f"{prefix}.race.gates": float(race.get("gates", 0)),
        f"{prefix}.race.lost": float(race.get("lost", 0)),
        f"{prefix}.health_503": float(sum(1 for r in health if r[1] == 503)),
        f"{prefix}.health_5xx_other": float(sum(1 for r in health if r[1] >= 500 and r[1] != 503)),
    }
    print(f"  {prefix}: statuses {dict(sorted(statuses.items()))}", flush=True)
    print(f"  {prefix}: decisions {dict(sorted(users['decisions'].items()))}", flush=True)
    print(f"  {prefix}: race {race}; counted {counts}", flush=True)
    by_name: dict[str, list[float]] = {}
    for name, _, ms, start in everything:
        by_name.setdefault(name if start >= 0 else f"{name} (signing in)", []).append(ms)
    for name, values in sorted(by_name.items()):
        print(
            f"    {name:<44} n={len(values):>5}  p50={statistics.median(values):7.1f}  "
            f"p95={_percentile(values, 0.95):7.1f}  max={max(values):7.1f} ms",
            flush=True,
        )
    if users["errors"]:
        print(f"  {prefix}: locust errors {users['errors']}", flush=True)
    return figures


def _phase(
    prefix: str,
    env: dict[str, str],
    seconds: float,
    seeded: dict[str, Any],
    var_dir: Path,
    *,
    app_env: dict[str, str] | None = None,
    users: Users = Users(),
    races: int = RACES,
    fresh: bool = False,
) -> dict[str, float]:
    """Count, run the stack on `app_env` (default `env`) with the users and the race, count again.

    The counts always go to the database directly (`env`), outside the delayed path. `fresh`:
    the database has just been seeded, so nothing has been decided yet (no count before).
    """
    nothing = {"decided_events": 0, "decision_rows": 0}
    before = nothing if fresh else _child("count", env, var_dir)
    logs = var_dir / prefix
    logs.mkdir()
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with _stack(app_env or env, logs) as port:
        print(f"  {prefix}: the stack answers after {time.perf_counter() - started:.1f} s")
        record = _users(port, seconds, seeded, var_dir, users)
        load_after = os.getloadavg()[0]
        race = _race(port, seeded["officers"], races)
        started = time.perf_counter()
    print(f"  {prefix}: the stack stopped in {time.perf_counter() - started:.1f} s", flush=True)
    after = _child("count", env, var_dir)
    tracebacks = {name: _tracebacks(logs / f"{name}.log") for name in ("gunicorn", "worker")}
    print(f"  {prefix}: tracebacks logged {tracebacks}; load average {load:.1f}, {load_after:.1f}")
    for name, count in tracebacks.items():
        if count:
            text = (logs / f"{name}.log").read_text(errors="replace")
            print(text[text.index("Traceback (most recent call last)") :][:15000], flush=True)
    counts = {
        key: after[key] - before[key] if key in ("decided_events", "decision_rows") else after[key]
        for key in after
    }
    return _figures(prefix, record, race, counts) | {
        f"{prefix}.tracebacks_logged": float(sum(tracebacks.values())),
        f"{prefix}.loadavg_1m_before": round(load, 2),
        f"{prefix}.loadavg_1m_after": round(load_after, 2),
    }


def run(minutes: float | None = None) -> dict[str, float]:
    """Run the direct phase and the delayed phase; return their figures."""
    seconds = minutes * 60 if minutes else SHORT_S
    delay_seconds = max(SHORT_DELAY_S, seconds / 5) if minutes else SHORT_DELAY_S
    url = os.environ.get("CASEHUB_BENCH_LOAD_DATABASE_URL", DEFAULT_URL)
    redis_url = os.environ.get("CASEHUB_BENCH_LOAD_REDIS_URL", DEFAULT_REDIS)
    admin_url, name = _admin(url)
    try:
        _recreate(admin_url, name)
        _redis_flush(redis_url)
    except Exception as exc:  # nothing to measure on
        print(f"  SKIPPED bench_load: PostgreSQL or Redis unreachable ({exc}).", flush=True)
        return {}
    figures: dict[str, float] = {}
    proxies = ProxyThread()
    try:
        with tempfile.TemporaryDirectory(prefix="casehub-bench-load-") as tmp:
            var_dir = Path(tmp)
            env = _env(url, redis_url, var_dir)
            cases = math.ceil((seconds + delay_seconds) * CASES_PER_LOAD_S) + 2 * RACES
            started = time.perf_counter()
            seeded = _child("seed", {**env, "CELERY_BROKER_URL": "memory://"}, var_dir, str(cases))
            print(f"  seeded {cases} cases in {time.perf_counter() - started:.1f} s", flush=True)
            figures |= _phase("load", env, seconds, seeded, var_dir)
            db, broker = urlsplit(url), urlsplit(redis_url)
            pg = proxies.add(db.hostname or "127.0.0.1", db.port or 5432, delay_s=DELAY_EACH_WAY_S)
            rd = proxies.add(
                broker.hostname or "127.0.0.1", broker.port or 6379, delay_s=DELAY_EACH_WAY_S
            )
            delayed = {
                **env,
                "DATABASE_URL": _through(url, pg.port),
                "CELERY_BROKER_URL": _through(redis_url, rd.port),
            }
            figures |= _phase("load.delay", env, delay_seconds, seeded, var_dir, app_env=delayed)
            figures["load.delay.added_rtt_ms"] = 2000 * DELAY_EACH_WAY_S
            figures["load.delay.proxied_connections"] = float(pg.connections + rd.connections)
    finally:
        proxies.close()
        if os.environ.get("CASEHUB_BENCH_KEEP_DB") != "1":
            _recreate(admin_url, name, drop_only=True)
            _redis_flush(redis_url)
    return figures


def run_short(
    url: str, redis_url: str, *, seconds: float, users: Users, cases: int, races: int
) -> dict[str, float]:
    """The suite's form (tests/bench/test_load_short.py): the direct phase alone, on `url`.

    The database is dropped and created, the Redis database emptied, before and after, as in
    `run`. Raises when PostgreSQL or Redis cannot be reached: the test has nothing to skip to.
    """
    admin_url, name = _admin(url)
    _recreate(admin_url, name)
    _redis_flush(redis_url)
    try:
        with tempfile.TemporaryDirectory(prefix="casehub-load-short-") as tmp:
            var_dir = Path(tmp)
            env = _env(url, redis_url, var_dir)
            started = time.perf_counter()
            seeded = _child("seed", {**env, "CELERY_BROKER_URL": "memory://"}, var_dir, str(cases))
            print(f"  seeded {cases} cases in {time.perf_counter() - started:.1f} s", flush=True)
            return _phase(
                "load", env, seconds, seeded, var_dir, users=users, races=races, fresh=True
            )
    finally:
        _recreate(admin_url, name, drop_only=True)
        _redis_flush(redis_url)


# The child processes --------------------------------------------------------------------------


def _seed(out: Path, cases: int) -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.core.management import call_command

    from accounts import roles
    from oversight.models import Gate, ReasonCode
    from planning.actions import materialise_plan, submit_case
    from planning.catalogue import load_demo_erp, sync_packs

    call_command("migrate", verbosity=0, interactive=False)
    roles.sync_roles()
    sync_packs()
    load_demo_erp()
    users = get_user_model().objects
    analysts = []
    for i in range(2):
        analyst = users.create_user(f"load-analyst-{i}", password=PASSWORD)
        analyst.groups.add(Group.objects.get(name=roles.ANALYST))
        analysts.append(analyst)
    officers = Group.objects.get(name=roles.OFFICER)
    names = []
    for i in range(OFFICERS):
        officer = users.create_user(
            f"load-officer-{i:02}", password=PASSWORD, first_name="Load", last_name=f"Officer {i}"
        )
        officer.groups.add(officers)
        names.append(officer.username)
    for i in range(cases):
        case = submit_case(
            submitter=analysts[i % 2],
            title=f"Verify INV-1042 ({i})",
            goal="Verify invoice INV-1042",
            domain="invoice",
            strategy="static",
            inputs={"invoice_id": "INV-1042"},
        )
        materialise_plan(case.pk)
    reject = ReasonCode.objects.filter(active=True, applies_to__contains=["reject"]).first()
    if reject is None:
        raise RuntimeError("no active reason code applies to rejections")
    quorums = sorted(set(Gate.objects.values_list("kind", "quorum")))
    out.write_text(
        json.dumps(
            {
                "officers": names,
                "reject_code": reject.code,
                "gates": Gate.objects.count(),
                "quorums": quorums,
            }
        )
    )


def _count(out: Path) -> None:
    import django

    django.setup()
    from django.db.models import Count

    from audit.checkpoints import verify_anchored_chain
    from audit.models import AuditEvent
    from oversight.models import Gate, GateDecision

    decided = AuditEvent.objects.filter(action="oversight.gate.decided")
    events_per_gate = Counter(decided.values_list("data__gate", flat=True))
    rows_per_gate = Counter(GateDecision.objects.values_list("gate_id", flat=True))
    duplicates = GateDecision.objects.values("gate_id", "decider_id").annotate(n=Count("id"))
    duplicates = sum(1 for row in duplicates if row["n"] > 1)
    for gate in Gate.objects.filter(pk__in=list(rows_per_gate)).prefetch_related("decisions"):
        made = [d.decision for d in gate.decisions.all()]
        approvals, rejections = made.count("approve"), made.count("reject")
        if (
            approvals > gate.quorum
            or rejections > 1
            or (rejections and gate.status == "approved")
            or approvals != gate.approvals
            or events_per_gate.get(gate.pk, 0) != len(made)
        ):
            duplicates += 1
    chains = sorted(set(AuditEvent.objects.values_list("chain", flat=True)))
    problems = sum(len(verify_anchored_chain(chain).problems) for chain in chains)
    out.write_text(
        json.dumps(
            {
                "decided_events": decided.count(),
                "decision_rows": sum(rows_per_gate.values()),
                "duplicates": duplicates,
                "chains": len(chains),
                "chain_problems": problems,
                "denied_events": AuditEvent.objects.filter(
                    action="oversight.gate.decision_denied"
                ).count(),
            }
        )
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["seed"]:
        _seed(Path(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1:2] == ["count"]:
        _count(Path(sys.argv[2]))
    else:
        raise SystemExit("usage: python -m bench.bench_load seed OUT.json CASES | count OUT.json")
