"""Workers' heartbeats: recorded by the Celery bootstep (`execution.bootsteps`), read by
GET /health."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
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


def worker_status() -> dict[str, object]:
    """Return the workers whose heartbeat is fresh, for GET /health (ok: at least one)."""
    stale_after = timedelta(seconds=settings.CASEHUB_HEARTBEAT_STALE_S)
    try:
        beats = list(WorkerHeartbeat.objects.order_by("-last_seen")[:20])
    except Exception as exc:
        return {"ok": False, "workers": [], "error": type(exc).__name__}
    now = timezone.now()
    alive = [b for b in beats if now - b.last_seen <= stale_after]
    return {
        "ok": bool(alive),
        "alive": len(alive),
        "workers": [
            {
                "hostname": b.hostname,
                "last_seen": b.last_seen.isoformat(),
                "age_s": round((now - b.last_seen).total_seconds(), 1),
            }
            for b in beats
        ],
    }
