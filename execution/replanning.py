"""Re-planning a failed step (failure policy `replan`): a new plan version that people approve.

Execution calls `replan_failed_leaf` inside the transaction that
records the failure (the leaf and its case locked). It re-decomposes the failed leaf's parent
compound task — its subtree — by the case's strategy, never with the decomposition that failed:

- static, forward and hybrid plans try the next applicable method of the pack for that task;
  the method that failed, every method excluded by an earlier re-plan of the same subtree, and
  every method whose steps include the failed step unchanged (it would fail for the same reason)
  are left out;
- goal-oriented plans search again without the failed capability (and those excluded before).

The new version keeps everything outside the subtree. Steps that already ended there keep their
status and output, and so do steps inside it that the new decomposition keeps unchanged (same
key, same content hash): nothing that succeeded runs again. A new step that would reuse the key
of a replaced one gets a new key, so that it cannot inherit that step's idempotency key. The plan
is validated in full like an edit; the case is `awaiting_approval` again with a new plan gate (the
system, not a person, made the version: no officer is excluded from approving it as its editor).
On the old version nothing new starts (its open steps are cancelled, its gates void); a step still
running ends at its next safe point or records its result on the old version, and the new plan
gate cannot be approved before it has ended (oversight's gates refuse it). Approving it carries the
results of such steps over (`before_start`) and execution continues on the new version. All of
this holds for an edit of the re-planned version too (and an edit of that edit): the edit keeps
the steps that ended and that it leaves unchanged (oversight.actions.kept_steps), its plan gate
waits for the old version's running steps, and approving it carries their results over.

Nothing here commits: a re-plan that is not possible (no alternative, `CASEHUB_MAX_REPLANS`
reached, a plan that does not validate) is audited and answered False, and the step escalates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from django.conf import settings

from audit.chain import NewEvent, append_event, case_chain
from audit.transitions import audited
from execution.cases import cancel_open_leaves, fail_and_block
from oversight.actions.kept_steps import carry_results
from oversight.actions.opening import open_gates, void_open_gates
from oversight.models import Gate, GateKind, GateStatus
from planning.actions import plan_limits
from planning.catalogue import all_tool_specs, current_catalogue, enabled_pack
from planning.core.dag import DagPlan
from planning.core.diff import diff_plans
from planning.core.errors import NoMethodMatched, PlanningError
from planning.core.forward import ForwardDecomposition
from planning.core.goal import GoalOrientedDecomposition
from planning.core.pack import DomainPack
from planning.core.serialize import node_hash
from planning.core.static import MethodLibrary, StaticDecomposition
from planning.core.tree import Compound, Goal, Leaf, Node, StrategyName
from planning.core.validation import validate_plan
from planning.models import Case, CaseStatus, NodeStatus, PlanNode, PlanVersion, Strategy
from planning.planner import case_state
from planning.promotion.methods import PROMOTED_PREFIX, MethodInvalid, library_for
from planning.transitions import move_case
from planning.versions import (
    KEPT_STATUSES,
    REPLAN,
    is_replan,
    load_plan,
    replan_origin,
    store_version,
    with_tool_risks,
)

LEAF = PlanNode.Kind.LEAF
# The open leaves of a replaced version that `cancel_open_leaves` cancels (a running one ends).
WAITING_LEAF_STATUSES = (
    NodeStatus.PENDING,
    NodeStatus.AWAITING_APPROVAL,
    NodeStatus.READY,
    NodeStatus.RETRYING,
)
# Renaming colliding keys converges in one pass per collision; this bounds a pathological pack.
MAX_RENAME_PASSES = 20


class NoAlternative(Exception):
    """The failed step cannot be re-planned (the reason says why); it escalates instead."""


def max_replans() -> int:
    """Return how many times one case may be re-planned (`CASEHUB_MAX_REPLANS`)."""
    return int(getattr(settings, "CASEHUB_MAX_REPLANS", 2))


def _replans(case: Case) -> list[dict[str, Any]]:
    edits = case.versions.order_by("number").values_list("edit", flat=True)
    return [e for e in edits if isinstance(e, dict) and e.get("kind") == REPLAN]


# Re-decomposition (pure but for reading the pack) ---------------------------------------------


def _used(subtree: Compound, leaf: Leaf, strategy: str) -> str:
    """Return the method (or, for goal plans, the capability) that made the failed step."""
    if strategy == Strategy.GOAL:
        return leaf.provenance.source
    source = subtree.provenance.source
    return source.removeprefix("static:")


def _same_step(a: Leaf, b: Leaf) -> bool:
    return (a.agent, a.task, a.tool, a.inputs) == (b.agent, b.task, b.tool, b.inputs)


def _with_strategy(node: Node, strategy: StrategyName) -> Node:
    node = dataclasses.replace(
        node, provenance=dataclasses.replace(node.provenance, strategy=strategy)
    )
    if isinstance(node, Compound):
        node = dataclasses.replace(
            node, children=tuple(_with_strategy(c, strategy) for c in node.children)
        )
    return node


def _swap(node: Node, key: str, new: Node) -> Node:
    if node.key == key:
        return new
    if isinstance(node, Leaf):
        return node
    return dataclasses.replace(node, children=tuple(_swap(c, key, new) for c in node.children))


def _keys(node: Node) -> set[str]:
    return {n.key for n in node.walk()} if isinstance(node, Compound) else {node.key}


def _static_subtree(
    pack: DomainPack,
    state: Mapping[str, Any],
    subtree: Compound,
    excluded: frozenset[str],
    taken: frozenset[str],
    strategy: StrategyName,
) -> tuple[str, Compound]:
    """Decompose `subtree`'s task again with the pack's methods minus `excluded`."""
    methods = [m for m in library_for(pack) if not (m.task == subtree.name and m.name in excluded)]
    static = StaticDecomposition(MethodLibrary(methods))
    placeholder = Compound(
        key=subtree.key,
        name=subtree.name,
        description=subtree.description,
        depends_on=subtree.depends_on,
        provenance=subtree.provenance,
    )
    # The same placement as planning: the keys of the rest of the plan are taken.
    filled, _ = static._fill(placeholder, MappingProxyType(dict(state)), taken, ())
    assert isinstance(filled, Compound)
    filled = _with_strategy(filled, strategy)
    assert isinstance(filled, Compound)
    source = filled.provenance.source
    if strategy == "hybrid" and not source.startswith(PROMOTED_PREFIX):
        filled = dataclasses.replace(
            filled,
            provenance=dataclasses.replace(filled.provenance, source=f"static:{source}"),
        )
    return source, filled


def _forward_subtree(
    pack: DomainPack,
    state: Mapping[str, Any],
    root: Compound,
    subtree: Compound,
    excluded: frozenset[str],
) -> tuple[str, Compound]:
    """Plan the goal forward again without `excluded` for the subtree's task; return the subtree.

    Forward planning derives dependencies from the projected state, so the subtree is cut from a
    whole new forward plan: its steps wait for what they read, as in the first plan.
    """
    methods = [m for m in library_for(pack) if not (m.task == subtree.name and m.name in excluded)]
    forward = ForwardDecomposition(MethodLibrary(methods))
    plan = forward.plan(Goal(name=root.name, description=root.description), state)
    try:
        node = plan.node(subtree.key)
    except KeyError:
        node = None
    if not isinstance(node, Compound) or node.name != subtree.name:
        raise NoAlternative(f"the new forward plan has no task {subtree.key!r} to take")
    return node.provenance.source, node


def _goal_plan(
    pack: DomainPack, state: Mapping[str, Any], root: Compound, excluded: frozenset[str]
) -> tuple[str, Compound]:
    """Search the goal again without the `excluded` capabilities; return the new root."""
    planner = pack.goal_planner(state)
    capabilities = [c for c in planner.capabilities if c.name not in excluded]
    search = GoalOrientedDecomposition(capabilities, planner.goals)
    plan = search.plan(Goal(name=root.name, description=root.description), state)
    return "a-star", plan.root


@dataclasses.dataclass(frozen=True, slots=True)
class Replanned:
    """A re-planned plan: the new `DagPlan`, the subtree it replaced (as it was), the method
    chosen and the methods left out."""

    plan: DagPlan
    subtree: Compound
    method: str
    excluded: frozenset[str]


def _build(root: Node, old: DagPlan, note: str) -> DagPlan:
    assert isinstance(root, Compound)
    try:
        plan = DagPlan.build(root, warnings=(*old.warnings, note), llm_calls=old.llm_calls)
        validate_plan(plan, current_catalogue(), plan_limits())
    except (PlanningError, ValueError, TypeError) as exc:
        raise NoAlternative(f"the re-planned version is not valid: {exc}") from None
    return with_tool_risks(plan, {name: spec.risk for name, spec in all_tool_specs().items()})


def _redecompose(
    case: Case,
    old: DagPlan,
    failed: Leaf,
    old_rows: Mapping[str, PlanNode],
    excluded: set[str],
    note: str,
) -> Replanned:
    """Return the old plan with the failed step's subtree decomposed another way.

    Raises NoAlternative when no other decomposition exists or the result does not validate.
    """
    if case.strategy not in (Strategy.STATIC, Strategy.FORWARD, Strategy.HYBRID, Strategy.GOAL):
        raise NoAlternative(f"re-planning a {case.strategy} plan with the LLM is not built yet")
    pack = enabled_pack(case.domain) if case.domain else None
    if pack is None:
        raise NoAlternative("the case has no enabled domain pack whose methods could re-plan it")
    state = case_state(case, pack)
    parent = old.parent_of(failed.key)
    assert parent is not None  # every leaf has a parent: the root at least
    subtree = old.root if case.strategy == Strategy.GOAL else parent
    outside = _keys(old.root) - _keys(subtree)
    strategy: StrategyName = case.strategy  # type: ignore[assignment]
    renamed: set[str] = set()
    for _ in range(MAX_RENAME_PASSES):
        try:
            if case.strategy == Strategy.GOAL:
                method, new_subtree = _goal_plan(pack, state, subtree, frozenset(excluded))
            elif case.strategy == Strategy.FORWARD:
                method, new_subtree = _forward_subtree(
                    pack, state, old.root, subtree, frozenset(excluded)
                )
            else:
                taken = frozenset(outside | {subtree.key} | renamed)
                method, new_subtree = _static_subtree(
                    pack, state, subtree, frozenset(excluded), taken, strategy
                )
        except NoMethodMatched as exc:
            tried = ", ".join(exc.methods_tried) or "none"
            raise NoAlternative(
                f"no other decomposition of {subtree.name!r} applies (tried: {tried}; "
                f"left out: {', '.join(sorted(excluded)) or 'none'})"
            ) from None
        except (PlanningError, MethodInvalid) as exc:
            raise NoAlternative(f"re-planning {subtree.name!r} failed: {exc}") from None
        repeats = [
            leaf
            for leaf in new_subtree.iter_leaves()
            if _same_step(leaf, failed) and case.strategy != Strategy.GOAL
        ]
        if repeats:
            # This decomposition contains the step that failed, unchanged: it would fail again.
            excluded.add(method)
            continue
        plan = _build(_swap(old.root, subtree.key, new_subtree), old, note)
        inside = {leaf.key for leaf in new_subtree.iter_leaves()}
        clashes = {
            leaf.key
            for leaf in plan.leaves
            if leaf.key in inside
            and leaf.key in old_rows
            and not _kept(leaf, plan, old_rows, (NodeStatus.SUCCEEDED,))
        }
        if case.strategy in (Strategy.GOAL, Strategy.FORWARD) and clashes:
            # These plans place their own keys: a clash cannot be placed again, so it escalates.
            raise NoAlternative(
                f"the new plan reuses the keys {', '.join(sorted(clashes))} for other steps"
            )
        if not clashes:
            return Replanned(
                plan=plan, subtree=subtree, method=method, excluded=frozenset(excluded)
            )
        # A new step must not take over a replaced step's key (and idempotency key): place again.
        renamed |= clashes
    raise NoAlternative("the re-planned steps' keys could not be made unique")


def _kept(
    leaf: Leaf,
    plan: DagPlan,
    old_rows: Mapping[str, PlanNode],
    statuses: Iterable[str] = KEPT_STATUSES,
) -> bool:
    """Tell whether the old version's step of this key ended already with the same content."""
    row = old_rows.get(leaf.key)
    return (
        row is not None
        and row.status in tuple(statuses)
        and row.content_hash == node_hash(leaf, sorted(plan.dependencies[leaf.key]))
    )


