"""Gates: decide them (opening.py opens them; deadlines.py sweeps them past their deadline;
gate_policy.py reads the policy they apply).

Every function here that changes state runs in one transaction that also writes the audit
events. A denial (separation of duties, a wrong signature password) is recorded in a
transaction of its own, so the refusal is in the trail although nothing else changed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from accounts.models import SigningState
from accounts.signin import is_password_sign_in_off
from audit.chain import SYSTEM_CHAIN, NewEvent, append_event, case_chain
from audit.transitions import audited
from oversight import notify
from oversight.actions.gate_policy import gate_settings
from oversight.actions.notifications import read_gate_notices
from oversight.actions.opening import open_escalation_gate, void_open_gates
from oversight.models import (
    Gate,
    GateDecision,
    GateKind,
    GateRisk,
    GateStatus,
    ReasonCode,
)
from oversight.transitions import move_gate
from oversight.upstream import acted_on, referenced_steps
from planning.models import (
    Case,
    CaseStatus,
    NodeStatus,
    PlanNode,
    PlanVersion,
)
from planning.transitions import block_nodes, move_case, move_node
from planning.versions import descends_from_replan

logger = logging.getLogger(__name__)

DECIDE_GATE = "oversight.decide_gate"
CONFIGURE = "oversight.configure"


# Errors the API and the pages turn into answers ----------------------------------------------


class GateConflict(Exception):
    """The gate cannot take this decision now: already decided, void, stale or repeated (409)."""


class DecisionDenied(PermissionDenied):
    """The user may not make this decision: separation of duties, role or group (403)."""


class SignatureRefused(PermissionDenied):
    """The e-signature failed: no password, a wrong one, or signing is locked (403)."""


class ReasonInvalid(ValueError):
    """A reason code is missing, unknown or does not apply to this kind of decision (422)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


# Deciding ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionInput:
    """What the decider sends: the decision, its reason, the signature password, and what they saw.

    `version` and `content_hash`, when given, must still be the gate's (else 409 stale): a page
    sends what it showed, so a decision never applies to a plan the officer did not see.
    """

    decision: str
    reason_code: str = ""
    reason: str = ""
    password: str | None = None
    # For a user whose password sign-in is off: when they last signed in afresh at the identity
    # provider (accounts.oidc.reauthenticated_at), which stands for the password.
    reauthenticated_at: datetime | None = None
    version: int | None = None
    content_hash: str | None = None
    # For a signature: the meaning the page showed. What the step acts on may have changed since
    # (a step upstream ran): the signature then waits for the officer to read it again.
    meaning: str | None = None


def full_name(user: User) -> str:
    """Return the name a decision shows for the user (their username when no name is set)."""
    return user.get_full_name().strip() or user.get_username()


# The reason code that names no reason: the decision's text must say it.
OTHER_REASON = "other"


def check_reason(code: str, applies_to: str, *, required: bool, text: str) -> ReasonCode | None:
    """Return the active reason code `code` for `applies_to` decisions, or None when not given.

    `text` is the reason in words that comes with the code. Raises ReasonInvalid (naming the
    field) when the code is required and missing, unknown, retired or not for this kind, and
    when it is `other` without a text (the field `reason`).
    """
    code = (code or "").strip()
    if not code:
        if required:
            raise ReasonInvalid("reason_code", f"a reason code is required to {applies_to}")
        return None
    reason = ReasonCode.objects.filter(code=code, active=True).first()
    if reason is None:
        raise ReasonInvalid("reason_code", f"unknown reason code {code!r}")
    if applies_to not in reason.applies_to:
        raise ReasonInvalid("reason_code", f"reason code {code!r} does not apply to {applies_to}")
    if code == OTHER_REASON and not (text or "").strip():
        raise ReasonInvalid("reason", f"the reason code {code!r} needs the reason in words")
    return reason


def can_decide(user: User, gate: Gate) -> str | None:
    """Return why the user may not decide this gate (separation of duties), or None.

    The caller has loaded `gate.case` and `gate.version`; the group check reads the user's groups.
    """
    if not user.is_active:
        return "the account is disabled"
    if user.has_perm(CONFIGURE):
        return "admins do not decide gates"
    if not user.has_perm(DECIDE_GATE):
        return "deciding gates needs the compliance officer role"
    if gate.case.submitter_id == user.pk:
        return "nobody decides a gate of a case they submitted"
    # An edit stays in every later version: whoever edited any version of the case is out.
    if (
        gate.version.edited_by_id == user.pk
        or PlanVersion.objects.filter(case_id=gate.case_id, edited_by=user).exists()
    ):
        return "the editor of a plan version cannot approve it"
    groups = {gate.approver_group_id}
    if gate.escalated_at is not None and gate.escalation_group_id is not None:
        groups.add(gate.escalation_group_id)
    if not user.groups.filter(pk__in=groups).exists():
        return "the gate is for another approver group"
    return None


