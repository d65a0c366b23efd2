"""Plan versions: a `DagPlan` to plan-version rows, and rows back to the same `DagPlan`.

A version's `content_hash` is the hash of the `DagPlan` it was stored from, and `load_plan`
rebuilds that plan exactly, so `content_hash(load_plan(v)) == v.content_hash`: edits, readiness
and approval binding all start from the rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping

from django.contrib.auth.models import User

from planning.core.dag import DagPlan
from planning.core.serialize import content_hash, node_hash
from planning.core.tree import Compound, Leaf, Node, Provenance, thaw
from planning.models import Case, NodeStatus, PlanNode, PlanVersion


class VersionCorrupt(Exception):
    """The rows of a plan version do not rebuild the plan they were stored from."""


def with_tool_risks(plan: DagPlan, risks: Mapping[str, str]) -> DagPlan:
    """Return the plan with each tool leaf's risk filled in from its tool's risk class.

    A risk the plan already names (an explicit mark in a pack) is kept. The risk becomes part of
    the content hash, so an approval binds to the risk the reviewer saw.
    """

    def resolve(node: Node) -> Node:
        if isinstance(node, Leaf):
            if node.risk or not node.tool or node.tool not in risks:
                return node
            return dataclasses.replace(node, risk=risks[node.tool])
        return dataclasses.replace(node, children=tuple(resolve(c) for c in node.children))

    root = resolve(plan.root)
    assert isinstance(root, Compound)
    return DagPlan.build(root, warnings=plan.warnings, llm_calls=plan.llm_calls)


def _walk(node: Node, parent: str | None, depth: int) -> Iterator[tuple[Node, str | None, int]]:
    yield node, parent, depth
    if isinstance(node, Compound):
        for child in node.children:
            yield from _walk(child, node.key, depth + 1)


def _provenance(node: Node) -> dict[str, object]:
    return {
        "strategy": node.provenance.strategy,
        "source": node.provenance.source,
        "depth": node.provenance.depth,
    }


def _row(version: PlanVersion, node: Node, position: int, depth: int, plan: DagPlan) -> PlanNode:
    declared = None if node.depends_on is None else list(node.depends_on)
    common = {
        "version": version,
        "key": node.key,
        "position": position,
        "depth": depth,
        "declared_depends_on": declared,
        "provenance": _provenance(node),
        "status": NodeStatus.PENDING,
    }
    if isinstance(node, Leaf):
        deps = sorted(plan.dependencies[node.key])
        return PlanNode(
            kind=PlanNode.Kind.LEAF,
            content_hash=node_hash(node, deps),
            name=node.task,
            agent=node.agent,
            task=node.task,
            rationale=node.rationale,
            tool=node.tool or "",
            inputs=thaw(node.inputs),
            depends_on=deps,
            expected_output=node.expected_output or "",
            failure_policy=node.failure_policy,
            risk=node.risk or "",
            **common,
        )
    return PlanNode(
        kind=PlanNode.Kind.COMPOUND, name=node.name, description=node.description, **common
    )


def store_version(
    case: Case,
    plan: DagPlan,
    *,
    edited_by: User | None = None,
    edit: dict[str, object] | None = None,
) -> PlanVersion:
    """Write `plan` as the case's next version with one row per node; return the version.

    `edited_by` and `edit` name who made the version by editing the previous one, and how.

    Call inside the transaction that changes the case; the rows are inserted level by level so
    every parent has its primary key before its children.
    """
    number = (case.versions.order_by("-number").values_list("number", flat=True).first() or 0) + 1
    version = PlanVersion.objects.create(
        case=case,
        number=number,
        strategy=case.strategy,
        content_hash=content_hash(plan),
        warnings=list(plan.warnings),
        llm_calls=plan.llm_calls,
        leaf_count=len(plan.leaves),
        critical_path=len(plan.critical_path()),
        width=plan.width(),
        edited_by=edited_by,
        edit=edit,
    )
    by_depth: dict[int, list[tuple[PlanNode, str | None]]] = {}
    for position, (node, parent, depth) in enumerate(_walk(plan.root, None, 0)):
        by_depth.setdefault(depth, []).append((_row(version, node, position, depth, plan), parent))
    saved: dict[str, PlanNode] = {}
    for depth in sorted(by_depth):
        level = by_depth[depth]
        for row, parent in level:
            row.parent = saved[parent] if parent is not None else None
        for row in PlanNode.objects.bulk_create([row for row, _ in level], batch_size=500):
            saved[row.key] = row
    return version


def _deps(value: list[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


def _node(row: PlanNode, children: tuple[Node, ...]) -> Node:
    provenance = Provenance(**row.provenance)
    if row.kind == PlanNode.Kind.LEAF:
        return Leaf(
            key=row.key,
            agent=row.agent,
            task=row.task,
            rationale=row.rationale,
            tool=row.tool or None,
            inputs=row.inputs,
            depends_on=_deps(row.declared_depends_on),
            expected_output=row.expected_output or None,
            failure_policy=row.failure_policy or "abort",  # type: ignore[arg-type]
            risk=row.risk or None,
            provenance=provenance,
        )
    return Compound(
        key=row.key,
        name=row.name,
        description=row.description,
        children=children,
        depends_on=_deps(row.declared_depends_on),
        provenance=provenance,
    )


def plan_from_rows(
    rows: Iterable[PlanNode], *, warnings: Iterable[str] = (), llm_calls: int = 0
) -> DagPlan:
    """Rebuild a `DagPlan` from the node rows of one version (any order).

    Raises VersionCorrupt when the rows have no single root or a row's parent is missing.
    """
    rows = sorted(rows, key=lambda r: r.position)
    children: dict[int | None, list[PlanNode]] = {}
    for row in rows:
        children.setdefault(row.parent_id, []).append(row)
    roots = children.get(None, [])
    if len(roots) != 1:
        raise VersionCorrupt(f"a plan version needs exactly one root node, found {len(roots)}")

    def build(row: PlanNode) -> Node:
        return _node(row, tuple(build(child) for child in children.get(row.pk, ())))

    root = build(roots[0])
    if not isinstance(root, Compound):
        raise VersionCorrupt("the root of a plan version must be a compound task")
    built = sum(1 for _ in root.walk())
    if built != len(rows):
        raise VersionCorrupt(f"{len(rows) - built} node row(s) are not reachable from the root")
    return DagPlan.build(root, warnings=tuple(warnings), llm_calls=llm_calls)


def load_plan(version: PlanVersion) -> DagPlan:
    """Return the `DagPlan` a version was stored from (two queries at most).

    Raises VersionCorrupt when the rows no longer hash to the version's content hash.
    """
    plan = plan_from_rows(
        PlanNode.objects.filter(version=version),
        warnings=version.warnings,
        llm_calls=version.llm_calls,
    )
    if content_hash(plan) != version.content_hash:
        raise VersionCorrupt(
            f"plan version {version.number} of case {version.case_id} does not match its "
            "content hash"
        )
    return plan


__all__ = [
    "CARRIED_FIELDS",
    "KEPT_STATUSES",
    "REPLAN",
    "VersionCorrupt",
    "descends_from_replan",
    "is_replan",
    "kept_steps",
    "load_plan",
    "plan_from_rows",
    "replan_origin",
    "store_version",
    "with_tool_risks",
]


# The `edit` kind of a version made by re-planning a failed step (execution.replanning).
REPLAN = "replan"
# Statuses a step keeps in a new version (a re-plan's, an edit's) when its content is unchanged:
# it ended already, and nothing that ended runs again.
KEPT_STATUSES = (NodeStatus.SUCCEEDED, NodeStatus.FAILED, NodeStatus.SKIPPED)
# What a kept step takes over from the earlier version's row.
CARRIED_FIELDS = (
    "status",
    "attempts",
    "started_at",
    "finished_at",
    "output",
    "error",
    "error_class",
    "finished_after_cancel",
    "routing",
)


def is_replan(version: PlanVersion) -> bool:
    """Tell whether the version was made by re-planning a failed step."""
    return isinstance(version.edit, dict) and version.edit.get("kind") == REPLAN


def replan_origin(version: PlanVersion) -> int | None:
    """Return the number of the version whose re-plan `version` descends from, or None.

    A re-planned version descends from the version it re-planned; an edited one from whatever the
    version it was edited from descends from (the edits are followed back to the nearest
    re-plan). Steps of that version may still run, or have ended after the re-plan.
    """
    edits = dict(PlanVersion.objects.filter(case_id=version.case_id).values_list("number", "edit"))
    number, edit = version.number, version.edit
    while isinstance(edit, dict):
        origin = edit.get("from_version")
        if edit.get("kind") == REPLAN:
            return origin if isinstance(origin, int) else number - 1
        if not isinstance(origin, int) or origin >= number:
            return None
        number, edit = origin, edits.get(origin)
    return None


def descends_from_replan(version: PlanVersion) -> bool:
    """Tell whether the version was re-planned, or edited from one that descends from a re-plan."""
    return replan_origin(version) is not None


def kept_steps(old: PlanVersion, plan: DagPlan) -> dict[str, PlanNode]:
    """Return the steps of `old` that ended and that `plan` holds unchanged, by key.

    Unchanged is the same key and the same content hash (its dependencies included): such a step
    keeps its status and output in the version stored from `plan`; a changed one is a new step.
    """
    steps = {leaf.key: leaf for leaf in plan.leaves}
    return {
        row.key: row
        for row in PlanNode.objects.filter(
            version=old, kind=PlanNode.Kind.LEAF, status__in=KEPT_STATUSES, key__in=list(steps)
        )
        if row.content_hash == node_hash(steps[row.key], sorted(plan.dependencies[row.key]))
    }
