"""Opening gates: a plan version's gates when it is stored, an approval that no longer holds
re-opened, an escalation for the escalation group, and the open gates of a replaced version voided
(gates.py decides them).

Every function here runs in one transaction that also writes the audit events.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from audit.chain import NewEvent, append_event, case_chain
from audit.transitions import audited
from oversight import notify
from oversight.actions.gate_policy import active_policy, gate_settings, leaf_facts, role_group
from oversight.actions.notifications import read_gate_notices
from oversight.models import (
    OPEN_GATE_STATUSES,
    Gate,
    GateKind,
    GateRisk,
    GateStatus,
)
from oversight.policy import Classification, classify
from oversight.transitions import move_gate
from planning.models import NodeStatus, PlanNode, PlanVersion
from planning.transitions import move_nodes

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
                    gate_data(gate) | {"carried_from": gate.carried_from_id},
                )
                for gate in gates
            )
        )
    notify.gates_opened(case, [g for g in gates if g.status == GateStatus.PENDING])
    return gates


def gate_data(gate: Gate) -> dict[str, Any]:
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
    if gates:
        read_gate_notices(case_id=version.case_id)
    return len(gates)


def reopen_gate(gate: Gate, *, why: str) -> Gate:
    """Open a new pending gate of the same kind (plan, step, or escalation of a rejected step)
    in place of an approval that no longer holds (expired, or its content changed).

    The old gate keeps its decisions and is made `void`, closed (not `expired`: that is a gate
    held past its deadline, still open, which would keep its case from ever ending); the event
    says its approval expired. The approver group is notified.
    """
    now = timezone.now()
    policy = gate_settings(gate)
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
            NewEvent("oversight.gate.opened", None, gate_data(fresh) | {"replaces": gate.pk}),
        )
    read_gate_notices(case_id=gate.case_id)
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
        data=gate_data(gate),
    )
    notify.gates_opened(version.case, [gate])
    return gate


__all__ = ["gate_data", "open_escalation_gate", "open_gates", "reopen_gate", "void_open_gates"]
