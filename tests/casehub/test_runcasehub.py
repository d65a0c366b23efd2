from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from casehub.management.commands.runcasehub import Service, ServiceExited, Supervisor

ROOT = Path(__file__).resolve().parent.parent.parent
SLEEPER = (sys.executable, "-c", "import time; time.sleep(60)")
STUBBORN = (
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True);"
    " time.sleep(60)",
)


def _signal_self_after(delay_s: float, signum: int) -> threading.Timer:
    timer = threading.Timer(delay_s, os.kill, (os.getpid(), signum))
    timer.start()
    return timer


# The supervisor on small stand-in processes -----------------------------------------------------


def test_sigterm_stops_every_service_and_restores_the_signal_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM)
    supervisor = Supervisor(
        services=[Service(name="a", argv=SLEEPER), Service(name="b", argv=SLEEPER)],
        out=io.StringIO(),
    )
    _signal_self_after(1.0, signal.SIGTERM)
    started = time.monotonic()
    supervisor.run()
    assert time.monotonic() - started < 10
    assert supervisor.returncodes == {"a": -signal.SIGTERM, "b": -signal.SIGTERM}
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_service_that_exits_stops_the_others_and_is_reported() -> None:
    out = io.StringIO()
    supervisor = Supervisor(
        services=[
            Service(name="long", argv=SLEEPER),
            Service(name="short", argv=(sys.executable, "-c", "raise SystemExit(3)")),
        ],
        out=out,
    )
    with pytest.raises(ServiceExited, match="short exited with status 3") as excinfo:
        supervisor.run()
    assert excinfo.value.returncode == 3
    assert supervisor.returncodes == {"long": -signal.SIGTERM, "short": 3}
    assert "Started long (pid" in out.getvalue()


def test_a_restartable_service_that_dies_is_started_again_a_bounded_number_of_times() -> None:
    out = io.StringIO()
    supervisor = Supervisor(
        services=[
            Service(name="long", argv=SLEEPER),
            Service(
                name="worker", argv=(sys.executable, "-c", "raise SystemExit(9)"), restart=True
            ),
        ],
        out=out,
    )
    with pytest.raises(ServiceExited, match="worker exited with status 9"):
        supervisor.run()
    assert out.getvalue().count("worker exited with status 9; starting it again.") == 5
    assert out.getvalue().count("Started worker (pid") == 6


def test_a_service_ignoring_sigterm_is_killed_after_the_stop_timeout() -> None:
    out = io.StringIO()
    supervisor = Supervisor(
        services=[Service(name="stubborn", argv=STUBBORN)], out=out, stop_timeout_s=1.0
    )
    _signal_self_after(1.5, signal.SIGINT)
    supervisor.run()
    assert supervisor.returncodes == {"stubborn": -signal.SIGKILL}
    assert "stubborn did not stop within 1 s; killed." in out.getvalue()


def test_a_second_ctrl_c_kills_services_that_are_still_finishing() -> None:
    supervisor = Supervisor(
        services=[Service(name="stubborn", argv=STUBBORN)], out=io.StringIO(), stop_timeout_s=30
    )
    _signal_self_after(1.5, signal.SIGINT)
    _signal_self_after(2.5, signal.SIGINT)
    started = time.monotonic()
    supervisor.run()
    assert time.monotonic() - started < 15
    assert supervisor.returncodes == {"stubborn": -signal.SIGKILL}