# The use case ----------------------------------------------------------------------------------


def _refuse(node: PlanNode, case: Case, why: str, reason: str) -> bool:
    append_event(
        "execution.replan.refused",
        chain=case_chain(case.pk),
        data={
            "node": node.key,
            "version": node.version.number,
            "failure": why,
            "why": reason,
            "replans": len(_replans(case)),
            "max_replans": max_replans(),
        },
    )
    return False


def replan_failed_leaf(*, node: PlanNode, case: Case, why: str) -> bool:
    """Store a re-planned version for a failed leaf and put the case back to plan approval.

    Call inside the failing transaction with the leaf and the case locked. Returns False, with
    an `execution.replan.refused` event, when the case cannot be re-planned (no alternative
    decomposition, the re-plan limit reached, a plan that does not validate): the caller then
    escalates. Commits nothing itself.
    """
    previous = _replans(case)
    if len(previous) >= max_replans():
        return _refuse(
            node,
            case,
            why,
            f"the case was re-planned {len(previous)} time(s) already "
            f"(CASEHUB_MAX_REPLANS is {max_replans()})",
        )
    old = node.version
    old_plan = load_plan(old)
    failed = old_plan.leaf(node.key)
    parent = old_plan.parent_of(node.key)
    assert parent is not None
    subtree_key = old_plan.root.key if case.strategy == Strategy.GOAL else parent.key
    excluded = {_used(parent, failed, case.strategy)}
    for edit in previous:
        if edit.get("subtree") == subtree_key:
            excluded |= set(edit.get("excluded", ()))
    old_rows = {row.key: row for row in PlanNode.objects.filter(version=old, kind=LEAF)}
    note = f"re-planned after step {node.key} failed in version {old.number}: {why}"[:1000]
    try:
        replanned = _redecompose(case, old_plan, failed, old_rows, excluded, note)
    except NoAlternative as exc:
        return _refuse(node, case, why, str(exc))
    plan = replanned.plan
    inside = {leaf.key for leaf in replanned.subtree.iter_leaves()}
    changed = [
        key
        for key, row in old_rows.items()
        if key not in inside and row.status in KEPT_STATUSES and not _has_kept(key, plan, old_rows)
    ]
    if changed:
        return _refuse(
            node, case, why, f"the re-plan would change steps that ended: {', '.join(changed)}"
        )
    _store(node, case, why, old, old_plan, replanned, old_rows)
    return True


