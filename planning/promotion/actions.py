"""Make an LLM-planned subtree a static method of its pack: propose, approve, reject, retire.

Who: officers (who decide gates) and admins (who configure), checked in each action. The node
must be a compound of the case's current plan whose children the LLM planned (provenance source
"llm:…"), and every leaf under it must have succeeded: a leaf runs only once its plan was
approved at the plan gate (and its own gate, if it had one), so that is "approved and
successfully executed". A case that failed or was cancelled is not promoted from.

The proposal stores the guard its proposer confirmed (conditions on the case's inputs), the
subtree as it ran (leaves with their literal agent, task, tool and inputs; a compound a method
of the pack planned is kept as a reference to its task) and its content hash. A second person
approves it: not its proposer and not the source case's submitter. Approving version n+1 of a
name retires the active version n. Every step runs in one transaction with its audit event on the
source case's chain (`planning.method.proposed`, `.approved`, `.rejected`, `.retired`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.text import slugify

from audit.chain import append_event, case_chain
from planning import rules
from planning.catalogue import registered_packs
from planning.models import Case, CaseStatus, NodeStatus, PlanNode, PromotedMethod
from planning.promotion.methods import (
    MethodInvalid,
    method_hash,
    parse_guard,
    parse_subtree,
    row_hash,
)

DECIDE_GATE = "oversight.decide_gate"
NAME_MAX_LENGTH = 80
REASON_MAX_LENGTH = 1000
# Statuses a case may be in when its subtree is promoted: its steps ran and it did not fail.
PROMOTABLE_CASE_STATUSES = (CaseStatus.EXECUTING, CaseStatus.VERIFYING, CaseStatus.COMPLETED)

type Someone = AbstractBaseUser | AnonymousUser


class PromotionDenied(PermissionDenied):
    """The user may not take this step (not an officer or admin, or their own proposal)."""


class PromotionConflict(Exception):
    """The method is not in a state that allows this step, or the name's version was taken."""


class NotPromotable(ValueError):
    """The node cannot be promoted; the message says why in words."""


@dataclass(frozen=True, slots=True)
class Proposal:
    """What a proposal would store: the subtree, the suggested guard and the agents."""

    node: PlanNode
    subtree: list[dict[str, Any]]
    agents: list[str]
    leaves: int


# Who ----------------------------------------------------------------------------------------


def can_promote(user: Someone) -> bool:
    """Tell whether the user proposes, approves, rejects and retires promoted methods."""
    return bool(
        isinstance(user, User)
        and user.is_active
        and (user.has_perm(DECIDE_GATE) or user.has_perm(rules.CONFIGURE))
    )


def can_view_methods(user: Someone) -> bool:
    """Tell whether the user reads the methods pages (officers, auditors, admins)."""
    return can_promote(user) or rules.can_view_all_cases(user)  # type: ignore[arg-type]


def require_promoter(user: Someone) -> User:
    """Return the user as a promoter; raise PromotionDenied otherwise."""
    if not can_promote(user):
        raise PromotionDenied("Only compliance officers and admins promote methods.")
    assert isinstance(user, User)
    return user


# Eligibility and the subtree ------------------------------------------------------------------


def _is_llm(node: PlanNode) -> bool:
    provenance = node.provenance if isinstance(node.provenance, dict) else {}
    return str(provenance.get("source", "")).startswith("llm:")


def _children_of(rows: Iterable[PlanNode]) -> dict[int | None, list[PlanNode]]:
    children: dict[int | None, list[PlanNode]] = {}
    for row in sorted(rows, key=lambda r: r.position):
        children.setdefault(row.parent_id, []).append(row)
    return children


