"""Admin registrations. Audit events are not registered: auditors read them in the app and
nobody edits them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth.forms import PasswordChangeForm
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.forms import Form
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from accounts.tokens import revoke_api_tokens
from audit.chain import SYSTEM_CHAIN, append_event
from oversight.actions.gate_policy import active_policy
from oversight.actions.gates import ReasonInvalid
from oversight.actions.policies import (
    PolicyConflict,
    PolicyDenied,
    PolicyInvalid,
    add_reason_code,
    approve_policy,
    change_reason_code,
    propose_policy,
    reject_policy,
)
from oversight.actions.whatif import DEFAULT_DAYS, request_whatif
from oversight.forms import (
    SETTING_HELP,
    PolicyActionForm,
    PolicyProposalForm,
    ReasonCodeForm,
    WhatIfForm,
)
from oversight.models import PolicyVersion, PolicyWhatIf, ReasonCode
from oversight.policy import PolicySettings, loosening
from oversight.whatif import CHANGE_LABELS, CHANGES, totals_from

# Gating policy versions and reason codes (RELIABILITY R6, R10, O10) -------------------------

CONFIGURE = "oversight.configure"


def _may_configure(request: HttpRequest) -> bool:
    return request.user.is_active and request.user.has_perm(CONFIGURE)


def _shown(value: Any) -> str:
    if isinstance(value, tuple | list):
        return ", ".join(str(v) for v in value) or "(none)"
    return str(value)


def settings_table(settings: PolicySettings, compare: PolicySettings | None = None) -> str:
    """Return the settings as an HTML table; with `compare`, a column of its differing values."""
    mine, theirs = settings.as_data(), compare.as_data() if compare is not None else None
    rows = format_html_join(
        "",
        "<tr><th>{}</th><td>{}</td>{}<td>{}</td></tr>",
        (
            (
                name,
                _shown(mine[name]),
                format_html(
                    "<td>{}</td>", "" if theirs[name] == mine[name] else _shown(theirs[name])
                )
                if theirs is not None
                else "",
                text,
            )
            for name, text in SETTING_HELP.items()
        ),
    )
    other = format_html("<th>{}</th>", "Active value (when different)") if theirs else ""
    return format_html(
        '<table class="policy-settings"><thead><tr><th>Setting</th><th>Value</th>{}'
        "<th>Meaning</th></tr></thead><tbody>{}</tbody></table>",
        other,
        rows,
    )


def _stored_settings(version: PolicyVersion) -> PolicySettings:
    try:
        return PolicySettings.from_data(version.values)
    except ValueError:
        return PolicySettings()


def _labelled_totals(report: PolicyWhatIf | None) -> list[tuple[str, str, int]]:
    if report is None:
        return []
    totals = totals_from(report.summary or {})
    return [(kind, CHANGE_LABELS[kind], totals[kind]) for kind in CHANGES]


@admin.register(PolicyVersion)
class PolicyVersionAdmin(admin.ModelAdmin):
    """Versions are immutable: "add" proposes a new one; pending ones are approved or rejected."""

    list_display = (
        "number",
        "status",
        "proposed_by",
        "approved_by",
        "loosens",
        "whatif_link",
        "reason_code",
        "created_at",
        "activated_at",
    )
    list_filter = ("status", "loosens")
    ordering = ("-number",)
    fields = (
        "number",
        "status",
        "proposed_by",
        "approved_by",
        "reason_code",
        "reason",
        "loosens",
        "loosening_words",
        "created_at",
        "activated_at",
        "settings",
    )
    readonly_fields = fields
    actions = ("approve_selected", "reject_selected")
    action_form = PolicyActionForm

    def has_module_permission(self, request: HttpRequest) -> bool:
        return _may_configure(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _may_configure(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return _may_configure(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[PolicyVersion]:
        # The latest what-if of each version, in the list's own query.
        latest = PolicyWhatIf.objects.filter(policy_version=OuterRef("pk")).order_by(
            "-created_at", "-id"
        )
        return (
            super()
            .get_queryset(request)
            .annotate(
                latest_whatif=Subquery(latest.values("pk")[:1]),
                latest_whatif_status=Subquery(latest.values("status")[:1]),
            )
        )

    @admin.display(description="what-if")
    def whatif_link(self, obj: PolicyVersion) -> str:
        report = getattr(obj, "latest_whatif", None)
        if report is None:
            return "-"
        status = getattr(obj, "latest_whatif_status", "")
        url = reverse("oversight:whatif-report", args=[report])
        return format_html('<a href="{}">report ({})</a>', url, status)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_configure_permission(self, request: HttpRequest) -> bool:
        return _may_configure(request)

    @admin.display(description="settings")
    def settings(self, obj: PolicyVersion) -> str:
        compare = None
        if obj.status != PolicyVersion.Status.ACTIVE:
            _, compare = active_policy()
        return settings_table(_stored_settings(obj), compare)

    @admin.display(description="looser than the active version in")
    def loosening_words(self, obj: PolicyVersion) -> str:
        if obj.status != PolicyVersion.Status.PENDING:
            return "-"
        _, active = active_policy()
        return "; ".join(loosening(active, _stored_settings(obj))) or "nothing"

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """Show the version with its what-if: the latest report, and for a pending version the
        form that runs one (the approving admin reads it before approving)."""
        context = dict(extra_context or {})
        version = (
            PolicyVersion.objects.filter(pk=object_id).first()
            if str(object_id).isdigit() and _may_configure(request)
            else None
        )
        if version is not None:
            latest = (
                PolicyWhatIf.objects.filter(policy_version=version)
                .select_related("created_by")
                .defer("cases", "base_values")
                .first()
            )
            context.update(
                whatif_section=True,
                whatif=latest,
                whatif_totals=_labelled_totals(latest),
                whatif_pending=version.status == PolicyVersion.Status.PENDING,
                whatif_initial=WhatIfForm.initial_for(DEFAULT_DAYS),
                whatif_days=DEFAULT_DAYS,
            )
        return super().change_view(request, object_id, form_url, context)

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Propose a new version: the settings prefilled from the active one, and the reason."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        active, settings = active_policy()
        if request.method == "POST":
            form = PolicyProposalForm(request.POST)
            if form.is_valid() and (version := self._propose(request, form)) is not None:
                return HttpResponseRedirect(
                    reverse("admin:oversight_policyversion_change", args=[version.pk])
                )
        else:
            form = PolicyProposalForm(initial=PolicyProposalForm.initial_from(settings))
        fieldsets = [
            (
                f"Settings (prefilled from active version {active.number})",
                {"fields": list(SETTING_HELP)},
            ),
            ("Why", {"fields": ["reason_code", "reason"]}),
        ]
        # The admin's helpers take any form; their stubs say ModelForm.
        admin_form = helpers.AdminForm(form, fieldsets, {}, model_admin=self)  # type: ignore[arg-type]
        context = {
            **self.admin_site.each_context(request),
            "title": "Propose a change of the gating policy",
            "subtitle": None,
            "adminform": admin_form,
            "object_id": None,
            "original": None,
            "is_popup": False,
            "to_field": None,
            "media": self.media + admin_form.media,
            "inline_admin_formsets": [],
            "errors": helpers.AdminErrorList(form, []),  # type: ignore[arg-type]
            "preserved_filters": self.get_preserved_filters(request),
            "show_save_and_add_another": False,
            "show_save_and_continue": False,
            **(extra_context or {}),
        }
        return self.render_change_form(
            request, context, add=True, change=False, obj=None, form_url=form_url
        )

    def _propose(self, request: HttpRequest, form: PolicyProposalForm) -> PolicyVersion | None:
        try:
            version = propose_policy(
                request.user,
                form.setting_values(),
                form.cleaned_data["reason_code"],
                form.cleaned_data["reason"],
            )
        except ReasonInvalid as exc:
            form.add_error(exc.field if exc.field in form.fields else "reason_code", exc.message)
            return None
        except PolicyInvalid as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
            return None
        except PolicyDenied as exc:
            raise PermissionDenied(str(exc)) from exc
        if version.status == PolicyVersion.Status.ACTIVE:
            self.message_user(
                request,
                f"Policy version {version.number} is active: it gates at least as strictly.",
                messages.SUCCESS,
            )
        else:
            _, active = active_policy()
            words = "; ".join(loosening(active, _stored_settings(version)))
            # The second admin reads what it would have done: a what-if of the last 30 days.
            request_whatif(request.user, version)
            self.message_user(
                request,
                f"Policy version {version.number} is pending: it loosens gating ({words}), so a "
                "second admin must approve it before it takes effect. A what-if of the last "
                f"{DEFAULT_DAYS} days runs for it: its report is below.",
                messages.WARNING,
            )
        return version

    @admin.action(
        description="Approve the selected pending versions (a second admin)",
        permissions=["configure"],
    )
    def approve_selected(self, request: HttpRequest, queryset: QuerySet[PolicyVersion]) -> None:
        for version in queryset.order_by("number"):
            try:
                approve_policy(request.user, version)
            except (PolicyDenied, PolicyConflict) as exc:
                self.message_user(request, f"Version {version.number}: {exc}", messages.ERROR)
            else:
                self.message_user(
                    request, f"Version {version.number} approved: it is active.", messages.SUCCESS
                )

    @admin.action(
        description="Reject the selected pending versions (give a reason code)",
        permissions=["configure"],
    )
    def reject_selected(self, request: HttpRequest, queryset: QuerySet[PolicyVersion]) -> None:
        code = request.POST.get("reason_code", "")
        reason = request.POST.get("reason", "")
        for version in queryset.order_by("number"):
            try:
                reject_policy(request.user, version, code, reason)
            except ReasonInvalid as exc:
                self.message_user(
                    request, f"Version {version.number}: {exc.message}", messages.ERROR
                )
            except (PolicyDenied, PolicyConflict) as exc:
                self.message_user(request, f"Version {version.number}: {exc}", messages.ERROR)
            else:
                self.message_user(request, f"Version {version.number} rejected.", messages.SUCCESS)


@admin.register(ReasonCode)
class ReasonCodeAdmin(admin.ModelAdmin):
    """The controlled list of reason codes: admins add and retire codes, never delete them."""

    form = ReasonCodeForm
    list_display = ("code", "label", "kinds", "active")
    list_filter = ("active",)
    search_fields = ("code", "label")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return _may_configure(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _may_configure(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return _may_configure(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _may_configure(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: ReasonCode | None = None) -> Any:
        # Decisions name their code: once added, a code is never renamed.
        return ("code",) if obj is not None else ()

    @admin.display(description="applies to")
    def kinds(self, obj: ReasonCode) -> str:
        return ", ".join(obj.applies_to)

    def save_model(self, request: HttpRequest, obj: ReasonCode, form: Form, change: bool) -> None:
        data = form.cleaned_data
        if change:
            stored = ReasonCode.objects.get(pk=obj.pk)
            change_reason_code(
                request.user,
                stored,
                label=data["label"],
                applies_to=data["applies_to"],
                active=data["active"],
            )
        else:
            row = add_reason_code(
                request.user,
                code=data["code"],
                label=data["label"],
                applies_to=data["applies_to"],
                active=data["active"],
            )
            obj.pk = row.pk


class AuditedPasswordChangeForm(PasswordChangeForm):
    """The admin site's change-your-own-password form, with the change in the trail.

    The user's API tokens die with the old password (their other sessions too: Django checks
    each session against the password; the view keeps the one that changed it).
    """

    @transaction.atomic
    def save(self, commit: bool = True) -> Any:
        user = super().save(commit=commit)
        append_event(
            "auth.user.password_changed",
            actor=user,
            chain=SYSTEM_CHAIN,
            data={"user": user.get_username(), "user_id": user.pk, "by": "themselves"},
        )
        revoke_api_tokens(user, actor=user, why="the user changed their password")
        return user


admin.site.site_header = "CaseHub administration"
admin.site.site_title = "CaseHub admin"
admin.site.password_change_form = AuditedPasswordChangeForm
