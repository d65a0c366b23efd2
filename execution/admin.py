"""Admin registrations of execution's models: workers' heartbeats and agents' trust scores,
both read only; and the agents' pages again, with the trust routing uses next to the trust an
admin sets (planning's admin cannot read what execution learned)."""

from __future__ import annotations

import time
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from execution.actions import effective_trust
from execution.models import TrustScore, WorkerHeartbeat
from execution.trust import evidence_at
from planning.admin import AgentAdmin
from planning.models import Agent


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_module_permission(self, request: HttpRequest) -> bool:
        # Listed in the admin index for those who may view it (admins hold no execution.*
        # model permission, so Django's default would hide the whole app).
        return request.user.has_perm("oversight.configure")


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


def _learned_trust(agent: Agent) -> float:
    # As routing reads it: the lowest over the agent's capabilities (prefetched scores).
    return effective_trust(agent, list(agent.capabilities), list(agent.scores.all()))


admin.site.unregister(Agent)


@admin.register(Agent)
class AgentWithTrustAdmin(AgentAdmin):
    """Planning's agent pages, showing the learned trust routing uses beside the starting trust."""

    def get_list_display(self, request: HttpRequest) -> Any:
        shown: list[Any] = []
        for name in super().get_list_display(request):
            shown += ["starting_trust", "learned_trust"] if name == "trust" else [name]
        return shown

    def get_queryset(self, request: HttpRequest) -> QuerySet[Agent]:
        return super().get_queryset(request).prefetch_related("scores")

    def get_readonly_fields(self, request: HttpRequest, obj: Agent | None = None) -> Any:
        fields = tuple(super().get_readonly_fields(request, obj))
        return (*fields, "learned_trust") if obj is not None else fields

    def get_fieldsets(self, request: HttpRequest, obj: Agent | None = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is None:
            return fieldsets
        return [
            *fieldsets,
            (
                "Learned trust",
                {
                    "fields": ("learned_trust",),
                    "description": "The trust routing uses now: the trust above moved by the "
                    "agent's own outcomes (older ones count less). A failure of the installation "
                    "(no LLM provider) or a passing outage does not move it.",
                },
            ),
        ]

    @admin.display(description="starting trust", ordering="trust")
    def starting_trust(self, agent: Agent) -> str:
        return f"{agent.trust:.2f}"

    @admin.display(description="learned trust (routing)")
    def learned_trust(self, agent: Agent) -> str:
        return f"{_learned_trust(agent):.3f}"
