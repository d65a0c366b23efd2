from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from execution.heartbeats import record_worker_heartbeat
from execution.models import WorkerHeartbeat

pytestmark = pytest.mark.django_db


def test_health_is_public_and_degraded_without_a_worker() -> None:
    response = Client().get("/health")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded"
    assert body["database"]["ok"] is True
    assert body["broker"]["ok"] is True
    # the kind of broker, as its URL names it (not a transport class)
    assert body["broker"]["transport"] == settings.CELERY_BROKER_URL.split("://")[0]
    assert body["worker"]["ok"] is False


def test_health_is_ok_with_a_fresh_heartbeat() -> None:
    record_worker_heartbeat(hostname="w1@host", pid=123)
    response = Client().get("/health")
    assert response.status_code == 200
    assert response.json()["worker"]["alive"] == 1


def test_a_stale_heartbeat_does_not_count() -> None:
    record_worker_heartbeat(hostname="w1@host", pid=123)
    WorkerHeartbeat.objects.update(last_seen=timezone.now() - timedelta(minutes=5))
    body = Client().get("/health").json()
    assert body["worker"]["ok"] is False
    assert body["worker"]["workers"][0]["hostname"] == "w1@host"
