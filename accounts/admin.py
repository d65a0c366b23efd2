"""Admin pages for users, role groups and password resets; every change goes through
accounts.users, which checks it and writes its audit event.

Admins see and change a user's username, names, e-mail, active flag and roles (one of
accounts.roles.ROLES each) — never the superuser or staff flags, raw groups or permissions. On
their own record the roles and the active flag are read-only. A form posted with a field it does
not offer (a tampered form) is refused with 403 and recorded. Groups are read-only: their
permissions come from accounts.roles.sync_roles. A new password for an officer, supervisor,
auditor or admin waits in "Password reset requests" for a second admin; so does giving one of
those roles, at creation or later, in "Role grant requests".
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.contrib.admin.utils import unquote
from django.contrib.auth import admin as auth_admin
from django.contrib.auth import password_validation
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.text import capfirst
from django.views.decorators.debug import sensitive_post_parameters

from accounts import oidc_mappings, signin, users
from accounts.models import (
    OidcGroupMapping,
    OidcMappingRequest,
    PasswordResetRequest,
    RoleGrantRequest,
    SigningState,
)
from accounts.roles import ROLES

# Fields no form here offers: posting one is tampering.
FORBIDDEN_FIELDS = ("is_superuser", "is_staff", "user_permissions", "groups", "password")
# Fields of the admin's own record they cannot change.
OWN_LOCKED_FIELDS = ("roles", "is_active")
# How a refusal names a locked field to the admin who sent it.
OWN_FIELD_WORDS = {"roles": "roles", "is_active": "active flag"}
ROLE_CHOICES = [(role, role) for role in ROLES]


def _manages(request: HttpRequest) -> bool:
    return users.may_manage_users(request.user)


def _admin(request: HttpRequest) -> User:
    """Return the signed-in user as the acting admin (the use cases check what they may do)."""
    if not isinstance(request.user, User):
        raise PermissionDenied("sign in first")
    return request.user


def _refused(request: HttpRequest, error: users.UserChangeRefused) -> None:
    messages.error(request, f"Refused: {error.why}.")


def _menu(model: type[Model]) -> str:
    """Return where the admin lists `model`'s rows, as its index names them ("Accounts > …")."""
    return f"{model._meta.app_config.verbose_name} > {capfirst(model._meta.verbose_name_plural)}"


def _grant_waits(grant: RoleGrantRequest, whose: str = "") -> str:
    """Return the sentence saying the grant waits for a second admin, and where."""
    # Role (group) names as they are, never first in a sentence, where they would want a capital.
    many = len(grant.roles) > 1
    return (
        f"The {', '.join(grant.roles)} role{'s' if many else ''}{whose} "
        f"wait{'' if many else 's'} for a second admin ({_menu(RoleGrantRequest)})."
    )


def _grant_pending(request: HttpRequest, user: User, pending: RoleGrantRequest | None) -> None:
    if pending is not None:
        messages.warning(
            request,
            _grant_waits(pending, f" of {user.username}"),
        )


class UserForm(forms.ModelForm):
    """A user's profile and active flag; no roles (the admin's own record)."""

    class Meta:
        model = User
        fields = ("username", "first_name", "last_name", "email", "is_active")


