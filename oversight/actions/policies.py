"""The gating policy's versions and the reason codes: propose, approve, reject; add, change.

Every policy change is a new numbered version (RELIABILITY R6, R10, O10). A proposal that gates at
least as strictly as the active version takes effect at once; one that loosens anything stays
pending until a second admin — not its proposer — approves it. Every change names a reason code
that applies to "policy" and is audited on the system chain with the settings before and after.

Only admins (`oversight.configure`) call these. A refusal (no permission, approving one's own
proposal) is recorded in a transaction of its own before anything else runs, so it stays in the
trail although nothing changed; the change itself then runs in one transaction with its events.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from accounts import approvals
from audit.chain import SYSTEM_CHAIN, append_event
from oversight.actions.gates import ReasonInvalid, check_reason
from oversight.models import PolicyVersion, ReasonCode
from oversight.policy import PolicySettings, SettingsInvalid, loosening

CONFIGURE = "oversight.configure"
POLICY = ReasonCode.AppliesTo.POLICY.value

type Someone = AbstractBaseUser | AnonymousUser


class PolicyDenied(PermissionDenied):
    """The user may not make this change: not an admin, or approving their own proposal (403)."""


class PolicyConflict(Exception):
    """The version cannot take this step now: not pending, or the active one changed (409)."""


class PolicyInvalid(ValueError):
    """A setting or a reason-code field is not acceptable; `field` names it (422)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# Checks --------------------------------------------------------------------------------------


def _deny(user: Someone, action: str, why: str, **data: Any) -> None:
    # In its own transaction (a savepoint when nested), so the refusal stays recorded.
    with transaction.atomic():
        append_event(action, actor=user, chain=SYSTEM_CHAIN, data={"why": why, **data})


def _may_configure(user: Someone) -> str | None:
    if not isinstance(user, User) or not user.is_active:
        return "signed-in admins only"
    if not user.has_perm(CONFIGURE):
        return "changing the gating policy or the reason codes needs the admin role"
    return None


def require_admin(user: Someone, action: str, **data: Any) -> User:
    """Return the user as an admin; record the refusal and raise PolicyDenied when not one."""
    if (why := _may_configure(user)) is not None:
        _deny(user, action, why, **data)
        raise PolicyDenied(why)
    assert isinstance(user, User)
    return user


def _settings_of(version: PolicyVersion) -> PolicySettings:
    # A stored version was checked when it was proposed; an unreadable one is treated as the
    # defaults, as the gates do (oversight.actions.gate_policy.active_policy).
    try:
        return PolicySettings.from_data(version.values)
    except ValueError:
        return PolicySettings()


def _locked_active() -> PolicyVersion | None:
    """Lock and return the active version: policy changes queue behind each other on it.

    A change that waited for the lock finds the row it waited on superseded (PostgreSQL re-reads
    the locked row, not the table): it then locks the version that is active now.
    """
    active = PolicyVersion.objects.filter(status=PolicyVersion.Status.ACTIVE)
    for _ in range(10):
        row = active.select_for_update().first()
        if row is not None or not active.exists():
            return row
    raise PolicyConflict("the gating policy is changing: try again")


def _validate(values: Mapping[str, Any], base: PolicySettings) -> PolicySettings:
    """Return the settings `values` make over `base`; raise PolicyInvalid naming the field."""
    if not isinstance(values, Mapping):
        raise PolicyInvalid("values", "the settings are a mapping of setting names to values")
    try:
        return PolicySettings.from_data({**base.as_data(), **values})
    except SettingsInvalid as exc:
        field, message = next(iter(exc.problems.items()))
        raise PolicyInvalid(field, message) from None


def _policy_reason(code: str, text: str) -> ReasonCode:
    reason = check_reason(code, POLICY, required=True, text=text)
    assert reason is not None  # required=True raises instead
    return reason


def _version_data(version: PolicyVersion) -> dict[str, Any]:
    return {
        "policy_version": version.number,
        "status": version.status,
        "proposed_by": version.proposed_by.get_username() if version.proposed_by else None,
        "reason_code": version.reason_code,
        "reason": version.reason,
        "loosens": version.loosens,
    }


# Policy versions -----------------------------------------------------------------------------


def propose_policy(
    admin: Someone, values: Mapping[str, Any], reason_code: str, reason: str = ""
) -> PolicyVersion:
    """Propose new policy settings as the next version; return it.

    `values` maps setting names to values (PolicySettings.as_data's form); settings it leaves out
    keep the active version's values. The version is active at once when it gates at least as
    strictly as the active one (which becomes superseded); otherwise it is pending, `loosens`,
    until a second admin approves it.

    Raises PolicyDenied (audited) for a non-admin; PolicyInvalid naming the field for a bad
    setting or a proposal that changes nothing; ReasonInvalid for a reason code that is missing,
    unknown, retired or not for policy changes.
    """
    user = require_admin(admin, "oversight.policy.denied", step="propose")
    reason_row = _policy_reason(reason_code, reason or "")
    return _propose(user, values, reason_row, (reason or "").strip())