def _spec(row: PlanNode, children: Mapping[int | None, list[PlanNode]]) -> dict[str, Any]:
    declared = row.declared_depends_on
    if row.is_leaf:
        return {
            "kind": "leaf",
            "key": row.key,
            "agent": row.agent,
            "task": row.task,
            "rationale": row.rationale,
            "tool": row.tool or None,
            "inputs": row.inputs or {},
            "depends_on": declared,
            "expected_output": row.expected_output or None,
            "failure_policy": row.failure_policy or "abort",
            # A tool's risk class comes from the registry when the method is used again.
            "risk": None if row.tool else (row.risk or None),
        }
    if not _is_llm(row):
        # A compound a method planned: its methods plan it again, as they are then.
        return {
            "kind": "task",
            "key": row.key,
            "task": row.name,
            "description": row.description,
            "depends_on": declared,
        }
    return {
        "kind": "compound",
        "key": row.key,
        "name": row.name,
        "description": row.description,
        "depends_on": declared,
        "children": [_spec(child, children) for child in children.get(row.pk, [])],
    }


def _subtree_leaves(
    node: PlanNode, children: Mapping[int | None, list[PlanNode]]
) -> list[PlanNode]:
    out: list[PlanNode] = []
    for child in children.get(node.pk, []):
        out.extend([child] if child.is_leaf else _subtree_leaves(child, children))
    return out


def proposal_for(case: Case, node: PlanNode, rows: Sequence[PlanNode] | None = None) -> Proposal:
    """Return what promoting `node` would store; raise NotPromotable saying why not.

    `rows` are the nodes of the node's version when the caller has them (else one query).
    """
    if case.domain not in registered_packs():
        raise NotPromotable("Only a case of a domain pack can give its pack a method.")
    if node.version_id != case.current_version_id:
        raise NotPromotable("Only a step of the case's current plan version can be promoted.")
    if node.is_leaf:
        raise NotPromotable(
            "A single step cannot be promoted: choose the compound task it belongs to."
        )
    if not _is_llm(node):
        raise NotPromotable(
            "This part of the plan was not planned by the LLM (its provenance is "
            f"{node.provenance.get('source', '?') if isinstance(node.provenance, dict) else '?'})"
            ": only an LLM-planned subtree becomes a method."
        )
    if case.status not in PROMOTABLE_CASE_STATUSES:
        raise NotPromotable(
            f"The case is {case.get_status_display().lower()}: only a subtree of an approved "
            "case whose steps ran (executing, verifying or completed) can be promoted."
        )
    if rows is None:
        rows = list(PlanNode.objects.filter(version_id=node.version_id))
    children = _children_of(rows)
    leaves = _subtree_leaves(node, children)
    unfinished = [leaf.key for leaf in leaves if leaf.status != NodeStatus.SUCCEEDED]
    if not leaves or unfinished:
        shown = ", ".join(unfinished[:5]) + ("…" if len(unfinished) > 5 else "")
        raise NotPromotable(
            "Every step of the subtree must have succeeded before it is promoted; not yet: "
            f"{shown or 'it has no steps'}."
        )
    subtree = [_spec(child, children) for child in children.get(node.pk, [])]
    agents = sorted({leaf.agent for leaf in leaves})
    return Proposal(node=node, subtree=subtree, agents=agents, leaves=len(leaves))


def suggested_name(case: Case, node: PlanNode) -> str:
    """Return a method name to start from: the task and the first input's value."""
    pack = registered_packs().get(case.domain)
    first = next(iter(pack.input_schema.model_fields), "") if pack else ""
    value = case.inputs.get(first) if first else None
    base = f"{node.name}-{value}" if isinstance(value, str) and value else node.name
    return slugify(base)[:NAME_MAX_LENGTH] or "promoted-method"


def distinguishing_inputs(case: Case) -> set[str]:
    """Return the inputs a proposal form ticks at first: the pack schema's first field (the
    incident pack's `kind`), which is what tells one kind of case from another."""
    pack = registered_packs().get(case.domain)
    first = next(iter(pack.input_schema.model_fields), None) if pack else None
    return {first} if first and first in case.inputs else set()


# Actions ----------------------------------------------------------------------------------


def _name(value: str) -> str:
    name = value.strip()
    if not name or slugify(name) != name or len(name) > NAME_MAX_LENGTH:
        raise MethodInvalid(
            f"The name must be a slug (lower-case letters, digits and '-') of at most "
            f"{NAME_MAX_LENGTH} characters, e.g. {slugify(name)[:NAME_MAX_LENGTH] or 'x'!r}."
        )
    return name