class UserRolesForm(UserForm):
    """A user's profile, active flag and roles (anyone's record but the admin's own)."""

    roles = forms.MultipleChoiceField(
        choices=ROLE_CHOICES,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=(
            f"Giving the {', '.join(users.SENSITIVE_ROLES[:-1])} or {users.SENSITIVE_ROLES[-1]} "
            "role waits for a second admin."
        ),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["roles"].initial = users.role_names(self.instance)
            pending = users.pending_role_grant(self.instance)
            if pending is not None:
                self.fields["roles"].help_text = _grant_waits(pending)


class PasswordFieldsMixin(forms.Form):
    password1 = forms.CharField(
        label="Password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text=password_validation.password_validators_help_text_html(),
    )
    password2 = forms.CharField(
        label="Password confirmation",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
        help_text="Enter the same password as before, for verification.",
    )

    def check_passwords(self, user: User) -> None:
        first = self.cleaned_data.get("password1")
        second = self.cleaned_data.get("password2")
        if first and second and first != second:
            self.add_error("password2", "The two password fields didn't match.")
            return
        if first:
            try:
                password_validation.validate_password(first, user)
            except ValidationError as error:
                self.add_error("password2", error)


class UserAddForm(PasswordFieldsMixin, UserRolesForm):
    """A new user: profile, roles and a first password."""

    class Meta:
        model = User
        fields = ("username", "first_name", "last_name", "email")

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        self.check_passwords(self.instance)
        return cleaned


class ResetPasswordForm(PasswordFieldsMixin):
    """A new password for a user (pending a second admin for sensitive roles)."""

    def __init__(self, user: User, *args: Any, **kwargs: Any) -> None:
        self.user = user
        super().__init__(*args, **kwargs)

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        self.check_passwords(self.user)
        return cleaned


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class CaseHubUserAdmin(admin.ModelAdmin):
    form = UserRolesForm
    add_form = UserAddForm
    list_display = ("username", "email", "first_name", "last_name", "is_active", "role_list")
    list_filter = ("is_active", "groups")
    search_fields = ("username", "first_name", "last_name", "email")
    ordering = ("username",)
    actions = (
        "deactivate_selected",
        "unlock_signing_selected",
        "password_sign_in_off_selected",
        "password_sign_in_on_selected",
    )
    readonly_fields = (
        "password_status",
        "password_sign_in",
        "signing_status",
        "last_login",
        "date_joined",
    )

    # Who may use it ----------------------------------------------------------------------------

    def has_module_permission(self, request: HttpRequest) -> bool:
        return _manages(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _manages(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return _manages(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.is_superuser and not request.user.is_superuser:
            return False  # only a superuser changes a superuser
        return _manages(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # users are deactivated, never deleted: the trail names them

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        return not lookup.startswith("password") and super().lookup_allowed(lookup, value, request)

    # What it shows -----------------------------------------------------------------------------

    @staticmethod
    def _own(request: HttpRequest, obj: User | None) -> bool:
        return obj is not None and obj.pk == request.user.pk

    def get_fieldsets(self, request: HttpRequest, obj: User | None = None) -> Any:
        if obj is None:
            return (
                (None, {"fields": ("username", "password1", "password2")}),
                ("Personal info", {"fields": ("first_name", "last_name", "email")}),
                ("Roles", {"fields": ("roles",)}),
            )
        access = (
            ("is_active", "current_roles") if self._own(request, obj) else ("is_active", "roles")
        )
        return (
            (None, {"fields": ("username", "password_status", "password_sign_in")}),
            ("Personal info", {"fields": ("first_name", "last_name", "email")}),
            ("Access", {"fields": access}),
            ("E-signing", {"fields": ("signing_status",)}),
            ("Important dates", {"fields": ("last_login", "date_joined")}),
        )

    def get_readonly_fields(self, request: HttpRequest, obj: User | None = None) -> Any:
        if self._own(request, obj):
            return (*self.readonly_fields, "is_active", "current_roles")
        return self.readonly_fields

    def get_form(
        self, request: HttpRequest, obj: User | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = self.add_form
        elif self._own(request, obj):
            kwargs["form"] = UserForm
        return super().get_form(request, obj, change=change, **kwargs)

    @admin.display(description="roles")
    def role_list(self, obj: User) -> str:
        return ", ".join(users.role_names(obj)) or "—"

    @admin.display(description="roles")
    def current_roles(self, obj: User) -> str:
        names = ", ".join(users.role_names(obj)) or "none"
        return f"{names} (another admin changes your roles)"

    @admin.display(description="password")
    def password_status(self, obj: User) -> str:
        if obj.pk is None:
            return ""
        pending = obj.password_resets.filter(status=PasswordResetRequest.Status.PENDING).exists()
        note = " A reset waits for a second admin." if pending else ""
        url = reverse("admin:auth_user_password_change", args=[obj.pk])
        return format_html('<a href="{}">Set a new password</a>.{}', url, note)

    @admin.display(description="password sign-in")
    def password_sign_in(self, obj: User) -> str:
        if obj.pk is None or not signin.is_password_sign_in_off(obj):
            return "on"
        return "off: signs in through the identity provider only (a list action turns it on)"

    @admin.display(description="e-signing")
    def signing_status(self, obj: User) -> str:
        state = SigningState.objects.filter(user=obj).first()
        if state is None or state.locked_at is None:
            failures = state.failures if state is not None else 0
            return f"unlocked ({failures} wrong password(s) in a row)"
        return f"locked since {state.locked_at:%Y-%m-%d %H:%M} (use the unlock action)"

    # How it saves: through the use cases ---------------------------------------------------------

    def _refuse_tampering(self, request: HttpRequest, object_id: str | None) -> None:
        target = None
        if object_id is not None:
            target = User.objects.filter(pk=unquote(object_id)).first()
        posted = [name for name in FORBIDDEN_FIELDS if name in request.POST]
        if posted:
            users.refuse_change(
                _admin(request),
                "admin_form",
                target,
                f"the user form sets no {', '.join(posted)}",
            )
        own = [name for name in OWN_LOCKED_FIELDS if name in request.POST]
        if own and target is not None and target.pk == request.user.pk:
            users.refuse_change(
                _admin(request),
                "set_roles" if "roles" in own else "change_user",
                target,
                f"nobody changes their own {' or '.join(OWN_FIELD_WORDS.get(n, n) for n in own)}"
                ": another admin does",
            )

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if request.method == "POST" and _manages(request):
            self._refuse_tampering(request, object_id)  # raises, recorded, outside a transaction
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except users.UserChangeRefused as error:
            # The admin's transaction rolled back with the refusal's event: record it again.
            if not error.durable:
                users.record_refusal(error)
            raise

    @method_decorator(sensitive_post_parameters("password1", "password2"))
    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return super().add_view(request, form_url, extra_context)

    def save_model(self, request: HttpRequest, obj: User, form: Any, change: bool) -> None:
        data = form.cleaned_data
        if not change:
            created = users.create_user(
                _admin(request),
                username=data["username"],
                password=data["password1"],
                first_name=data.get("first_name", ""),
                last_name=data.get("last_name", ""),
                email=data.get("email", ""),
                roles=data.get("roles") or (),
            )
            obj.pk = created.pk
            obj.password = created.password
            obj.is_staff = created.is_staff
            obj._state.adding = False
            obj._state.db = created._state.db
            _grant_pending(request, created, users.pending_role_grant(created))
            return
        fields = [name for name in users.PROFILE_FIELDS if name in form.fields]
        users.change_user(_admin(request), obj, **{name: data[name] for name in fields})

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        # The forms have no many-to-many fields; roles are set by the use case.
        if change and "roles" in form.fields:
            pending = users.set_roles(
                _admin(request), form.instance, form.cleaned_data.get("roles") or []
            )
            _grant_pending(request, form.instance, pending)

    def response_add(
        self, request: HttpRequest, obj: User, post_url_continue: str | None = None
    ) -> HttpResponse:
        return HttpResponseRedirect(reverse("admin:auth_user_change", args=[obj.pk]))

    # The password page ---------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<id>/password/",
                self.admin_site.admin_view(self.user_change_password),
                name="auth_user_password_change",
            ),
            *super().get_urls(),
        ]

    @method_decorator(sensitive_post_parameters("password1", "password2"))
    def user_change_password(self, request: HttpRequest, id: str) -> HttpResponse:
        user = User.objects.filter(pk=unquote(id)).first()
        if user is None:
            raise Http404("no such user")
        if not self.has_change_permission(request, user):
            raise PermissionDenied("you may not set this user's password")
        if request.method == "POST":
            form = ResetPasswordForm(user, request.POST)
            if "unset-password" in request.POST:
                form.add_error(None, "Password-based sign-in cannot be disabled here.")
            elif form.is_valid():
                pending = users.request_password_reset(
                    _admin(request), user, form.cleaned_data["password1"]
                )
                if pending is None:
                    messages.success(request, "Password changed.")
                else:
                    messages.warning(
                        request,
                        "The new password waits for a second admin's approval "
                        f"({_menu(PasswordResetRequest)}).",
                    )
                return HttpResponseRedirect(reverse("admin:auth_user_change", args=[user.pk]))
        else:
            form = ResetPasswordForm(user)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Set a new password: {user.get_username()}",
            "form": form,
            "form_url": "",
            "opts": self.opts,
            "original": user,
            "is_popup": False,
            "add": True,
            "change": False,
            "has_delete_permission": False,
            "has_change_permission": True,
            "has_absolute_url": False,
            "save_as": False,
            "show_save": True,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/auth/user/change_password.html", context)

    # List actions --------------------------------------------------------------------------------

    @admin.action(description="Deactivate the selected users")
    def deactivate_selected(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        done = 0
        for user in queryset:
            try:
                users.deactivate_user(_admin(request), user)
                done += 1
            except users.UserChangeRefused as error:
                messages.error(request, f"{user.username}: refused: {error.why}.")
        if done:
            messages.success(request, f"Deactivated {done} user(s).")

    def _password_sign_in(self, request: HttpRequest, queryset: QuerySet[User], off: bool) -> None:
        done = 0
        for user in queryset:
            try:
                done += signin.set_password_sign_in(_admin(request), user, off=off)
            except users.UserChangeRefused as error:
                messages.error(request, f"{user.username}: refused: {error.why}.")
        if done:
            state = "off (identity provider only)" if off else "on"
            messages.success(request, f"Password sign-in {state} for {done} user(s).")

    @admin.action(description="Turn password sign-in off (identity provider only)")
    def password_sign_in_off_selected(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        self._password_sign_in(request, queryset, off=True)

    @admin.action(description="Turn password sign-in back on")
    def password_sign_in_on_selected(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        self._password_sign_in(request, queryset, off=False)

    @admin.action(description="Unlock e-signing of the selected users")
    def unlock_signing_selected(self, request: HttpRequest, queryset: QuerySet[User]) -> None:
        done = 0
        for user in queryset:
            try:
                users.unlock_signing(_admin(request), user)
                done += 1
            except users.UserChangeRefused as error:
                messages.error(request, f"{user.username}: refused: {error.why}.")
        if done:
            messages.success(request, f"Unlocked e-signing of {done} user(s).")


@admin.register(Group)
class RoleGroupAdmin(auth_admin.GroupAdmin):
    """The role groups, read-only: accounts.roles.sync_roles sets their permissions."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return _manages(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _manages(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class TwoPersonRequestAdmin(admin.ModelAdmin):
    """A list of two-person requests: admins who manage users read them and decide them through
    the list's actions; nobody adds, edits or deletes one here (each is made and closed by its
    kind's own audited functions)."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return _manages(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _manages(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(PasswordResetRequest)
class PasswordResetRequestAdmin(TwoPersonRequestAdmin):
    """Pending password resets, for a second admin to approve or reject."""

    list_display = ("target", "requested_by", "status", "created_at", "decided_by", "decided_at")
    list_filter = ("status",)
    fields = ("target", "requested_by", "status", "created_at", "decided_by", "decided_at")
    readonly_fields = fields
    actions = ("approve_selected", "reject_selected")

    def _decide(
        self, request: HttpRequest, queryset: QuerySet[PasswordResetRequest], approve: bool
    ) -> None:
        done = 0
        for reset in queryset.select_related("target", "requested_by"):
            try:
                if approve:
                    users.approve_password_reset(_admin(request), reset)
                else:
                    users.reject_password_reset(_admin(request), reset)
                done += 1
            except users.UserChangeRefused as error:
                messages.error(request, f"{reset.target.username}: refused: {error.why}.")
            except users.ResetConflict as error:
                messages.error(request, f"{reset.target.username}: {error}.")
        if done:
            verb = "Approved" if approve else "Rejected"
            messages.success(request, f"{verb} {done} password reset(s).")

    @admin.action(description="Approve the selected password resets (as the second admin)")
    def approve_selected(
        self, request: HttpRequest, queryset: QuerySet[PasswordResetRequest]
    ) -> None:
        self._decide(request, queryset, approve=True)

    @admin.action(description="Reject the selected password resets")
    def reject_selected(
        self, request: HttpRequest, queryset: QuerySet[PasswordResetRequest]
    ) -> None:
        self._decide(request, queryset, approve=False)


class RoleGrantActionForm(ActionForm):
    reason = forms.CharField(label="Reason (to reject)", required=False, max_length=500, strip=True)


@admin.register(RoleGrantRequest)
class RoleGrantRequestAdmin(TwoPersonRequestAdmin):
    """Pending grants of sensitive roles, for a second admin to approve or reject."""

    list_display = (
        "target",
        "role_list",
        "requested_by",
        "requester_controls",
        "status",
        "created_at",
        "expires_at",
        "decided_by",
        "decided_at",
        "reason",
    )
    list_filter = ("status",)
    fields = list_display
    readonly_fields = fields
    actions = ("approve_selected", "reject_selected")
    action_form = RoleGrantActionForm

    def get_queryset(self, request: HttpRequest) -> QuerySet[RoleGrantRequest]:
        return super().get_queryset(request).select_related("target", "requested_by")

    @admin.display(description="roles to grant")
    def role_list(self, obj: RoleGrantRequest) -> str:
        return ", ".join(obj.roles)

    @admin.display(description="requester created the account or knows its password", boolean=True)
    def requester_controls(self, obj: RoleGrantRequest) -> bool:
        return users.controlled_by(obj.target, obj.requested_by)

    @admin.display(description="expires")
    def expires_at(self, obj: RoleGrantRequest) -> Any:
        if obj.status != RoleGrantRequest.Status.PENDING:
            return "—"
        return obj.created_at + users.ROLE_GRANT_LIFETIME

    def _decide(
        self, request: HttpRequest, queryset: QuerySet[RoleGrantRequest], approve: bool
    ) -> None:
        reason = str(request.POST.get("reason", "")).strip()
        if not approve and not reason:
            messages.error(request, "Give a reason to reject a role grant.")
            return
        done = 0
        for grant in queryset.select_related("target", "requested_by"):
            try:
                if approve:
                    users.approve_role_grant(_admin(request), grant)
                else:
                    users.reject_role_grant(_admin(request), grant, reason)
                done += 1
            except users.UserChangeRefused as error:
                messages.error(request, f"{grant.target.username}: refused: {error.why}.")
            except users.RoleGrantConflict as error:
                messages.error(request, f"{grant.target.username}: {error}.")
        if done:
            verb = "Approved" if approve else "Rejected"
            messages.success(request, f"{verb} {done} role grant(s).")

    @admin.action(description="Approve the selected role grants (as the second admin)")
    def approve_selected(self, request: HttpRequest, queryset: QuerySet[RoleGrantRequest]) -> None:
        self._decide(request, queryset, approve=True)

    @admin.action(description="Reject the selected role grants (give a reason)")
    def reject_selected(self, request: HttpRequest, queryset: QuerySet[RoleGrantRequest]) -> None:
        self._decide(request, queryset, approve=False)


# Identity provider group mappings ------------------------------------------------------------


class GroupMappingForm(forms.ModelForm):
    role = forms.ChoiceField(choices=ROLE_CHOICES)

    class Meta:
        model = OidcGroupMapping
        fields = ("group", "role")


@admin.register(OidcGroupMapping)
class GroupMappingAdmin(admin.ModelAdmin):
    """Which group of the identity provider's claim gives which role. Adding one for a sensitive
    role proposes it (OIDC group mapping proposals), for a second admin to approve."""

    form = GroupMappingForm
    list_display = ("group", "role", "created_by", "approved_by", "created_at")
    list_filter = ("role",)
    search_fields = ("group",)
    actions = ("remove_selected",)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return _manages(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _manages(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return _manages(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # remove and add again: each is its own audited change

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # the list action removes, audited

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        try:
            made = oidc_mappings.map_group(_admin(request), obj.group, obj.role)
        except users.UserChangeRefused as error:
            raise PermissionDenied(error.why) from None
        except (ValueError, oidc_mappings.MappingConflict) as error:
            messages.error(request, f"Not mapped: {error}.")
            return
        if isinstance(made, OidcMappingRequest):
            messages.warning(
                request,
                f"Mapping {made.group} → {made.role} waits for a second admin "
                f"({_menu(OidcMappingRequest)}).",
            )
        else:
            obj.pk = made.pk

    def response_add(
        self, request: HttpRequest, obj: Any, post_url_continue: str | None = None
    ) -> HttpResponse:
        return HttpResponseRedirect(reverse("admin:accounts_oidcgroupmapping_changelist"))

    @admin.action(description="Remove the selected mappings (members lose the role at sign-in)")
    def remove_selected(self, request: HttpRequest, queryset: QuerySet[OidcGroupMapping]) -> None:
        done = 0
        for mapping in queryset:
            try:
                oidc_mappings.remove_mapping(_admin(request), mapping)
                done += 1
            except users.UserChangeRefused as error:
                messages.error(request, f"{mapping}: refused: {error.why}.")
        if done:
            messages.success(request, f"Removed {done} mapping(s).")


@admin.register(OidcMappingRequest)
class GroupMappingRequestAdmin(TwoPersonRequestAdmin):
    """Proposed mappings of groups to sensitive roles, for a second admin to approve or reject."""

    list_display = (
        "group",
        "role",
        "requested_by",
        "status",
        "created_at",
        "decided_by",
        "decided_at",
        "reason",
    )
    list_filter = ("status",)
    fields = list_display
    readonly_fields = fields
    actions = ("approve_selected", "reject_selected")
    action_form = RoleGrantActionForm

    def _decide(
        self, request: HttpRequest, queryset: QuerySet[OidcMappingRequest], approve: bool
    ) -> None:
        reason = str(request.POST.get("reason", "")).strip()
        if not approve and not reason:
            messages.error(request, "Give a reason to reject a mapping.")
            return
        done = 0
        for proposal in queryset.select_related("requested_by"):
            try:
                if approve:
                    oidc_mappings.approve_mapping(_admin(request), proposal)
                else:
                    oidc_mappings.reject_mapping(_admin(request), proposal, reason)
                done += 1
            except users.UserChangeRefused as error:
                messages.error(request, f"{proposal}: refused: {error.why}.")
            except oidc_mappings.MappingConflict as error:
                messages.error(request, f"{proposal}: {error}.")
        if done:
            verb = "Approved" if approve else "Rejected"
            messages.success(request, f"{verb} {done} mapping(s).")

    @admin.action(description="Approve the selected mappings (as the second admin)")
    def approve_selected(
        self, request: HttpRequest, queryset: QuerySet[OidcMappingRequest]
    ) -> None:
        self._decide(request, queryset, approve=True)

    @admin.action(description="Reject the selected mappings (give a reason)")
    def reject_selected(self, request: HttpRequest, queryset: QuerySet[OidcMappingRequest]) -> None:
        self._decide(request, queryset, approve=False)
