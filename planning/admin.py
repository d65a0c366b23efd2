"""Admin pages for agents, tool risk classes and domain packs; every change is audited.

The admin saves inside one transaction per change (Django's changeform view is atomic), and the
audit event is appended from `save_model`, so the row and its event commit or roll back together.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth.models import Group
from django.db.models import Model
from django.http import HttpRequest, HttpResponse

from accounts.roles import ANALYST, NoRoleAllows
from audit.chain import append_event
from planning.models import Agent, DomainPack, Tool

AGENT_FIELDS = (
    "name",
    "description",
    "kind",
    "capabilities",
    "tools",
    "trust",
    "model",
    "system_prompt",
    "enabled",
)


# A human agent's work-item group is stored as its capability `group:<name>`
# (execution.runners.human reads it); the form shows it as a field of its own.
GROUP_CAPABILITY = "group:"


# Where tools and packs come from, for an admin who tries to add one here.
FROM_CODE = (
    "come from the domain packs, which are written in code: CaseHub's own in planning/packs, and "
    "more named by the CASEHUB_EXTRA_PACKS setting. Each is registered when the database is "
    "migrated (make run does it) and then listed here, where you {can}."
)
NO_ADDED_TOOL = "Tools are not added here. They " + FROM_CODE.format(can="set a tool's risk class")
NO_ADDED_PACK = "Packs are not added here. They " + FROM_CODE.format(can="enable or disable a pack")


def _changes(before: Model | None, after: Model, fields: tuple[str, ...]) -> dict[str, Any]:
    """Return {field: {"before": old, "after": new}} for the fields whose value changed."""
    changes: dict[str, Any] = {}
    for name in fields:
        new = getattr(after, name)
        old = getattr(before, name) if before is not None else None
        if before is None or old != new:
            changes[name] = {"before": old, "after": new}
    return changes


def _stored(model: type[Model], obj: Model) -> Model | None:
    if obj.pk is None:
        return None
    return model._default_manager.filter(pk=obj.pk).first()


def _is_group(capability: Any) -> bool:
    return isinstance(capability, str) and capability.startswith(GROUP_CAPABILITY)


def _string_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise forms.ValidationError(f'Enter a JSON list of {what}, like ["erp.read"].')
    return [v.strip() for v in value]


class AgentForm(forms.ModelForm):
    work_item_group = forms.ModelChoiceField(
        queryset=Group.objects.order_by("name"),
        to_field_name="name",
        required=False,
        label="Work-item group",
        empty_label=f"{ANALYST} (the default)",
        help_text="Human agents only: the user group whose members do the agent's work items.",
    )

    class Meta:
        model = Agent
        fields = ("slug", *AGENT_FIELDS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        groups = [c for c in self.instance.capabilities or [] if _is_group(c)]
        if groups and not self.is_bound:
            self.initial["work_item_group"] = groups[0].removeprefix(GROUP_CAPABILITY)
            # The group has its own field: the capability list shows the others.
            self.initial["capabilities"] = [
                c for c in self.instance.capabilities if not _is_group(c)
            ]

    def clean_capabilities(self) -> list[str]:
        names = _string_list(self.cleaned_data.get("capabilities"), "capability names")
        return [name for name in names if not _is_group(name)]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        group = cleaned.get("work_item_group")
        if group is None or "capabilities" not in cleaned:
            return cleaned
        if cleaned.get("kind") != Agent.Kind.HUMAN:
            self.add_error("work_item_group", "Only a human agent has a work-item group.")
        else:
            cleaned["capabilities"] = [*cleaned["capabilities"], GROUP_CAPABILITY + group.name]
        return cleaned

    def clean_tools(self) -> list[str]:
        names = _string_list(self.cleaned_data.get("tools"), "tool names")
        known = set(Tool.objects.filter(name__in=names).values_list("name", flat=True))
        unknown = [name for name in names if name not in known]
        if unknown:
            raise forms.ValidationError(f"Unknown tools: {', '.join(unknown)}.")
        return names


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    form = AgentForm
    list_display = ("slug", "name", "kind", "trust", "model", "enabled", "pack")
    list_filter = ("kind", "enabled", "pack")
    search_fields = ("slug", "name", "description")
    fieldsets = (
        (None, {"fields": ("slug", "name", "description", "kind", "enabled")}),
        ("Capabilities and tools", {"fields": ("capabilities", "tools", "trust")}),
        ("LLM agents", {"fields": ("model", "system_prompt")}),
        ("Human agents", {"fields": ("work_item_group",)}),
    )

    def get_readonly_fields(self, request: HttpRequest, obj: Agent | None = None) -> Any:
        # Plans refer to agents by slug, so an existing agent keeps its slug.
        return ("slug",) if obj is not None else ()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Agent, form: Any, change: bool) -> None:
        before = _stored(Agent, obj) if change else None
        super().save_model(request, obj, form, change)
        changes = _changes(before, obj, AGENT_FIELDS)
        if change and not changes:
            return
        append_event(
            "config.agent.changed" if change else "config.agent.created",
            actor=request.user,
            data={"agent": obj.slug, "changes": changes},
        )


@admin.register(Tool)
class ToolAdmin(admin.ModelAdmin):
    list_display = ("name", "risk", "pack", "description")
    list_filter = ("risk", "pack")
    search_fields = ("name", "description")
    fields = ("name", "description", "pack", "risk")
    readonly_fields = ("name", "description", "pack")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tools are registered in code

    def add_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        raise NoRoleAllows(NO_ADDED_TOOL)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Tool, form: Any, change: bool) -> None:
        before = _stored(Tool, obj)
        super().save_model(request, obj, form, change)
        changes = _changes(before, obj, ("risk",))
        if changes:
            append_event(
                "config.tool.risk_changed",
                actor=request.user,
                data={"tool": obj.name, "changes": changes},
            )


@admin.register(DomainPack)
class DomainPackAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "enabled")
    list_filter = ("enabled",)
    fields = ("slug", "name", "description", "enabled")
    readonly_fields = ("slug", "name", "description")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # packs are registered in code

    def add_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        raise NoRoleAllows(NO_ADDED_PACK)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: DomainPack, form: Any, change: bool) -> None:
        before = _stored(DomainPack, obj)
        super().save_model(request, obj, form, change)
        changes = _changes(before, obj, ("enabled",))
        if changes:
            append_event(
                "config.pack.changed",
                actor=request.user,
                data={"pack": obj.slug, "changes": changes},
            )