def _deny(user: User, gate: Gate, action: str, why: str) -> None:
    # In its own transaction (savepoint when nested), so the refusal stays recorded.
    with transaction.atomic():
        append_event(
            action,
            actor=user,
            chain=case_chain(gate.case_id),
            data={"gate": gate.pk, "case": gate.case_id, "why": why},
        )


def signature_meaning(gate: Gate, by_key: Mapping[str, PlanNode] | None = None) -> str:
    """Return what an approval of this gate means, in words, as the signature records it.

    A step that takes other steps' outputs names them as they are now: the output once its step
    ran, "not run yet" before (`by_key`: the version's leaves by key, else read here).
    """
    if gate.node is None:
        return f"approval of plan version {gate.version.number} of case #{gate.case_id}"
    tool = f" ({gate.node.tool})" if gate.node.tool else ""
    meaning = (
        f"approval of step {gate.node.key}{tool} in plan version {gate.version.number} "
        f"of case #{gate.case_id}"
    )
    keys = referenced_steps([gate.node])
    if not keys:
        return meaning
    if by_key is None:
        by_key = {
            n.key: n for n in PlanNode.objects.filter(version_id=gate.version_id, key__in=keys)
        }
    return f"{meaning}, acting on {acted_on(gate.node, by_key)}"


def _check_signature(user: User, gate: Gate, decision: DecisionInput) -> None:
    """Raise SignatureRefused unless the password is right; count and lock wrong ones (R7).

    A wrong password is counted in its own transaction, so the count survives the refusal. A
    user whose password sign-in is off signs with a fresh sign-in at the identity provider
    instead: at most CASEHUB_OIDC_REAUTH_MAX_AGE_S old.
    """
    password = decision.password
    state, _ = SigningState.objects.get_or_create(user=user)
    if state.locked_at is not None:
        _deny(user, gate, "oversight.signature.refused", "signing is locked")
        raise SignatureRefused(
            "signing is locked after too many wrong passwords; an admin must unlock it"
        )
    if is_password_sign_in_off(user):
        at = decision.reauthenticated_at
        max_age = timedelta(seconds=settings.CASEHUB_OIDC_REAUTH_MAX_AGE_S)
        if at is None or timezone.now() - at > max_age:
            raise SignatureRefused(
                "this approval is an electronic signature: sign in again at the identity "
                "provider first"
            )
        return
    if not password:
        raise SignatureRefused("this approval is an electronic signature: enter your password")
    if user.check_password(password):
        if state.failures:
            SigningState.objects.filter(pk=state.pk).update(failures=0)
        return
    with transaction.atomic():
        state = SigningState.objects.select_for_update().get(pk=state.pk)
        state.failures += 1
        locked = state.failures >= settings.CASEHUB_SIGNING_MAX_FAILURES
        if locked:
            state.locked_at = timezone.now()
        state.save(update_fields=["failures", "locked_at"])
        data = {"gate": gate.pk, "case": gate.case_id, "failures": state.failures}
        append_event(
            "oversight.signature.failed", actor=user, chain=case_chain(gate.case_id), data=data
        )
        if locked:
            append_event("security.signing.locked", actor=user, chain=SYSTEM_CHAIN, data=data)
    if locked:
        raise SignatureRefused("wrong password: signing is now locked; an admin must unlock it")
    raise SignatureRefused("wrong password: the approval was not signed")


def _signature_record(meaning: str, digest: str, decision: DecisionInput) -> dict[str, Any]:
    record: dict[str, Any] = {"meaning": meaning, "hash": digest}
    if decision.reauthenticated_at is not None:
        record["reauthenticated_at"] = decision.reauthenticated_at.isoformat()
    return record


def _load(gate_id: int, *, lock: bool) -> Gate:
    query = Gate.objects.select_related(
        "case", "version", "node", "approver_group", "escalation_group", "policy_version"
    )
    if lock:
        query = query.select_for_update(of=("self",))
    return query.get(pk=gate_id)