def _has_kept(key: str, plan: DagPlan, old_rows: Mapping[str, PlanNode]) -> bool:
    try:
        leaf = plan.leaf(key)
    except KeyError:
        return False
    return _kept(leaf, plan, old_rows)


def _store(
    node: PlanNode,
    case: Case,
    why: str,
    old: PlanVersion,
    old_plan: DagPlan,
    replanned: Replanned,
    old_rows: Mapping[str, PlanNode],
) -> PlanVersion:
    chain = case_chain(case.pk)
    plan = replanned.plan
    # Outside the subtree every ended step stays as it ended; inside it only what succeeded.
    outside = {leaf.key for leaf in old_plan.leaves} - _keys(replanned.subtree)
    kept = {
        leaf.key: old_rows[leaf.key]
        for leaf in plan.leaves
        if _kept(
            leaf,
            plan,
            old_rows,
            KEPT_STATUSES if leaf.key in outside else (NodeStatus.SUCCEEDED,),
        )
    }
    # Nothing new starts on the old version: the failed step fails, its open steps are cancelled.
    fail_and_block(node, why=why, actor=None)
    # Named in the re-plan's event too (S8): each also gets its own cancel event.
    cancelled = list(
        PlanNode.objects.filter(version=old, kind=PlanNode.Kind.LEAF)
        .filter(status__in=WAITING_LEAF_STATUSES)
        .values_list("key", flat=True)
    )
    cancel_open_leaves(
        old.pk, case_id=case.pk, why=f"the plan was re-planned after {node.key} failed"
    )
    diff = diff_plans(old_plan, plan)
    edit = {
        "kind": REPLAN,
        "node": node.key,
        "subtree": replanned.subtree.key,
        "task": replanned.subtree.name,
        "method": replanned.method,
        "excluded": sorted(replanned.excluded),
        "why": why,
        "reason_code": REPLAN,
        "reason": f"step {node.key} failed: {why}"[:2000],
        "from_version": old.number,
    }
    version = store_version(case, plan, edited_by=None, edit=edit)
    with audited(chain=chain) as audit:
        before = move_case(
            case, to=CaseStatus.AWAITING_APPROVAL, audit=audit, current_version=version
        )
        audit.add(
            NewEvent(
                "planning.plan.replanned",
                None,
                {
                    "case": case.pk,
                    **edit,
                    "version": version.number,
                    "content_hash": version.content_hash,
                    "kept": sorted(kept),
                    "cancelled": sorted(cancelled),
                    "diff": diff.as_data(),
                },
            ),
            NewEvent(
                "planning.case.awaiting_approval",
                None,
                {
                    "case": case.pk,
                    "version": version.number,
                    "before": {"status": before},
                    "after": {"status": case.status},
                },
            ),
            now=True,
        )
        void_open_gates(old, why=f"replaced by version {version.number} (re-plan)")
        open_gates(version, carried=_approved_gates(old, plan))
        # The re-plan's event names the kept steps.
        carry_results(version, kept, audit=audit)
    return version


