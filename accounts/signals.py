"""Record logins, failed logins and logouts in the system audit chain, and changes to users made
outside accounts.users (the shell, scripts, `createsuperuser`): creation, deletion, the
active, staff and superuser flags, and group membership from either side."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import User
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db import transaction
from django.db.models.signals import m2m_changed, post_save, pre_delete, pre_save
from django.http import HttpRequest

from accounts import users
from audit.chain import Actor, NewEvent, append_event, append_events
from audit.models import ActorKind
from web.http import client_ip
from web.middleware import mark_session_fresh


def _client(request: HttpRequest | None) -> dict[str, str]:
    if request is None:
        return {}
    return {
        # the caller, behind CASEHUB_TRUSTED_PROXY_COUNT proxies: not the proxy (RELIABILITY F1)
        "ip": client_ip(request),
        "user_agent": request.META.get("HTTP_USER_AGENT", "")[:200],
    }


def _append_as(action: str, user: Any, request: HttpRequest | None) -> None:
    # The user's row first, then the chain head: the order of token issue and of the admin's
    # changes to a user. Appending alone takes the head, then the event's foreign-key check
    # waits on the user's row, which one of those may hold while it waits on the head.
    with transaction.atomic():
        User.objects.select_for_update(no_key=True).filter(pk=user.pk).first()
        append_event(action, actor=user, data=_client(request))


def _on_login(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    _append_as("auth.login.succeeded", user, request)


def _on_login_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    # An attempt axes refused before checking its password (its failure is not counted) is no
    # failed sign-in: accounts.throttling counts it as an access denial, aggregated per minute.
    refused = getattr(request, "axes_locked_out", False)
    if refused and getattr(request, "axes_failures_since_start", None) is None:
        return
    username = str(credentials.get("username", ""))[:150]
    append_event(
        "auth.login.failed",
        actor=Actor(ActorKind.ANONYMOUS, username or "anonymous"),
        data={"username": username, **_client(request)},
    )


def _on_logout(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    if user is not None:
        _append_as("auth.logout", user, request)


# Users changed outside the admin's use cases (those write their own, richer events) ----------

FLAGS = ("is_active", "is_staff", "is_superuser")
_FLAGS_BEFORE = "_oversight_flags_before"
_GROUPS_BEFORE = "_oversight_groups_before"


def _on_user_pre_save(
    sender: type[User], instance: User, raw: bool = False, update_fields: Any = None, **kwargs: Any
) -> None:
    if raw or instance.pk is None or users.in_user_action():
        return
    if update_fields is not None and not set(update_fields) & set(FLAGS):
        return  # last_login and the like: no flag can change
    instance.__dict__[_FLAGS_BEFORE] = (
        sender._default_manager.filter(pk=instance.pk).values(*FLAGS).first()
    )


def _on_user_post_save(
    sender: type[User], instance: User, created: bool, raw: bool = False, **kwargs: Any
) -> None:
    before = instance.__dict__.pop(_FLAGS_BEFORE, None)
    if raw or users.in_user_action():
        return
    subject = {"user": instance.username, "user_id": instance.pk}
    if created:
        record = users.user_record(instance)
        append_event("auth.user.created", data={**subject, "before": None, "after": record})
        return
    if before is None:
        return
    changed = [name for name in FLAGS if before[name] != getattr(instance, name)]
    if changed:
        append_event(
            "auth.user.flags_changed",
            data={
                **subject,
                "before": {name: before[name] for name in changed},
                "after": {name: getattr(instance, name) for name in changed},
            },
        )


def _on_user_pre_delete(sender: type[User], instance: User, **kwargs: Any) -> None:
    if users.in_user_action():
        return
    record = users.user_record(instance)
    append_event(
        "auth.user.deleted",
        data={"user": instance.username, "user_id": instance.pk, "before": record, "after": None},
    )


def _groups_of(user_ids: Iterable[int]) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {user_id: [] for user_id in user_ids}
    rows = User.groups.through.objects.filter(user_id__in=list(names)).values_list(
        "user_id", "group__name"
    )
    for user_id, name in rows:
        names[user_id].append(name)
    return {user_id: sorted(groups) for user_id, groups in names.items()}


def _on_groups_changed(
    sender: Any,
    instance: Any,
    action: str,
    reverse: bool,
    pk_set: set[int] | None,
    **kwargs: Any,
) -> None:
    if users.in_user_action():
        return
    if action.startswith("pre_"):
        if not reverse:
            user_ids: Iterable[int] = [instance.pk]
        elif pk_set is not None:
            user_ids = pk_set
        else:  # group.user_set.clear(): everyone in the group
            user_ids = instance.user_set.values_list("pk", flat=True)
        instance.__dict__[_GROUPS_BEFORE] = _groups_of(user_ids)
        return
    before = instance.__dict__.pop(_GROUPS_BEFORE, None)
    if before is None:
        return
    after = _groups_of(before)
    usernames = dict(User.objects.filter(pk__in=list(before)).values_list("pk", "username"))
    append_events(
        [
            NewEvent(
                "auth.user.groups_changed",
                None,
                {
                    "user": usernames.get(user_id),
                    "user_id": user_id,
                    "before": {"groups": before[user_id]},
                    "after": {"groups": after[user_id]},
                },
            )
            for user_id in sorted(before)
            if before[user_id] != after[user_id]
        ]
    )


def connect() -> None:
    """Connect the receivers (called once from AccountsConfig.ready)."""
    user_logged_in.connect(_on_login, dispatch_uid="oversight.audit.login")
    user_logged_in.connect(mark_session_fresh, dispatch_uid="casehub.session.fresh")
    user_login_failed.connect(_on_login_failed, dispatch_uid="oversight.audit.login_failed")
    user_logged_out.connect(_on_logout, dispatch_uid="oversight.audit.logout")
    pre_save.connect(_on_user_pre_save, sender=User, dispatch_uid="oversight.audit.user_pre_save")
    post_save.connect(_on_user_post_save, sender=User, dispatch_uid="oversight.audit.user_saved")
    pre_delete.connect(
        _on_user_pre_delete, sender=User, dispatch_uid="oversight.audit.user_deleted"
    )
    m2m_changed.connect(
        _on_groups_changed, sender=User.groups.through, dispatch_uid="oversight.audit.user_groups"
    )
