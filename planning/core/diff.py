"""The difference between two plans: nodes added and removed, fields changed, dependencies moved.

Pure Python: the diff of an edit (RELIABILITY R9) is computed from the two `DagPlan`s, whatever
stored them. Values are plain JSON data (lists, dicts), ready for an API answer or a page.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from planning.core.dag import DagPlan
from planning.core.tree import Compound, Leaf, Node, thaw

# The fields compared, in the order a diff lists them. A leaf has the first ones, a compound
# `name`, `description` and `depends_on`; a field a node's kind does not have is left out.
LEAF_FIELDS: tuple[str, ...] = (
    "agent",
    "task",
    "rationale",
    "tool",
    "inputs",
    "depends_on",
    "expected_output",
    "failure_policy",
    "risk",
)
COMPOUND_FIELDS: tuple[str, ...] = ("name", "description", "depends_on")
DIFF_FIELDS: tuple[str, ...] = (*LEAF_FIELDS, "name", "description")


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldChange:
    """One field of one node: its value in the old plan and in the new one."""

    field: str
    before: Any
    after: Any

    def as_data(self) -> dict[str, Any]:
        """Return the change as JSON-ready data."""
        return {"field": self.field, "before": self.before, "after": self.after}


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeChange:
    """The fields of one node present in both plans that differ between them."""

    key: str
    fields: tuple[FieldChange, ...]

    def as_data(self) -> dict[str, Any]:
        """Return the node's changes as JSON-ready data."""
        return {"node": self.key, "fields": [change.as_data() for change in self.fields]}


@dataclass(frozen=True, slots=True, kw_only=True)
class DependencyChange:
    """A leaf in both plans whose resolved dependencies (the leaves it waits for) differ."""

    key: str
    before: tuple[str, ...]
    after: tuple[str, ...]

    @property
    def gained(self) -> tuple[str, ...]:
        """Return the leaves it now waits for and did not before."""
        return tuple(k for k in self.after if k not in self.before)

    @property
    def lost(self) -> tuple[str, ...]:
        """Return the leaves it waited for and no longer does."""
        return tuple(k for k in self.before if k not in self.after)

    def as_data(self) -> dict[str, Any]:
        """Return the change as JSON-ready data."""
        return {
            "node": self.key,
            "before": list(self.before),
            "after": list(self.after),
            "gained": list(self.gained),
            "lost": list(self.lost),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanDiff:
    """What changed from one plan to another; empty when they do the same thing."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[NodeChange, ...] = ()
    dependencies: tuple[DependencyChange, ...] = ()

    @property
    def is_empty(self) -> bool:
        """Tell whether the two plans have the same nodes, fields and dependencies."""
        return not (self.added or self.removed or self.changed or self.dependencies)

    @property
    def touched(self) -> frozenset[str]:
        """Return the keys of every node the diff names."""
        return frozenset((*self.added, *self.removed, *(c.key for c in self.changed))) | {
            d.key for d in self.dependencies
        }

    def as_data(self) -> dict[str, Any]:
        """Return the diff as JSON-ready data (the API's and the audit trail's form)."""
        return {
            "added": list(self.added),
            "removed": list(self.removed),
            "changed": [change.as_data() for change in self.changed],
            "dependencies": [change.as_data() for change in self.dependencies],
        }


def _value(node: Node, name: str) -> Any:
    value = getattr(node, name)
    if name == "inputs":
        return thaw(value)
    if name == "depends_on":
        return None if value is None else list(value)
    return value


def _fields(node: Node) -> tuple[str, ...]:
    return LEAF_FIELDS if isinstance(node, Leaf) else COMPOUND_FIELDS


def _kind(node: Node) -> str:
    return "leaf" if isinstance(node, Leaf) else "compound"


def _node_change(old: Node, new: Node) -> NodeChange | None:
    changes: list[FieldChange] = []
    if _kind(old) != _kind(new):
        changes.append(FieldChange(field="kind", before=_kind(old), after=_kind(new)))
    old_fields, new_fields = _fields(old), _fields(new)
    for name in DIFF_FIELDS:
        before = _value(old, name) if name in old_fields else None
        after = _value(new, name) if name in new_fields else None
        if (name in old_fields or name in new_fields) and before != after:
            changes.append(FieldChange(field=name, before=before, after=after))
    return NodeChange(key=new.key, fields=tuple(changes)) if changes else None


def _ordered_deps(plan: DagPlan, key: str, order: Mapping[str, int]) -> tuple[str, ...]:
    return tuple(sorted(plan.dependencies[key], key=lambda k: (order.get(k, len(order)), k)))


def diff_plans(old: DagPlan, new: DagPlan) -> PlanDiff:
    """Return what changed from `old` to `new`, listed in tree order.

    Added nodes follow the new plan's order, removed ones the old plan's; a node in both is
    changed when one of its fields differs (`inputs` compared as data, `depends_on` as declared),
    and a leaf in both has a dependency change when the leaves it waits for differ.
    """
    old_nodes = {node.key: node for node in old.nodes()}
    new_nodes = {node.key: node for node in new.nodes()}
    added = tuple(key for key in new_nodes if key not in old_nodes)
    removed = tuple(key for key in old_nodes if key not in new_nodes)
    changed = tuple(
        change
        for key, node in new_nodes.items()
        if key in old_nodes and (change := _node_change(old_nodes[key], node)) is not None
    )
    order = {key: i for i, key in enumerate((*new_nodes, *removed))}
    dependencies: list[DependencyChange] = []
    for key, node in new_nodes.items():
        if not isinstance(node, Leaf) or not isinstance(old_nodes.get(key), Leaf):
            continue
        before, after = _ordered_deps(old, key, order), _ordered_deps(new, key, order)
        if set(before) != set(after):
            dependencies.append(DependencyChange(key=key, before=before, after=after))
    return PlanDiff(added=added, removed=removed, changed=changed, dependencies=tuple(dependencies))


def node_data(node: Node) -> dict[str, Any]:
    """Return the compared fields of one node (without children) as JSON-ready data."""
    data: dict[str, Any] = {"key": node.key, "kind": _kind(node)}
    data.update((name, _value(node, name)) for name in _fields(node))
    if isinstance(node, Compound):
        data["children"] = [child.key for child in node.children]
    return data


__all__ = [
    "COMPOUND_FIELDS",
    "DIFF_FIELDS",
    "LEAF_FIELDS",
    "DependencyChange",
    "FieldChange",
    "NodeChange",
    "PlanDiff",
    "diff_plans",
    "node_data",
]