def _approved_gates(old: PlanVersion, plan: DagPlan) -> dict[str, Gate]:
    """Return the approved step gates of `old` whose steps are unchanged in `plan`, by key."""
    gates = Gate.objects.filter(
        version=old, kind=GateKind.STEP, status=GateStatus.APPROVED
    ).select_related("node")
    carried: dict[str, Gate] = {}
    for gate in gates:
        key = gate.node.key if gate.node is not None else ""
        try:
            leaf = plan.leaf(key)
        except KeyError:
            continue
        if node_hash(leaf, plan.dependencies[key]) == gate.content_hash:
            carried[key] = gate
    return carried


# The approval of a re-planned version ----------------------------------------------------------


def before_start(version: PlanVersion) -> list[str]:
    """Carry over results that steps of the re-planned version recorded after the re-plan.

    Call when the plan gate of a version descended from a re-plan (the re-planned version, or an
    edit of it) is approved, before execution starts; returns the keys carried. A step whose
    effect happened after the re-plan must not act again.
    """
    origin = replan_origin(version)
    if origin is None:
        return []
    previous = PlanVersion.objects.filter(case_id=version.case_id, number=origin).first()
    if previous is None:
        return []
    done = {
        row.key: row
        for row in PlanNode.objects.filter(version=previous, kind=LEAF, status=NodeStatus.SUCCEEDED)
    }
    carried: dict[str, PlanNode] = {}
    # A step waiting for its own gate is carried too: what succeeded needs no approval any more.
    for row in PlanNode.objects.filter(
        version=version,
        kind=LEAF,
        status__in=(NodeStatus.PENDING, NodeStatus.AWAITING_APPROVAL),
        key__in=list(done),
    ):
        if row.content_hash == done[row.key].content_hash:
            carried[row.key] = done[row.key]
    if carried:
        with audited(chain=case_chain(version.case_id)) as audit:
            carry_results(version, carried, audit=audit)
            audit.add(
                NewEvent(
                    "planning.plan.results_carried",
                    None,
                    {
                        "version": version.number,
                        "from_version": previous.number,
                        "nodes": sorted(carried),
                    },
                )
            )
    return sorted(carried)


__all__ = [
    "NoAlternative",
    "before_start",
    "is_replan",
    "max_replans",
    "replan_failed_leaf",
]