def _reason(value: str) -> str:
    reason = value.strip()
    if not reason:
        raise MethodInvalid("Give a reason.")
    if len(reason) > REASON_MAX_LENGTH or rules.text_problem(reason):
        raise MethodInvalid(f"The reason is plain text of at most {REASON_MAX_LENGTH} characters.")
    return reason


def _checked_guard(conditions: Any, case: Case) -> list[dict[str, Any]]:
    guard = parse_guard(conditions)
    for condition in guard:
        if condition.key not in case.inputs:
            raise MethodInvalid(
                f"The guard names {condition.key!r}, which is not an input of the case."
            )
        if not condition.holds(case.inputs):
            raise MethodInvalid(
                f"The condition '{condition.describe()}' does not hold for the source case."
            )
    return [condition.model_dump(mode="json") for condition in guard]


def _data(method: PromotedMethod, **extra: Any) -> dict[str, Any]:
    return {
        "method": method.pk,
        "pack": method.pack,
        "task": method.task,
        "name": method.name,
        "version": method.version,
        "content_hash": method.content_hash,
        "source_case": method.source_case_id,
        "source_node": method.source_node_id,
        **extra,
    }


@transaction.atomic
def propose_method(
    *, user: Someone, case_id: int, node_id: int, name: str, guard: Any
) -> PromotedMethod:
    """Propose the LLM-planned subtree under `node_id` as the next version of method `name`.

    Raises PromotionDenied (not an officer or admin), PlanNode.DoesNotExist (no such node in the
    case), NotPromotable (why the node cannot be promoted), MethodInvalid (the name or the
    guard), and PromotionConflict when another proposal took the version number meanwhile.
    """
    proposer = require_promoter(user)
    case = Case.objects.select_for_update().get(pk=case_id)
    node = PlanNode.objects.get(pk=node_id, version__case=case)
    proposal = proposal_for(case, node)
    method_name = _name(name)
    conditions = _checked_guard(guard, case)
    subtree = [child.model_dump(mode="json") for child in parse_subtree(proposal.subtree)]
    latest = PromotedMethod.objects.filter(pack=case.domain, name=method_name).aggregate(
        v=Max("version")
    )["v"]
    version = (latest or 0) + 1
    body: dict[str, Any] = {
        "pack": case.domain,
        "task": node.name,
        "name": method_name,
        "version": version,
        "description": node.description,
        "guard": conditions,
        "subtree": subtree,
    }
    try:
        with transaction.atomic():
            method = PromotedMethod.objects.create(
                **body,
                content_hash=method_hash(**body),
                source_case=case,
                source_version_id=node.version_id,
                source_node=node,
                proposed_by=proposer,
            )
    except IntegrityError:
        raise PromotionConflict(
            f"Version {version} of {method_name} was proposed meanwhile: try again."
        ) from None
    append_event(
        "planning.method.proposed",
        actor=proposer,
        chain=case_chain(case.pk),
        data=_data(method, guard=conditions, agents=proposal.agents, leaves=proposal.leaves),
    )
    return method


def _locked(method_id: int) -> PromotedMethod:
    return (
        PromotedMethod.objects.select_for_update().select_related("source_case").get(pk=method_id)
    )