@transaction.atomic
def _propose(
    admin: User, values: Mapping[str, Any], reason_row: ReasonCode, reason: str
) -> PolicyVersion:
    active = _locked_active()
    before = _settings_of(active) if active is not None else PolicySettings()
    after = _validate(values, before)
    if after == before:
        raise PolicyInvalid("values", "the proposal changes nothing in the active policy")
    looser = loosening(before, after)
    number = (PolicyVersion.objects.aggregate(top=Max("number"))["top"] or 0) + 1
    now = timezone.now()
    at_once = not looser
    if at_once and active is not None:
        active.status = PolicyVersion.Status.SUPERSEDED
        active.save(update_fields=["status"])
    version = PolicyVersion.objects.create(
        number=number,
        values=after.as_data(),
        status=PolicyVersion.Status.ACTIVE if at_once else PolicyVersion.Status.PENDING,
        proposed_by=admin,
        reason_code=reason_row.code,
        reason=reason,
        loosens=bool(looser),
        activated_at=now if at_once else None,
    )
    change = {
        "base_version": active.number if active is not None else None,
        "before": before.as_data(),
        "after": after.as_data(),
        "loosening": looser,
    }
    append_event(
        "oversight.policy.proposed",
        actor=admin,
        chain=SYSTEM_CHAIN,
        data=_version_data(version) | change,
    )
    if at_once:
        append_event(
            "oversight.policy.activated",
            actor=admin,
            chain=SYSTEM_CHAIN,
            data=_version_data(version)
            | change
            | {"superseded": active.number if active is not None else None, "why": "not looser"},
        )
    return version


def approve_policy(admin: Someone, version: PolicyVersion) -> PolicyVersion:
    """Approve a pending version as a second admin; it becomes active, the active one superseded.

    Raises PolicyDenied (audited) for a non-admin or the version's proposer; PolicyConflict when
    the version is not pending or the active version is newer than it (propose again).
    """
    user = require_admin(
        admin, "oversight.policy.denied", step="approve", policy_version=version.number
    )
    if approvals.is_requester(user, version.proposed_by_id):
        why = "you proposed this change; a second admin must approve it"
        _deny(user, "oversight.policy.denied", why, step="approve", policy_version=version.number)
        raise PolicyDenied(why)
    return _approve(user, version.pk)


@transaction.atomic
def _approve(admin: User, version_pk: int) -> PolicyVersion:
    active = _locked_active()
    version = (
        PolicyVersion.objects.select_for_update(of=("self",))
        .select_related("proposed_by")
        .get(pk=version_pk)
    )
    if version.status != PolicyVersion.Status.PENDING:
        raise PolicyConflict(f"policy version {version.number} is {version.status}, not pending")
    if approvals.is_requester(admin, version.proposed_by_id):  # checked again under the lock
        raise PolicyDenied("you proposed this change; a second admin must approve it")
    if active is not None and version.number < active.number:
        raise PolicyConflict(
            f"the active policy changed since version {version.number} was proposed (it is "
            f"version {active.number} now): propose the change again"
        )
    before = _settings_of(active) if active is not None else PolicySettings()
    after = _settings_of(version)
    looser = loosening(before, after)
    now = timezone.now()
    if active is not None:
        active.status = PolicyVersion.Status.SUPERSEDED
        active.save(update_fields=["status"])
    version.status = PolicyVersion.Status.ACTIVE
    version.approved_by = admin
    version.activated_at = now
    version.loosens = bool(looser)
    version.save(update_fields=["status", "approved_by", "activated_at", "loosens"])
    change = {
        "before": before.as_data(),
        "after": after.as_data(),
        "loosening": looser,
        "approved_by": admin.get_username(),
        "superseded": active.number if active is not None else None,
    }
    append_event(
        "oversight.policy.approved",
        actor=admin,
        chain=SYSTEM_CHAIN,
        data=_version_data(version) | change,
    )
    append_event(
        "oversight.policy.activated",
        actor=admin,
        chain=SYSTEM_CHAIN,
        data=_version_data(version) | change | {"why": "approved by a second admin"},
    )
    return version


def reject_policy(
    admin: Someone, version: PolicyVersion, reason_code: str, reason: str = ""
) -> PolicyVersion:
    """Reject a pending version (any admin, its proposer too: a withdrawal); return it.

    Raises PolicyDenied (audited) for a non-admin, ReasonInvalid for a bad reason code and
    PolicyConflict when the version is not pending.
    """
    user = require_admin(
        admin, "oversight.policy.denied", step="reject", policy_version=version.number
    )
    reason_row = _policy_reason(reason_code, reason or "")
    return _reject(user, version.pk, reason_row, (reason or "").strip())