def decide_gate(*, gate_id: int, user: User, decision: DecisionInput) -> Gate:
    """Approve or reject a gate as `user`; return the gate after the decision.

    An approval counts towards the quorum (distinct officers); the gate is approved when the
    quorum is reached. A rejection closes the gate at once: rejecting a plan gate rejects the
    case; rejecting a step gate applies the step's failure policy.

    Raises Gate.DoesNotExist; GateConflict when the gate is no longer open, stale (its version is
    no longer the case's current one, or `version`/`content_hash` are not the gate's) or already
    decided by this user; DecisionDenied (audited) for separation of duties; SignatureRefused
    (audited) for a signature without the right password; ReasonInvalid for a reason code that is
    missing on a rejection, unknown or not for this kind of decision.
    """
    if decision.decision not in GateDecision.Decision.values:
        raise ReasonInvalid("decision", "the decision is approve or reject")
    approve = decision.decision == GateDecision.Decision.APPROVE
    # Approvals need no reason code (one given must still be on the list); rejections do.
    reason_code = check_reason(
        decision.reason_code, "reject", required=not approve, text=decision.reason
    )
    # The checks that refuse (and record the refusal) run before the deciding transaction.
    gate = _load(gate_id, lock=False)
    if (why := can_decide(user, gate)) is not None:
        _deny(user, gate, "oversight.gate.decision_denied", why)
        raise DecisionDenied(why)
    if approve and gate.needs_signature:
        _check_signature(user, gate, decision)
    return _decide(gate_id, user, decision, reason_code)


def _conflict(gate: Gate, user: User, decision: DecisionInput) -> str | None:
    if not gate.is_open:
        return f"the gate is {gate.status}"
    if gate.case.current_version_id != gate.version_id:
        return "the gate belongs to a plan version that is no longer current"
    if decision.version is not None and decision.version != gate.version.number:
        return f"the gate is for plan version {gate.version.number}, not {decision.version}"
    if decision.content_hash and decision.content_hash != gate.content_hash:
        return "what was shown is not what the gate approves: reload and decide again"
    if gate.node is not None and gate.node.content_hash != gate.content_hash:
        return "the step changed after the gate opened"
    if (
        decision.meaning is not None
        and decision.decision == GateDecision.Decision.APPROVE
        and gate.needs_signature
        and " ".join(decision.meaning.split()) != " ".join(signature_meaning(gate).split())
    ):
        return "what the step acts on changed after the page was shown: read it again and sign"
    if GateDecision.objects.filter(gate=gate, decider=user).exists():
        return "you have already decided this gate"
    return _replan_conflict(gate)


def _replan_conflict(gate: Gate) -> str | None:
    """Return why the plan gate of a version descended from a re-plan (the re-planned version
    or an edit of it) cannot be approved yet, or None.

    A step of an earlier version that still runs must end first: its result decides whether the
    new version's copy of it still has to run (RELIABILITY S2).
    """
    if gate.kind != GateKind.PLAN or not descends_from_replan(gate.version):
        return None
    running = list(
        PlanNode.objects.filter(
            version__case_id=gate.case_id, kind=PlanNode.Kind.LEAF, status=NodeStatus.RUNNING
        )
        .exclude(version_id=gate.version_id)
        .values_list("key", flat=True)[:5]
    )
    if running:
        return (
            f"step(s) {', '.join(running)} of an earlier version are still running: "
            "decide again once they have ended"
        )
    return None


