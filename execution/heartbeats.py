"""Oversight use cases. Each state change runs in a transaction and writes its audit event."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from execution.models import WorkerHeartbeat


@transaction.atomic
def record_worker_heartbeat(*, hostname: str, pid: int) -> WorkerHeartbeat:
    """Note that a worker is alive now (not audited: it changes no case or configuration)."""
    now = timezone.now()
    beat, created = WorkerHeartbeat.objects.get_or_create(
        hostname=hostname, defaults={"pid": pid, "started_at": now, "last_seen": now}
    )
    if not created:
        if beat.pid != pid:
            beat.started_at = now
        beat.pid = pid
        beat.last_seen = now
        beat.save(update_fields=["pid", "started_at", "last_seen"])
    return beat


@transaction.atomic
def forget_worker(*, hostname: str) -> None:
    """Remove a worker's heartbeat when it shuts down cleanly."""
    WorkerHeartbeat.objects.filter(hostname=hostname).delete()