@transaction.atomic
def _reject(admin: User, version_pk: int, reason_row: ReasonCode, reason: str) -> PolicyVersion:
    active = _locked_active()
    version = (
        PolicyVersion.objects.select_for_update(of=("self",))
        .select_related("proposed_by")
        .get(pk=version_pk)
    )
    if version.status != PolicyVersion.Status.PENDING:
        raise PolicyConflict(f"policy version {version.number} is {version.status}, not pending")
    version.status = PolicyVersion.Status.REJECTED
    version.save(update_fields=["status"])
    before = _settings_of(active) if active is not None else PolicySettings()
    after = _settings_of(version)
    append_event(
        "oversight.policy.rejected",
        actor=admin,
        chain=SYSTEM_CHAIN,
        data=_version_data(version)
        | {
            "before": before.as_data(),
            "after": after.as_data(),
            "loosening": loosening(before, after),
            "rejected_by": admin.get_username(),
            "rejection_reason_code": reason_row.code,
            "rejection_reason": reason,
        },
    )
    return version


# Reason codes --------------------------------------------------------------------------------


def _applies_to(values: Iterable[str]) -> list[str]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise PolicyInvalid("applies_to", "a list of kinds of decision")
    kinds = sorted(set(values))
    if not kinds:
        raise PolicyInvalid("applies_to", "a reason code applies to at least one kind of decision")
    if unknown := set(kinds) - set(ReasonCode.AppliesTo.values):
        raise PolicyInvalid("applies_to", f"unknown kind(s) {', '.join(sorted(unknown))}")
    return kinds


def _code_data(code: ReasonCode) -> dict[str, Any]:
    return {
        "code": code.code,
        "label": code.label,
        "applies_to": sorted(code.applies_to),
        "active": code.active,
    }


def add_reason_code(
    admin: Someone, *, code: str, label: str, applies_to: Iterable[str], active: bool = True
) -> ReasonCode:
    """Add a reason code to the controlled list; return it.

    Raises PolicyDenied (audited) for a non-admin and PolicyInvalid naming the field for a code
    that is taken or not a slug, a blank label, or unknown kinds of decision.
    """
    user = require_admin(admin, "oversight.reason_code.denied", step="add", code=code)
    return _add_code(user, code, label, applies_to, active)


@transaction.atomic
def _add_code(
    admin: User, code: str, label: str, applies_to: Iterable[str], active: bool
) -> ReasonCode:
    code = (code or "").strip()
    row = ReasonCode(
        code=code, label=(label or "").strip(), applies_to=_applies_to(applies_to), active=active
    )
    if not row.label:
        raise PolicyInvalid("label", "a reason code needs a label")
    try:
        row.full_clean(exclude=["applies_to"], validate_unique=False)
    except ValidationError as exc:
        raise PolicyInvalid("code", "letters, digits, '-' or '_' only") from exc
    if ReasonCode.objects.filter(code=code).exists():
        raise PolicyInvalid("code", f"reason code {code!r} exists already")
    row.save()
    append_event(
        "oversight.reason_code.added",
        actor=admin,
        chain=SYSTEM_CHAIN,
        data={"code": code, "before": None, "after": _code_data(row)},
    )
    return row


def change_reason_code(
    admin: Someone,
    reason_code: ReasonCode,
    *,
    label: str | None = None,
    applies_to: Iterable[str] | None = None,
    active: bool | None = None,
) -> ReasonCode:
    """Change a reason code's label, kinds or active flag (retire it: active=False); return it.

    The code itself never changes (decisions name it) and codes are never deleted. Raises
    PolicyDenied (audited) for a non-admin and PolicyInvalid naming the field for a bad value.
    """
    user = require_admin(
        admin, "oversight.reason_code.denied", step="change", code=reason_code.code
    )
    return _change_code(user, reason_code.pk, label, applies_to, active)


@transaction.atomic
def _change_code(
    admin: User,
    pk: int,
    label: str | None,
    applies_to: Iterable[str] | None,
    active: bool | None,
) -> ReasonCode:
    row = ReasonCode.objects.select_for_update().get(pk=pk)
    before = _code_data(row)
    if label is not None:
        if not label.strip():
            raise PolicyInvalid("label", "a reason code needs a label")
        row.label = label.strip()
    if applies_to is not None:
        row.applies_to = _applies_to(applies_to)
    if active is not None:
        row.active = bool(active)
    after = _code_data(row)
    if after == before:
        return row
    row.save(update_fields=["label", "applies_to", "active"])
    append_event(
        "oversight.reason_code.changed",
        actor=admin,
        chain=SYSTEM_CHAIN,
        data={"code": row.code, "before": before, "after": after},
    )
    return row


__all__ = [
    "PolicyConflict",
    "PolicyDenied",
    "PolicyInvalid",
    "ReasonInvalid",
    "add_reason_code",
    "approve_policy",
    "change_reason_code",
    "propose_policy",
    "reject_policy",
    "require_admin",
]