@transaction.atomic
def _decide(
    gate_id: int, user: User, decision: DecisionInput, reason_code: ReasonCode | None
) -> Gate:
    # The product's lock order: the case's row, then its gates (then nodes, work items, the
    # trust row, the chain head), as a cancel, an edit and a case's end take them (S9).
    case_id = Gate.objects.values_list("case_id", flat=True).get(pk=gate_id)
    case = Case.objects.select_for_update().get(pk=case_id)
    gate = _load(gate_id, lock=True)
    gate.case = case
    if (why := can_decide(user, gate)) is not None:  # roles may have changed meanwhile
        raise DecisionDenied(why)
    if (why := _conflict(gate, user, decision)) is not None:
        raise GateConflict(why)
    now = timezone.now()
    approve = decision.decision == GateDecision.Decision.APPROVE
    signed = approve and gate.needs_signature
    meaning = signature_meaning(gate) if signed else ""
    record = GateDecision.objects.create(
        gate=gate,
        decider=user,
        full_name=full_name(user),
        decision=decision.decision,
        reason_code=reason_code.code if reason_code else "",
        reason=decision.reason.strip(),
        version_number=gate.version.number,
        content_hash=gate.content_hash,
        time=now,
        signature_meaning=meaning,
        signature_hash=gate.content_hash if signed else "",
    )
    before = {"status": gate.status, "approvals": gate.approvals}
    approvals = gate.approvals + 1 if approve else gate.approvals
    decided: dict[str, Any] = {}
    if not approve:
        decided = {"status": GateStatus.REJECTED, "decided_at": now}
    elif approvals >= gate.quorum:
        valid = timedelta(hours=gate_settings(gate).approval_valid_hours)
        decided = {
            "status": GateStatus.APPROVED,
            "decided_at": now,
            "approval_expires_at": now + valid,
        }
    with audited(chain=case_chain(case.pk)) as audit:
        if decided:
            move_gate(gate, to=decided.pop("status"), audit=audit, approvals=approvals, **decided)
        else:
            # An approval short of the quorum: counted, the gate stays open.
            Gate.objects.filter(pk=gate.pk).update(approvals=approvals)
            gate.approvals = approvals
        audit.add(
            NewEvent(
                "oversight.gate.decided",
                user,
                {
                    "gate": gate.pk,
                    "kind": gate.kind,
                    "node": gate.node.key if gate.node else None,
                    "decision": record.decision,
                    "reason_code": record.reason_code,
                    "reason": record.reason,
                    "version": record.version_number,
                    "content_hash": record.content_hash,
                    "full_name": record.full_name,
                    "signature": _signature_record(meaning, record.signature_hash, decision)
                    if signed
                    else None,
                    "before": before,
                    "after": {"status": gate.status, "approvals": gate.approvals},
                },
            )
        )
    if not gate.is_open:
        read_gate_notices(case_id=case.pk)
    if gate.status == GateStatus.APPROVED:
        _on_approved(gate, user)
    elif gate.status == GateStatus.REJECTED:
        _on_rejected(gate, user, record)
    if gate.status in (GateStatus.APPROVED, GateStatus.REJECTED):
        run_gate_decided_hooks(gate, record)
    return gate


def run_gate_decided_hooks(gate: Gate, decision: GateDecision) -> None:
    """Call each of `CASEHUB_GATE_DECIDED_HOOKS` with a gate just decided and its decision.

    They run in the deciding transaction, after this app's own effects (the case approved or
    rejected, the notices): this is how execution starts, resumes or fails steps while oversight
    never imports it (the hook is execution's `on_gate_decided`).
    """
    for path in settings.CASEHUB_GATE_DECIDED_HOOKS:
        import_string(path)(gate, decision)


def rejection_reason(decision: GateDecision) -> str:
    """Return how a rejection reads in a step's error: its reason code and reason."""
    return f"rejected ({decision.reason_code})" + (
        f": {decision.reason}" if decision.reason else ""
    )


# The event of each case status a decision sets (codes spelt out for tests/audit).
_DECIDED: Mapping[str, str] = {
    CaseStatus.APPROVED: "planning.case.approved",
    CaseStatus.REJECTED: "planning.case.rejected",
}


def _set_case_status(case: Case, status: str, user: User | None, **data: Any) -> None:
    with audited(chain=case_chain(case.pk)) as audit:
        before = move_case(case, to=status, audit=audit)
        audit.add(
            NewEvent(
                _DECIDED[status],
                user,
                {
                    "case": case.pk,
                    "before": {"status": before},
                    "after": {"status": status},
                    **data,
                },
            )
        )


def _on_approved(gate: Gate, user: User) -> None:
    # Execution starts or goes on through the gate-decided hooks, which run after this.
    case = gate.case
    if gate.kind == GateKind.PLAN and case.status == CaseStatus.AWAITING_APPROVAL:
        _set_case_status(case, CaseStatus.APPROVED, user, version=gate.version.number)
        notify.case_decided(case, approved=True, by=user)


def _dependents(version: PlanVersion, key: str) -> list[str]:
    """Return the keys of every leaf that depends on `key`, directly or not."""
    depends = dict(
        PlanNode.objects.filter(version=version, kind=PlanNode.Kind.LEAF).values_list(
            "key", "depends_on"
        )
    )
    found: set[str] = set()
    frontier = {key}
    while frontier:
        frontier = {k for k, deps in depends.items() if set(deps) & frontier} - found
        found |= frontier
    return sorted(found)


def _reason_label(code: str) -> str:
    """Return the label of a reason code (the code itself when it has none)."""
    label = ReasonCode.objects.filter(code=code).values_list("label", flat=True).first()
    return label or code


