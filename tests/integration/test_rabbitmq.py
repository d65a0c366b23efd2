"""RELIABILITY F2: the execution fault tests on RabbitMQ (quorum queues, publisher confirms).

`tests/integration/test_execution_faults.py` runs again, in a pytest of its own whose environment
names RabbitMQ as the broker. The test process and every worker it starts then configure Celery
from `casehub/settings.py` exactly as a deployment on RabbitMQ does: quorum queues, confirmed
publishes, and a retry's backoff held by RabbitMQ (native delayed delivery). A virtual host of its
own, made for the run and deleted after it, keeps the run apart from anything else on the broker.

With them runs `rabbitmq_broker_faults.py`: RabbitMQ stopped and started with leaves queued (E3)
and a plan approved while it is down (E4), through `rabbitmqctl stop_app` and `start_app`.

The rows it covers on RabbitMQ: E1 to E6 and E8 to E12, S11 and O11 (and P2's thousand leaves).
E7, a leaf longer than Redis's visibility timeout, is Redis's own: RabbitMQ redelivers a message
only when the connection of the worker holding it closes (E1 and E10 cover that).

It runs when CASEHUB_TEST_RABBITMQ names the node (host:port; CI names 127.0.0.1:5672), and skips
otherwise. The inner run's database is the outer run's kind: on PostgreSQL it forbids skips; on
SQLite the fault tests that need PostgreSQL skip there as they do in the outer run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RABBITMQCTL = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
# host:port of a RabbitMQ node whose `rabbitmqctl` this machine runs: the test runs only when it
# is named (CI names it and forbids skips), as the Redis broker's fault tests run only on Redis.
RABBITMQ = os.environ.get("CASEHUB_TEST_RABBITMQ", "")


def _ctl(*args: str) -> str:
    done = subprocess.run(
        [RABBITMQCTL, "--quiet", *args], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"rabbitmqctl {' '.join(args)} failed: {done.stdout}{done.stderr}")
    return done.stdout


def _answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def vhost() -> Iterator[str]:
    """A RabbitMQ virtual host of this test's own, the guest user allowed on it."""
    # Nothing configured (a newcomer's `make test`) skips; CI runs it, skips forbidden.
    if not RABBITMQ:
        pytest.skip("CASEHUB_TEST_RABBITMQ (host:port) names no RabbitMQ to run on (CI names one)")
    if not Path(RABBITMQCTL).exists():
        pytest.fail(f"{RABBITMQCTL} is missing: these tests make a virtual host of their own")
    if not _answers(RABBITMQ):
        pytest.fail(f"CASEHUB_TEST_RABBITMQ names {RABBITMQ}, where no RabbitMQ answers")
    name = f"casehub-f2-{uuid.uuid4().hex[:8]}"
    _ctl("add_vhost", name)
    try:
        _ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield name
    finally:
        _ctl("delete_vhost", name)


def _on_postgresql() -> bool:
    return os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))


def _database_url(tmp_path: Path) -> str:
    """The outer run's database server, under a database name of the inner run's own."""
    url = os.environ.get("DATABASE_URL", "")
    if not _on_postgresql():
        return f"sqlite:///{tmp_path / 'f2.sqlite3'}"
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}_f2"))


def _queues(vhost: str) -> dict[str, str]:
    out = _ctl("list_queues", "-p", vhost, "--no-table-headers", "name", "type")
    return dict(line.split("\t")[:2] for line in out.splitlines() if "\t" in line)


def _exchanges(vhost: str) -> dict[str, str]:
    out = _ctl("list_exchanges", "-p", vhost, "--no-table-headers", "name", "type")
    return dict(line.split("\t")[:2] for line in out.splitlines() if "\t" in line)


@pytest.mark.scenario("F2")
def test_the_execution_fault_tests_pass_on_rabbitmq_with_quorum_queues(
    vhost: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "CELERY_BROKER_URL": f"amqp://guest:guest@{RABBITMQ}/{vhost}",
        "DATABASE_URL": _database_url(tmp_path),
        # On SQLite the fault tests that need PostgreSQL skip, as they do in the outer run.
        "CASEHUB_FAIL_ON_SKIP": "1" if _on_postgresql() else "0",
        "CASEHUB_VAR_DIR": str(tmp_path / "var"),
    }
    env.pop("PYTEST_CURRENT_TEST", None)
    log = tmp_path / "faults-on-rabbitmq.log"
    with log.open("wb") as out:
        done = subprocess.run(
            [
                sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                "tests/integration/test_execution_faults.py",
                "tests/integration/rabbitmq_broker_faults.py",
            ],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=1800, check=False,
        )  # fmt: skip
    report = log.read_text(errors="replace")
    assert done.returncode == 0, report[-8000:]
    assert " passed" in report, report[-2000:]
    skips = [line for line in report.splitlines() if line.startswith("SKIPPED")]
    if _on_postgresql():
        assert skips == [] and "skipped" not in report, report[-2000:]
    else:
        assert all("PostgreSQL" in line for line in skips), skips
    # The run went through RabbitMQ as configured: Celery's queue is a quorum queue, and the
    # backoffs (E8, S11) went through the topic exchanges of native delayed delivery.
    assert _queues(vhost).get("celery") == "quorum", _queues(vhost)
    exchanges = _exchanges(vhost)
    assert exchanges.get("celery") == "topic", exchanges
    assert exchanges.get("celery_delayed_27") == "topic", exchanges
