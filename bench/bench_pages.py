"""The officers' pages through the real server (DESIGN §9): the inbox with 10,000 pending gates
and a gate page, p50 latency (target ≤ 150 ms each) and their SQL query counts.

The bench owns a PostgreSQL database (``CASEHUB_BENCH_PAGES_DATABASE_URL``, default
``casehub_bench_pages``; its name must contain "bench"), dropped and created at the start and
dropped at the end. A child process migrates it, plans one real INV-1042 invoice case (its plan
gate is the gate page measured) and adds ``CASEHUB_BENCH_GATES`` (10,000) pending gates on other
cases in bulk, then counts the queries of both pages with Django's test client. gunicorn (two
gthread workers of four threads, as ``make run`` starts it) then serves the database and the
officer's session requests each page ``ROUNDS`` times after a warm-up; the figures are the medians.

Then the capacity: ``wrk`` (a C load generator, so the client costs the machine little) sends
the officer's reads — the inbox, the gate page, its case page, the notifications — in turn over
``CAPACITY_CONNECTIONS`` connections for ``CASEHUB_BENCH_CAPACITY_S`` seconds, with no pause
between requests; the figure is the requests answered per second (target ≥ 30), with their p50
and p95 at that saturation and the count of answers that were not 200. Without ``wrk`` on the
PATH the capacity is not measured (and says so).
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from bench.bench_audit import _admin, _recreate

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/casehub_bench_pages"
GATES = int(os.environ.get("CASEHUB_BENCH_GATES", "10000"))
ROUNDS = 30
WARMUP = 5
OFFICER = "bench-officer"
# A throwaway account in a throwaway database.
PASSWORD = "bench-only-password-1"  # noqa: S105

TARGETS = {
    "pages.inbox.p50_ms": ("<=", 150.0),
    "pages.gate.p50_ms": ("<=", 150.0),
    # #22: the officers' pages take at least 30 requests a second on this machine, all answered.
    "pages.capacity.requests_per_s": (">=", 30.0),
    "pages.capacity.not_200": ("<=", 0.0),
}
CAPACITY_S = float(os.environ.get("CASEHUB_BENCH_CAPACITY_S", "10"))
CAPACITY_CONNECTIONS = 8  # as many as gunicorn's threads (2 workers x 4): all busy, none idle

# wrk's script: the paths in turn; at the end one line of figures (latencies in microseconds).
# Every answer's status is checked in `response`: only a 200 counts as answered (wrk's own
# error count lets a 3xx through, and a lost session is a redirect to the sign-in page).
_WRK_SCRIPT = """
local paths = {%s}
local i = 0
local not_ok = 0
request = function()
  i = i %% #paths + 1
  return wrk.format("GET", paths[i])
end
response = function(status, headers, body)
  if status ~= 200 then not_ok = not_ok + 1 end