def _on_rejected(gate: Gate, user: User, record: GateDecision) -> None:
    case = gate.case
    why = rejection_reason(record)
    if gate.kind == GateKind.PLAN:
        void_open_gates(gate.version, why="the plan was rejected", actor=user)
        _set_case_status(
            case,
            CaseStatus.REJECTED,
            user,
            version=gate.version.number,
            reason_code=record.reason_code,
            # The case page says why in words: planning cannot read oversight's reason codes.
            reason_label=_reason_label(record.reason_code),
            reason=record.reason,
        )
        notify.case_decided(case, approved=False, by=user)
        return
    node = gate.node
    if gate.kind == GateKind.ESCALATION:
        # The failed step fails for good through the gate-decided hooks (execution's).
        return
    assert node is not None
    policy = node.failure_policy or "abort"
    if policy == "continue":
        # The step is skipped; the steps that need its output cannot run.
        blocked = _dependents(gate.version, node.key)
        with audited(chain=case_chain(case.pk)) as audit:
            move_node(node, to=NodeStatus.SKIPPED, audit=audit)
            audit.add(
                NewEvent(
                    "planning.node.skipped",
                    user,
                    {"node": node.key, "why": why, "blocked": blocked, "failure_policy": policy},
                )
            )
            block_nodes(
                PlanNode.objects.filter(version=gate.version, key__in=blocked),
                audit=audit,
                why=f"it needs {node.key}, which was skipped",
                actor=user,
            )
    elif policy == "abort":
        with audited(chain=case_chain(case.pk)) as audit:
            before = move_node(node, to=NodeStatus.FAILED, audit=audit)
            audit.add(
                NewEvent(
                    "planning.node.failed",
                    user,
                    {
                        "node": node.key,
                        "why": why,
                        "failure_policy": policy,
                        "before": {"status": before},
                        "after": {"status": NodeStatus.FAILED},
                    },
                )
            )
        void_open_gates(gate.version, why=f"step {node.key} was rejected", actor=user)
        _set_case_status(
            case,
            CaseStatus.REJECTED,
            user,
            node=node.key,
            reason_code=record.reason_code,
            # The case page says why in words: planning cannot read oversight's reason codes.
            reason_label=_reason_label(record.reason_code),
            reason=record.reason,
        )
        notify.case_decided(case, approved=False, by=user)
    else:
        # escalate, and retry/replan (a rejection is not transient; re-planning a rejected step
        # is decided by a supervisor): an escalation gate for the supervisor group. Approving it
        # authorises the step in the rejected gate's place: a signature where that one needed it.
        # The step waited for its step gate (`awaiting_approval`): it goes on waiting, for this.
        open_escalation_gate(
            gate.version,
            node,
            reason=f"step {node.key} {why}; failure policy {policy}",
            actor=user,
            needs_signature=gate.needs_signature,
        )


def bulk_approve(*, gate_ids: Iterable[int], user: User) -> list[Gate]:
    """Approve several low-risk step gates of one plan version, one decision per gate.

    All or nothing: raises GateConflict when a gate is not a pending low-risk step gate without
    signature of the same version, DecisionDenied (each refusal audited, before anything is
    decided) when the user may not decide one of them, and whatever `decide_gate` raises.
    """
    ids = sorted(set(gate_ids))
    if not ids:
        raise GateConflict("select at least one gate")
    gates = list(
        Gate.objects.filter(pk__in=ids).select_related("case", "version", "approver_group")
    )
    if len(gates) != len(ids):
        raise Gate.DoesNotExist("a selected gate does not exist")
    if len({g.version_id for g in gates}) != 1:
        raise GateConflict("bulk approval takes the gates of one plan version")
    for gate in gates:
        if gate.kind != GateKind.STEP or gate.risk != GateRisk.LOW or gate.needs_signature:
            raise GateConflict(
                f"gate {gate.pk} is not a low-risk step gate: approve it on its own page"
            )
    refusals = [(gate, why) for gate in gates if (why := can_decide(user, gate)) is not None]
    for gate, why in refusals:
        _deny(user, gate, "oversight.gate.decision_denied", why)
    if refusals:
        raise DecisionDenied(refusals[0][1])
    with transaction.atomic():
        return [
            decide_gate(gate_id=g.pk, user=user, decision=DecisionInput(decision="approve"))
            for g in gates
        ]


__all__ = [
    "OTHER_REASON",
    "DecisionDenied",
    "DecisionInput",
    "GateConflict",
    "ReasonInvalid",
    "SignatureRefused",
    "bulk_approve",
    "can_decide",
    "check_reason",
    "decide_gate",
    "full_name",
    "signature_meaning",
]
