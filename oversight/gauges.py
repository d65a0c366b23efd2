"""What /metrics reads of this app's rows: decided gates' times. Registered with observability
at start-up (apps.py), which imports no app."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from oversight.models import Gate


def gate_times(gate_ids: list[int]) -> Iterable[tuple[str, str, Any, Any]]:
    """Return (kind, status, opened_at, decided_at) of the decided gates among `gate_ids`."""
    return Gate.objects.filter(pk__in=gate_ids, decided_at__isnull=False).values_list(
        "kind", "status", "opened_at", "decided_at"
    )
