"""Hand-made plans for the scorer's tests: a flat plan from (key, agent, tool, task, deps)."""

from __future__ import annotations

from planning.core.dag import DagPlan
from planning.core.tree import Compound, Leaf, Provenance

type Row = tuple[str, str, str | None, str, tuple[str, ...]]

_PROVENANCE = Provenance(strategy="llm", source="test", depth=1)


def flat_plan(*rows: Row) -> DagPlan:
    """Return a one-level plan of the rows' leaves (deps explicit: () is independent)."""
    leaves = tuple(
        Leaf(key=key, agent=agent, tool=tool, task=task, depends_on=deps, provenance=_PROVENANCE)
        for key, agent, tool, task, deps in rows
    )
    root = Compound(
        key="root",
        name="root",
        children=leaves,
        provenance=Provenance(strategy="llm", source="test", depth=0),
    )
    return DagPlan.build(root)