end
done = function(summary, latency, requests)
  io.write(string.format("CAPACITY %%d %%d %%d %%d %%d\\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(95), not_ok))
end
"""


def _env(url: str, var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CASEHUB_DB_APP_ROLE", "CASEHUB_DEMO")}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="casehub.settings",
        CASEHUB_VAR_DIR=str(var_dir),
        SECRET_KEY=os.environ.get("SECRET_KEY", "bench-only-not-a-secret"),
        CELERY_BROKER_URL="memory://",
        # Plain HTTP on loopback: cookies without the Secure flag.
        SECURE_COOKIES="0",
    )
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers (503 while no Celery worker reports: none runs here)
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not answer /health in time")


def _login(port: int, jar: http.cookiejar.CookieJar | None = None) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar() if jar is None else jar
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    base = f"http://127.0.0.1:{port}"
    page = opener.open(f"{base}/login/").read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    if token is None:
        raise RuntimeError("no CSRF token on the login page")
    body = urllib.parse.urlencode(
        {"username": OFFICER, "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)}
    ).encode()
    request = urllib.request.Request(
        f"{base}/login/", data=body, headers={"Referer": f"{base}/login/", "Origin": base}
    )
    try:
        opener.open(request).read()
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"login answered {exc.code}: {exc.read()[:300]!r}") from None
    if not any(cookie.name == "sessionid" for cookie in jar):
        raise RuntimeError("the bench officer could not log in")
    return opener


def _p50_ms(opener: urllib.request.OpenerDirector, url: str) -> float:
    for _ in range(WARMUP):
        opener.open(url).read()
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        with opener.open(url) as response:
            response.read()
            if response.status != 200:
                raise RuntimeError(f"{url} answered {response.status}")
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def run() -> dict[str, float]:
    """Return the p50 of the inbox and of a gate page, and their query counts."""
    url = os.environ.get("CASEHUB_BENCH_PAGES_DATABASE_URL", DEFAULT_URL)
    admin_url, name = _admin(url)
    try:
        _recreate(admin_url, name)
    except Exception as exc:  # no server to measure on
        print(f"  SKIPPED bench_pages: PostgreSQL unreachable at {admin_url} ({exc}).", flush=True)
        return {}
    try:
        with tempfile.TemporaryDirectory(prefix="casehub-bench-pages-") as tmp:
            var_dir = Path(tmp)
            env = _env(url, var_dir)
            out = var_dir / "seed.json"
            subprocess.run(
                [sys.executable, "-m", "bench.bench_pages", "seed", str(out)],
                cwd=ROOT,
                env=env,
                check=True,
            )
            seeded: dict[str, Any] = json.loads(out.read_text())
            port = _free_port()
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    "casehub.wsgi:application",
                    "--bind",
                    f"127.0.0.1:{port}",
                    "--workers",
                    "2",
                    "--threads",
                    "4",
                    "--worker-class",
                    "gthread",
                    "--log-level",
                    "warning",
                ],
                cwd=ROOT,
                env=env,
            )
            try:
                _wait_for(port)
                jar = http.cookiejar.CookieJar()
                opener = _login(port, jar)
                base = f"http://127.0.0.1:{port}"
                inbox = _p50_ms(opener, f"{base}/inbox/")
                gate = _p50_ms(opener, f"{base}/gates/{seeded['gate']}/")
                paths = [
                    "/inbox/",
                    f"/gates/{seeded['gate']}/",
                    f"/cases/{seeded['case']}/",
                    "/notifications/",
                ]
                for path in paths:  # each answers the officer, before the load
                    with opener.open(f"{base}{path}") as response:
                        if response.status != 200 or response.url != f"{base}{path}":
                            raise RuntimeError(f"{path} answered {response.status}")
                capacity = _capacity(base, jar, paths)
            finally:
                server.terminate()
                server.wait(timeout=30)
    finally:
        if os.environ.get("CASEHUB_BENCH_KEEP_DB") != "1":
            _recreate(admin_url, name, drop_only=True)
    return {
        "pages.inbox.p50_ms": inbox,
        "pages.gate.p50_ms": gate,
        "pages.inbox.queries": float(seeded["inbox_queries"]),
        "pages.gate.queries": float(seeded["gate_queries"]),
        "pages.inbox.pending_gates": float(seeded["pending"]),
        **capacity,
    }


def _capacity(base: str, jar: http.cookiejar.CookieJar, paths: list[str]) -> dict[str, float]:
    """Return the requests per second wrk gets answered over the paths in turn, with latencies."""
    wrk = shutil.which("wrk")
    if wrk is None:
        print("  capacity not measured: wrk is not on the PATH (apt install wrk)", flush=True)
        return {}
    cookie = "; ".join(f"{c.name}={c.value}" for c in jar)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_WRK_SCRIPT % ", ".join(json.dumps(path) for path in paths))
    try:
        result = subprocess.run(
            [
                wrk,
                *("--threads", "1", "--connections", str(CAPACITY_CONNECTIONS)),
                *("--duration", f"{CAPACITY_S:g}s", "--timeout", "10s"),
                *("--header", f"Cookie: {cookie}", "--script", script.name, base),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        os.unlink(script.name)
    line = next(ln for ln in result.stdout.splitlines() if ln.startswith("CAPACITY "))
    requests, duration_us, p50_us, p95_us, not_ok = (int(v) for v in line.split()[1:])
    per_s = requests / (duration_us / 1e6)
    print(
        f"  capacity: {per_s:.1f} requests/s over {CAPACITY_CONNECTIONS} connections "
        f"(p50 {p50_us / 1000:.0f} ms, p95 {p95_us / 1000:.0f} ms, {not_ok} not 200)",
        flush=True,
    )
    return {
        "pages.capacity.requests_per_s": round(per_s, 1),
        "pages.capacity.p50_ms": round(p50_us / 1000, 1),
        "pages.capacity.p95_ms": round(p95_us / 1000, 1),
        "pages.capacity.not_200": float(not_ok),
        "pages.capacity.connections": float(CAPACITY_CONNECTIONS),
    }


# The child process --------------------------------------------------------------------------


def _seed(out: Path) -> None:
    import django

    django.setup()
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from accounts import roles
    from oversight.models import Gate, GateKind, GateStatus
    from planning.actions import materialise_plan, submit_case
    from planning.catalogue import load_demo_erp, sync_packs
    from planning.models import Case, PlanVersion

    call_command("migrate", verbosity=0, interactive=False)
    roles.sync_roles()
    sync_packs()
    load_demo_erp()
    users = get_user_model().objects
    analyst = users.create_user("bench-analyst", password=PASSWORD)
    analyst.groups.add(Group.objects.get(name=roles.ANALYST))
    officer = users.create_user(OFFICER, password=PASSWORD, first_name="Bench", last_name="Officer")
    officers = Group.objects.get(name=roles.OFFICER)
    officer.groups.add(officers)
    real = submit_case(
        submitter=analyst,
        title="Verify INV-1042",
        goal="Verify invoice INV-1042",
        domain="invoice",
        strategy="static",
        inputs={"invoice_id": "INV-1042"},
    )
    materialise_plan(real.pk)
    real.refresh_from_db()
    plan_gate = Gate.objects.get(version=real.current_version, kind=GateKind.PLAN)
    # Synthetic cases, each with a one-version plan and a pending plan gate, in bulk.
    now = timezone.now()
    cases = Case.objects.bulk_create(
        Case(
            title=f"Bench case {i}",
            goal="Verify an invoice",
            domain="invoice",
            strategy="static",
            submitter=analyst,
            status="awaiting_approval",
        )
        for i in range(GATES - 1)
    )
    versions = PlanVersion.objects.bulk_create(
        PlanVersion(case=c, number=1, strategy="static", content_hash=f"{c.pk:064x}") for c in cases
    )
    for case, version in zip(cases, versions, strict=True):
        case.current_version = version
    Case.objects.bulk_update(cases, ["current_version"], batch_size=1000)
    Gate.objects.bulk_create(
        (
            Gate(
                case=c,
                version=v,
                kind=GateKind.PLAN,
                status=GateStatus.PENDING,
                reason="every plan version is approved before any step runs",
                approver_group=officers,
                content_hash=v.content_hash,
                opened_at=now,
                remind_at=now,
                deadline=now + timedelta(minutes=i),
            )
            for i, (c, v) in enumerate(zip(cases, versions, strict=True))
        ),
        batch_size=1000,
    )
    # Fresh statistics, as autovacuum keeps them on a live database after a bulk load.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(officer)
    counts = {}
    for key, path in (("inbox_queries", "/inbox/"), ("gate_queries", f"/gates/{plan_gate.pk}/")):
        client.get(path)  # warm caches (content types, sessions)
        with CaptureQueriesContext(connection) as queries:
            response = client.get(path)
        if response.status_code != 200:
            raise RuntimeError(f"{path} answered {response.status_code}")
        counts[key] = len(queries)
    pending = Gate.objects.filter(status=GateStatus.PENDING).count()
    out.write_text(
        json.dumps({"gate": plan_gate.pk, "case": plan_gate.case_id, "pending": pending, **counts})
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["seed"]:
        _seed(Path(sys.argv[2]))
    else:
        raise SystemExit("usage: python -m bench.bench_pages seed OUT.json")
