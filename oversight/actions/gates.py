"""Gates: open them when a plan version is stored, and decide them (deadlines.py sweeps them past
their deadline; gate_policy.py reads the policy they apply).

Every function here that changes state runs in one transaction that also writes the audit
events. A denial (separation of duties, a wrong signature password) is recorded in a
transaction of its own, so the refusal is in the trail although nothing else changed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from accounts.models import SigningState
from audit.chain import SYSTEM_CHAIN, NewEvent, append_event, case_chain
from audit.transitions import audited
from oversight import notify
from oversight.actions.gate_policy import active_policy, leaf_facts, role_group
from oversight.models import (
    OPEN_GATE_STATUSES,
    Gate,
    GateDecision,
    GateKind,
    GateRisk,
    GateStatus,
    ReasonCode,
)
from oversight.policy import Classification, PolicySettings, classify
from oversight.transitions import move_gate
from planning.models import (
    Case,
    CaseStatus,
    NodeStatus,
    PlanNode,
    PlanVersion,
)
from planning.transitions import block_nodes, move_case, move_node, move_nodes
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


# Opening gates -------------------------------------------------------------------------------


def _risk(level: str) -> str:
    return level if level in GateRisk.values else GateRisk.HIGH


def _plan_gate_reason(gated: int, leaves: int) -> str:
    steps = "no step needs" if gated == 0 else f"{gated} of {leaves} steps need"
    return f"every plan version is approved before any step runs; {steps} a step gate of its own"


@transaction.atomic
def open_gates(version: PlanVersion, *, carried: dict[str, Gate] | None = None) -> list[Gate]:
    """Open the gates of a plan version just stored: one plan gate, a step gate per gated leaf.

    `carried` maps the keys of steps an edit left unchanged to their approved gates in the
    previous version: such a step's new gate is approved already (the approval is carried, with
    a reference to it). Gated leaves are `awaiting_approval`. Idempotent: a version whose plan gate
    exists is left alone. Notifies the approver group of each gate opened.
    """
    existing = list(Gate.objects.filter(version=version))
    if existing:
        return existing
    carried = carried or {}
    case = version.case
    policy_version, policy = active_policy()
    policy_row = policy_version if policy_version.pk else None
    now = timezone.now()
    deadline = now + timedelta(hours=policy.gate_hours)
    remind_at = now + timedelta(hours=policy.gate_hours) / 2
    approvers = role_group(policy.approver_group)
    escalation = role_group(policy.escalation_group)
    leaves = list(PlanNode.objects.filter(version=version, kind=PlanNode.Kind.LEAF))
    classifications: dict[str, Classification] = {
        facts.key: classify(facts, policy) for facts in leaf_facts(leaves)
    }
    gated = [node for node in leaves if classifications[node.key].gated]
    gates = [
        Gate(
            case=case,
            version=version,
            node=None,
            kind=GateKind.PLAN,
            reason=_plan_gate_reason(len(gated), len(leaves)),
            reasons=[],
            risk=_risk(
                max(
                    (classifications[n.key].level for n in gated),
                    default="low",
                    key=("low", "medium", "high").index,
                )
            ),
            approver_group=approvers,
            escalation_group=escalation,
            quorum=1,
            content_hash=version.content_hash,
            policy_version=policy_row,
            opened_at=now,
            remind_at=remind_at,
            deadline=deadline,
        )
    ]
    for node in gated:
        found = classifications[node.key]
        previous = carried.get(node.key)
        is_carried = previous is not None and previous.content_hash == node.content_hash
        gates.append(
            Gate(
                case=case,
                version=version,
                node=node,
                kind=GateKind.STEP,
                status=GateStatus.APPROVED if is_carried else GateStatus.PENDING,
                reason=found.reason,
                reasons=[
                    {"classifier": f.classifier, "detail": f.detail, "level": f.level}
                    for f in found.reasons
                ],
                risk=_risk(found.level),
                approver_group=approvers,
                escalation_group=escalation,
                quorum=found.quorum,
                approvals=previous.approvals if is_carried and previous else 0,
                needs_signature=found.needs_signature,
                content_hash=node.content_hash,
                policy_version=policy_row,
                opened_at=now,
                remind_at=remind_at,
                deadline=deadline,
                decided_at=previous.decided_at if is_carried and previous else None,
                approval_expires_at=previous.approval_expires_at
                if is_carried and previous
                else None,
                carried_from=previous if is_carried else None,
            )
        )
    gates = Gate.objects.bulk_create(gates)
    pending_keys = [
        g.node.key for g in gates if g.node is not None and g.status == GateStatus.PENDING
    ]
    with audited(chain=case_chain(case.pk)) as audit:
        # A gated step waits for its gate: the gate's opening event names the step.
        move_nodes(
            PlanNode.objects.filter(version=version, key__in=pending_keys),
            to=NodeStatus.AWAITING_APPROVAL,
            audit=audit,
        )
        audit.add(
            *(
                NewEvent(
                    "oversight.gate.opened"
                    if gate.carried_from is None
                    else "oversight.gate.carried",
                    None,
                    _gate_data(gate) | {"carried_from": gate.carried_from_id},
                )
                for gate in gates
            )
        )
    notify.gates_opened(case, [g for g in gates if g.status == GateStatus.PENDING])
    return gates


def _gate_data(gate: Gate) -> dict[str, Any]:
    return {
        "gate": gate.pk,
        "kind": gate.kind,
        "case": gate.case_id,
        "version": gate.version.number,
        "node": gate.node.key if gate.node is not None else None,
        "status": gate.status,
        "reason": gate.reason,
        "risk": gate.risk,
        "quorum": gate.quorum,
        "needs_signature": gate.needs_signature,
        "content_hash": gate.content_hash,
        "approver_group": gate.approver_group.name,
        "deadline": gate.deadline.isoformat(),
        "policy_version": gate.policy_version.number if gate.policy_version else None,
    }


@transaction.atomic
def void_open_gates(version: PlanVersion, *, why: str, actor: User | None = None) -> int:
    """Make every open gate of a version `void` (an edit replaced it, the case ended)."""
    gates = list(
        Gate.objects.select_for_update(of=("self",))
        .select_related("version", "node", "approver_group", "policy_version")
        .filter(version=version, status__in=OPEN_GATE_STATUSES)
    )
    with audited(chain=case_chain(version.case_id)) as audit:
        for gate in gates:
            before = move_gate(gate, to=GateStatus.VOID, audit=audit)
            audit.add(
                NewEvent(
                    "oversight.gate.voided",
                    actor,
                    {
                        "gate": gate.pk,
                        "why": why,
                        "before": {"status": before},
                        "after": {"status": GateStatus.VOID},
                    },
                )
            )
    return len(gates)


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
    version: int | None = None
    content_hash: str | None = None


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


def signature_meaning(gate: Gate) -> str:
    """Return what an approval of this gate means, in words, as the signature records it."""
    if gate.node is None:
        return f"approval of plan version {gate.version.number} of case #{gate.case_id}"
    tool = f" ({gate.node.tool})" if gate.node.tool else ""
    return (
        f"approval of step {gate.node.key}{tool} in plan version {gate.version.number} "
        f"of case #{gate.case_id}"
    )


def _check_signature(user: User, gate: Gate, password: str | None) -> None:
    """Raise SignatureRefused unless the password is right; count and lock wrong ones (R7).

    A wrong password is counted in its own transaction, so the count survives the refusal.
    """
    state, _ = SigningState.objects.get_or_create(user=user)
    if state.locked_at is not None:
        _deny(user, gate, "oversight.signature.refused", "signing is locked")
        raise SignatureRefused(
            "signing is locked after too many wrong passwords; an admin must unlock it"
        )
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
        _check_signature(user, gate, decision.password)
    return _decide(gate_id, user, decision, reason_code)


def _policy_of(gate: Gate) -> PolicySettings:
    """Return the settings of the policy version the gate was opened under (else the active)."""
    if gate.policy_version is not None:
        try:
            return PolicySettings.from_data(gate.policy_version.values)
        except ValueError:
            logger.exception("policy version %s is unreadable", gate.policy_version.number)
    return active_policy()[1]


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
        valid = timedelta(hours=_policy_of(gate).approval_valid_hours)
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
                    "signature": {"meaning": meaning, "hash": record.signature_hash}
                    if signed
                    else None,
                    "before": before,
                    "after": {"status": gate.status, "approvals": gate.approvals},
                },
            )
        )
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


def reopen_gate(gate: Gate, *, why: str) -> Gate:
    """Open a new pending gate of the same kind (plan, step, or escalation of a rejected step)
    in place of an approval that no longer holds (expired, or its content changed).

    The old gate keeps its decisions and is made `void`, closed (not `expired`: that is a gate
    held past its deadline, still open, which would keep its case from ever ending); the event
    says its approval expired. The approver group is notified.
    """
    now = timezone.now()
    policy = _policy_of(gate)
    with audited(chain=case_chain(gate.case_id)) as audit:
        # The old gate is void before its successor opens (one live gate per version or step).
        before = move_gate(gate, to=GateStatus.VOID, audit=audit)
        fresh = Gate.objects.create(
            case_id=gate.case_id,
            version=gate.version,
            node=gate.node,
            kind=gate.kind,
            reason=f"{gate.reason}; re-approval needed: {why}",
            reasons=gate.reasons,
            risk=gate.risk,
            approver_group=gate.approver_group,
            escalation_group=gate.escalation_group,
            quorum=gate.quorum,
            needs_signature=gate.needs_signature,
            content_hash=gate.node.content_hash if gate.node else gate.version.content_hash,
            policy_version=gate.policy_version,
            opened_at=now,
            remind_at=now + timedelta(hours=policy.gate_hours) / 2,
            deadline=now + timedelta(hours=policy.gate_hours),
        )
        audit.add(
            NewEvent(
                "oversight.gate.expired",
                None,
                {
                    "gate": gate.pk,
                    "why": why,
                    "before": {"status": before},
                    "after": {"status": GateStatus.VOID},
                },
            ),
            NewEvent("oversight.gate.opened", None, _gate_data(fresh) | {"replaces": gate.pk}),
        )
    notify.gates_opened(fresh.case, [fresh])
    return fresh


@transaction.atomic
def open_escalation_gate(
    version: PlanVersion,
    node: PlanNode | None,
    *,
    reason: str,
    actor: User | None = None,
    risk: str = GateRisk.HIGH,
    needs_signature: bool = False,
) -> Gate:
    """Open an escalation gate for the escalation group of the active policy.

    Its approval is an e-signature when `needs_signature`, and whenever the step's own gate in
    this version asks for one: approving an escalation lets the step run, so it weighs what
    approving the step does (a failed, rejected or re-routed payment hold is still signed for).
    """
    if node is not None and not needs_signature:
        needs_signature = Gate.objects.filter(
            version=version, node=node, kind=GateKind.STEP, needs_signature=True
        ).exists()
    policy_version, policy = active_policy()
    now = timezone.now()
    gate = Gate.objects.create(
        case=version.case,
        version=version,
        node=node,
        kind=GateKind.ESCALATION,
        reason=reason,
        reasons=[{"classifier": "escalation", "detail": reason, "level": risk}],
        risk=risk,
        approver_group=role_group(policy.escalation_group),
        escalation_group=role_group(policy.escalation_group),
        needs_signature=needs_signature,
        content_hash=node.content_hash if node is not None else version.content_hash,
        policy_version=policy_version if policy_version.pk else None,
        opened_at=now,
        remind_at=now + timedelta(hours=policy.gate_hours) / 2,
        deadline=now + timedelta(hours=policy.gate_hours),
    )
    append_event(
        "oversight.gate.opened",
        actor=actor,
        chain=case_chain(version.case_id),
        data=_gate_data(gate),
    )
    notify.gates_opened(version.case, [gate])
    return gate


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
    "open_escalation_gate",
    "open_gates",
    "signature_meaning",
    "void_open_gates",
]
