from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from execution.models import WorkerHeartbeat
from oversight.tasks import ping
from tests import personas

pytestmark = pytest.mark.integration


def test_a_task_round_trips_through_a_real_worker_on_the_same_database(worker_process) -> None:
    personas.analyst("roundtrip")
    result = ping.apply_async(args=["roundtrip"]).get(timeout=30)
    assert result["user_exists"] is True
    assert result["database"] == connection.vendor
    assert worker_process.env["DATABASE_URL"]
    assert settings.CELERY_BROKER_URL.split("://")[0] in {"filesystem", "redis", "amqp"}


def test_health_turns_ok_once_the_worker_beats(worker_process) -> None:
    deadline = time.monotonic() + 20
    while not WorkerHeartbeat.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    response = Client().get("/health")
    assert response.status_code == 200, response.content
    assert response.json()["worker"]["alive"] >= 1


def test_a_worker_stopped_cleanly_takes_its_heartbeat_and_health_degrades(worker_process) -> None:
    deadline = time.monotonic() + 20
    while not WorkerHeartbeat.objects.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert WorkerHeartbeat.objects.filter(pid=worker_process.process.pid).exists()
    worker_process.stop()
    assert worker_process.process.returncode == 0, worker_process.log()[-4000:]
    assert not WorkerHeartbeat.objects.exists()
    response = Client().get("/health")
    assert response.status_code == 503
    assert response.json()["worker"] == {"ok": False, "alive": 0, "workers": []}


def _sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        (sessions,) = cursor.fetchone()
    return int(sessions)


def test_a_worker_keeps_its_database_connections_from_task_to_task(worker_process) -> None:
    # Celery's Django fixup would close them after every task: a new server process a task.
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL counts the sessions opened on a database")
    personas.analyst("kept")
    ping.apply_async(args=["kept"]).get(timeout=30)
    before = _sessions()
    for _ in range(24):
        ping.apply_async(args=["kept"]).get(timeout=30)
    # The worker's pool has four threads, each with a connection of its own, opened once.
    assert _sessions() - before <= 4
