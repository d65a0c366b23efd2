"""Admin registrations. Audit events are not registered: auditors read them in the app and
nobody edits them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from oversight.models import WorkerHeartbeat


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


admin.site.site_header = "CaseHub administration"
admin.site.site_title = "CaseHub admin"