@transaction.atomic
def approve_method(*, user: Someone, method_id: int) -> PromotedMethod:
    """Approve a proposed method: it becomes active and retires the name's active version.

    Raises PromotionDenied (not an officer or admin, the proposer, or the source case's
    submitter), PromotionConflict (not proposed), MethodInvalid (the row was changed since it
    was proposed), PromotedMethod.DoesNotExist.
    """
    approver = require_promoter(user)
    method = _locked(method_id)
    if method.status != PromotedMethod.Status.PROPOSED:
        raise PromotionConflict(f"The method is {method.status}, not proposed.")
    if method.proposed_by_id == approver.pk:
        raise PromotionDenied("A second person approves a method: not the one who proposed it.")
    if method.source_case.submitter_id == approver.pk:
        raise PromotionDenied("The submitter of the source case does not approve its method.")
    if row_hash(method) != method.content_hash:
        raise MethodInvalid("The method was changed since it was proposed: it cannot be approved.")
    parse_guard(method.guard)
    parse_subtree(method.subtree)
    now = timezone.now()
    chain = case_chain(method.source_case_id)
    superseded = list(
        PromotedMethod.objects.select_for_update().filter(
            pack=method.pack, name=method.name, status=PromotedMethod.Status.ACTIVE
        )
    )
    for old in superseded:
        old.status = PromotedMethod.Status.RETIRED
        old.retired_by = approver
        old.retired_at = now
        old.retire_reason = f"superseded by version {method.version}"
        old.save(update_fields=["status", "retired_by", "retired_at", "retire_reason"])
        append_event(
            "planning.method.retired",
            actor=approver,
            chain=case_chain(old.source_case_id),
            data=_data(old, reason=old.retire_reason, superseded_by=method.version),
        )
    method.status = PromotedMethod.Status.ACTIVE
    method.approved_by = approver
    method.approved_at = now
    try:
        with transaction.atomic():
            method.save(update_fields=["status", "approved_by", "approved_at"])
    except IntegrityError:
        # Another version of the name was approved at the same moment (one active per name).
        raise PromotionConflict(
            f"Another version of {method.name} was approved meanwhile: reload and try again."
        ) from None
    append_event("planning.method.approved", actor=approver, chain=chain, data=_data(method))
    return method


# The event of each way a method closes, by verb (codes spelt out for tests/audit).
_CLOSED: Mapping[str, str] = {
    "rejected": "planning.method.rejected",
    "retired": "planning.method.retired",
}


def _close(
    user: Someone, method_id: int, reason: str, *, expected: str, status: str, verb: str
) -> PromotedMethod:
    """Move a method from `expected` to `status` with a reason, recording who and when."""
    closer = require_promoter(user)
    why = _reason(reason)
    method = _locked(method_id)
    if method.status != expected:
        raise PromotionConflict(f"The method is {method.status}, not {expected}.")
    prefix = "rejection" if verb == "rejected" else "retire"
    method.status = status
    setattr(method, f"{verb}_by", closer)
    setattr(method, f"{verb}_at", timezone.now())
    setattr(method, f"{prefix}_reason", why)
    method.save(update_fields=["status", f"{verb}_by", f"{verb}_at", f"{prefix}_reason"])
    append_event(
        _CLOSED[verb],
        actor=closer,
        chain=case_chain(method.source_case_id),
        data=_data(method, reason=why),
    )
    return method


@transaction.atomic
def reject_method(*, user: Someone, method_id: int, reason: str) -> PromotedMethod:
    """Reject a proposed method with a reason (its proposer may withdraw it this way).

    Raises PromotionDenied, PromotionConflict (not proposed), MethodInvalid (no reason).
    """
    return _close(
        user,
        method_id,
        reason,
        expected=PromotedMethod.Status.PROPOSED,
        status=PromotedMethod.Status.REJECTED,
        verb="rejected",
    )


@transaction.atomic
def retire_method(*, user: Someone, method_id: int, reason: str) -> PromotedMethod:
    """Retire an active method with a reason: planning no longer uses it.

    Raises PromotionDenied, PromotionConflict (not active), MethodInvalid (no reason).
    """
    return _close(
        user,
        method_id,
        reason,
        expected=PromotedMethod.Status.ACTIVE,
        status=PromotedMethod.Status.RETIRED,
        verb="retired",
    )


__all__ = [
    "NotPromotable",
    "PromotionConflict",
    "PromotionDenied",
    "Proposal",
    "approve_method",
    "can_promote",
    "can_view_methods",
    "distinguishing_inputs",
    "proposal_for",
    "propose_method",
    "reject_method",
    "require_promoter",
    "retire_method",
    "suggested_name",
]