# `runcasehub` for real: gunicorn, a Celery worker and Celery beat ------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def _api(base: str, method: str, path: str, body: object = None, token: str = "") -> Any:
    request = urllib.request.Request(
        f"{base}/api{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {token}"} if token else {}),
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def _case_once_not(base: str, token: str, case_id: int, statuses: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        case: dict[str, Any] = _api(base, "GET", f"/cases/{case_id}", token=token)
        if case["status"] not in statuses or time.monotonic() > deadline:
            return case
        time.sleep(0.25)


def _plan_approve_and_run_a_case(base: str, var_dir: Path) -> None:
    """The demo's whole path on its own SQLite database and filesystem broker: submit a case,
    the worker plans it, an officer approves the plan, the worker runs its steps."""
    passwords = json.loads((var_dir / "demo-users.json").read_text())

    def token(username: str) -> str:
        body = {"username": username, "password": passwords[username]}
        return str(_api(base, "POST", "/auth/token", body)["token"])

    analyst, officer, writer = token("analyst"), token("officer"), token("analyst2")
    submitted = _api(
        base,
        "POST",
        "/cases",
        {
            "title": "Embedded mode",
            "goal": "Investigate a suspected duplicate payment to a supplier",
            "domain": "fraud",
            "strategy": "static",
            "inputs": {"account_id": "ACC-410", "amount": 100},
        },
        analyst,
    )
    case = _case_once_not(base, analyst, submitted["id"], {"planning"})
    assert case["status"] == "awaiting_approval", case
    gates = _api(base, "GET", f"/gates?case={case['id']}&status=pending", token=officer)["items"]
    assert [gate["kind"] for gate in gates] == ["plan"]
    decision = {
        "decision": "approve",
        "version": gates[0]["version"],
        "content_hash": gates[0]["content_hash"],
    }
    assert _api(base, "POST", f"/gates/{gates[0]['id']}/decision", decision, officer)["status"] == (
        "approved"
    )
    # No LLM provider in the demo: a person writes up the findings (a work item for a second
    # analyst, as the submitter may not do it), once the tool steps before it ran.
    deadline = time.monotonic() + 60
    items: list[dict[str, Any]] = []
    while not items and time.monotonic() < deadline:
        items = _api(base, "GET", "/work-items?status=open", token=writer)["items"]
        items = [item for item in items if item["case"] == case["id"]]
        if not items:
            time.sleep(0.25)
    assert [item["node"] for item in items] == ["summarise-findings"], items
    output = {"text": "Two payments of 60 to a known merchant; nothing unusual."}
    done = _api(base, "POST", f"/work-items/{items[0]['id']}/complete", {"output": output}, writer)
    assert done["status"] == "completed", done
    running = {"awaiting_approval", "approved", "executing", "verifying"}
    case = _case_once_not(base, analyst, case["id"], running)
    assert case["status"] == "completed", case
    nodes = _api(base, "GET", f"/cases/{case['id']}/plan", token=analyst)["nodes"]
    leaves = [node for node in nodes if node["kind"] == "leaf"]
    assert leaves and all(node["status"] == "succeeded" for node in leaves), leaves


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.integration
def test_runcasehub_serves_plans_and_runs_a_case_on_its_embedded_database_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    port = _free_port()
    var_dir = tmp_path / "var"
    log_path = tmp_path / "run.log"
    # The demo's own embedded database and broker, whatever services the suite itself runs on.
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "SECRET_KEY"}
    }
    env.update(
        CASEHUB_DEMO="1", CASEHUB_VAR_DIR=str(var_dir), DEBUG="0", CASEHUB_RECONCILE_INTERVAL_S="1"
    )
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runcasehub", f"127.0.0.1:{port}"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    pids: dict[str, int] = {}
    left_running: list[str] = []
    try:
        deadline = time.monotonic() + 120
        status = 0
        while time.monotonic() < deadline and process.poll() is None:
            try:
                status, _, body = _get(f"{base}/health")
            except OSError:
                status = 0
            if status == 200:
                break
            time.sleep(0.5)
        output = log_path.read_text(errors="replace")
        assert status == 200, f"not healthy; exit status {process.poll()}:\n{output[-4000:]}"
        assert json.loads(body)["broker"]["transport"] == "filesystem"
        pids = {name: int(pid) for name, pid in re.findall(r"Started (.+?) \(pid (\d+)\)", output)}
        assert set(pids) == {"web server (gunicorn)", "Celery worker", "Celery beat"}
        assert "Demo logins (demo mode only):" in output
        assert b"gunicorn" in Path(f"/proc/{pids['web server (gunicorn)']}/cmdline").read_bytes()

        status, content_type, body = _get(f"{base}/login/")
        assert status == 200
        stylesheets = re.findall(rb'<link rel="stylesheet" href="([^"]+)"', body)
        assert stylesheets, body[:2000]
        for href in stylesheets:
            status, content_type, css = _get(f"{base}{href.decode()}")
            assert (status, content_type.split(";")[0]) == (200, "text/css"), href
            assert css
        assert _get(f"{base}/static/casehub/no-such-file.css")[0] == 404
        # gunicorn lets a request line through up to its largest limit: the API answers a long
        # query string itself, in JSON (gunicorn's own 414 starts at 4,094 bytes by default).
        status, content_type, body = _get(f"{base}/api/cases?q={'x' * 6000}")
        assert (status, content_type) == (414, "application/json"), body[:300]
        assert json.loads(body)["message"].startswith("The query string is longer than")
        # Beat sends the reconciler on its schedule and the worker runs it.
        ran = re.compile(r"Task planning\.reconcile_planning\[[^]]+\] succeeded")
        deadline = time.monotonic() + 60
        while not ran.search(log_path.read_text(errors="replace")):
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-4000:]
            time.sleep(0.5)
        _plan_approve_and_run_a_case(base, var_dir)
        # Beat keeps its schedule under the var directory, not in the working directory.
        assert list(var_dir.glob("celerybeat-schedule*"))
        assert not list(ROOT.glob("celerybeat-schedule*"))

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        left_running = [name for name, pid in pids.items() if _is_running(pid)]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for pid in pids.values():
            if _is_running(pid):
                os.kill(pid, signal.SIGKILL)
    assert "CaseHub stopped." in log_path.read_text(errors="replace")
    assert left_running == []
    with pytest.raises(OSError):
        _get(f"{base}/health")
