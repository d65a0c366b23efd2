"""The officers' pages through the real server (DESIGN §9): the inbox with 10,000 pending gates
and a gate page, p50 latency (target ≤ 150 ms each) and their SQL query counts.

The bench owns a PostgreSQL database (``CASEHUB_BENCH_PAGES_DATABASE_URL``, default
``casehub_bench_pages``; its name must contain "bench"), dropped and created at the start and
dropped at the end. A child process migrates it, plans one real INV-1042 invoice case (its plan
gate is the gate page measured) and adds ``CASEHUB_BENCH_GATES`` (10,000) pending gates on other
cases in bulk, then counts the queries of both pages with Django's test client. gunicorn (two
workers, as ``make run`` starts it) then serves the database and the officer's session requests
each page ``ROUNDS`` times after a warm-up; the figures are the medians.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
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
}


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


def _login(port: int) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
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
                    "--log-level",
                    "warning",
                ],
                cwd=ROOT,
                env=env,
            )
            try:
                _wait_for(port)
                opener = _login(port)
                base = f"http://127.0.0.1:{port}"
                inbox = _p50_ms(opener, f"{base}/inbox/")
                gate = _p50_ms(opener, f"{base}/gates/{seeded['gate']}/")
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
    out.write_text(json.dumps({"gate": plan_gate.pk, "pending": pending, **counts}))


if __name__ == "__main__":
    if sys.argv[1:2] == ["seed"]:
        _seed(Path(sys.argv[2]))
    else:
        raise SystemExit("usage: python -m bench.bench_pages seed OUT.json")
