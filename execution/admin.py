"""Admin registrations of execution's models: workers' heartbeats and agents' trust scores,
both read only."""

from __future__ import annotations

import time
from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from execution.actions import effective_trust
from execution.models import TrustScore, WorkerHeartbeat
from execution.trust import evidence_at


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    list_display = ("hostname", "pid", "started_at", "last_seen")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("oversight.configure")


@admin.register(TrustScore)
class TrustScoreAdmin(ReadOnlyAdmin):
    """Learned trust per agent and capability, read only: outcomes of runs write it."""

    list_display = (
        "agent",
        "capability",
        "recent_successes",
        "recent_failures",
        "current_trust",
        "updated_at",
    )
    # The stored sums are time-weighted (they grow with time); an admin reads decayed counts.
    exclude = ("successes", "failures")
    readonly_fields = ("recent_successes", "recent_failures", "current_trust")
    list_filter = ("agent",)
    list_select_related = ("agent",)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("oversight.configure")

    @admin.display(description="successes (decayed)")
    def recent_successes(self, score: TrustScore) -> str:
        return f"{evidence_at(score.successes, score.failures, time.time()).successes:.1f}"

    @admin.display(description="failures (decayed)")
    def recent_failures(self, score: TrustScore) -> str:
        return f"{evidence_at(score.successes, score.failures, time.time()).failures:.1f}"

    @admin.display(description="current trust")
    def current_trust(self, score: TrustScore) -> str:
        # The trust routing uses now: the agent's prior and this capability's decayed evidence.
        return f"{effective_trust(score.agent, [score.capability]):.3f}"
