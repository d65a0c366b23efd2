"""Plain-data form of plan trees (for JSON fields and plan versions) and their content hash."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from planning.core.dag import DagPlan
from planning.core.tree import Compound, Leaf, Node, Provenance, thaw


def node_to_data(node: Node) -> dict[str, Any]:
    """Return a JSON-ready dict for `node` and its descendants."""
    provenance = {
        "strategy": node.provenance.strategy,
        "source": node.provenance.source,
        "depth": node.provenance.depth,
    }
    depends_on = None if node.depends_on is None else list(node.depends_on)
    if isinstance(node, Leaf):
        return {
            "kind": "leaf",
            "key": node.key,
            "agent": node.agent,
            "task": node.task,
            "rationale": node.rationale,
            "tool": node.tool,
            "inputs": thaw(node.inputs),
            "depends_on": depends_on,
            "expected_output": node.expected_output,
            "failure_policy": node.failure_policy,
            "risk": node.risk,
            "provenance": provenance,
        }
    return {
        "kind": "compound",
        "key": node.key,
        "name": node.name,
        "description": node.description,
        "depends_on": depends_on,
        "provenance": provenance,
        "children": [node_to_data(child) for child in node.children],
    }


def node_from_data(data: Mapping[str, Any]) -> Node:
    """Rebuild a node from `node_to_data` output; raise `KeyError`/`ValueError` when malformed."""
    provenance = Provenance(**data["provenance"])
    depends_on = data.get("depends_on")
    deps = None if depends_on is None else tuple(depends_on)
    if data["kind"] == "leaf":
        return Leaf(
            key=data["key"],
            agent=data["agent"],
            task=data["task"],
            rationale=data.get("rationale", ""),
            tool=data.get("tool"),
            inputs=data.get("inputs") or {},
            depends_on=deps,
            expected_output=data.get("expected_output"),
            failure_policy=data.get("failure_policy", "abort"),
            risk=data.get("risk"),
            provenance=provenance,
        )
    if data["kind"] != "compound":
        raise ValueError(f"unknown node kind {data['kind']!r}")
    return Compound(
        key=data["key"],
        name=data["name"],
        description=data.get("description", ""),
        depends_on=deps,
        provenance=provenance,
        children=tuple(node_from_data(child) for child in data.get("children", ())),
    )


def canonical_json(data: Any) -> str:
    """Return the canonical JSON text of `data` (sorted keys, no whitespace)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def content_hash(plan: DagPlan) -> str:
    """Return the SHA-256 of the canonical JSON of the plan's tree."""
    return hashlib.sha256(canonical_json(node_to_data(plan.root)).encode()).hexdigest()


def node_hash(leaf: Leaf, depends_on: Iterable[str]) -> str:
    """Return the SHA-256 of what one leaf does: its fields and its resolved dependencies.

    Provenance is left out (an edit changes where a step came from, not what it does); the
    resolved dependencies are in, so moving a step in the DAG changes its hash. Approvals bind to
    this hash (RELIABILITY R3).
    """
    data = node_to_data(leaf)
    data.pop("provenance")
    data["resolved_depends_on"] = sorted(depends_on)
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()
