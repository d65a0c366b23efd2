"""What /metrics reads of this app's rows: worker heartbeats and open leaves. Registered with
observability at start-up (apps.py), which imports no app."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q
from django.utils import timezone

from execution.models import WorkerHeartbeat
from planning.models import NodeStatus, PlanNode


def heartbeats() -> list[tuple[str, Any]]:
    """Return every worker's (hostname, last_seen), by hostname."""
    return list(WorkerHeartbeat.objects.order_by("hostname").values_list("hostname", "last_seen"))


def open_leaves() -> dict[str, int]:
    """Count the leaves ready, retrying, running, and running past their lease (stuck)."""
    now = timezone.now()
    running = Q(status=NodeStatus.RUNNING)
    # Only the leaves in flight, which a partial index holds however many plans exist.
    in_flight = (NodeStatus.READY, NodeStatus.RUNNING, NodeStatus.RETRYING)
    return PlanNode.objects.filter(status__in=in_flight, kind="leaf").aggregate(
        ready=Count("pk", filter=Q(status=NodeStatus.READY)),
        retrying=Count("pk", filter=Q(status=NodeStatus.RETRYING)),
        running=Count("pk", filter=running),
        stuck=Count("pk", filter=running & Q(lease_until__lt=now)),
    )
