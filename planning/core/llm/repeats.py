"""Run a pack action once per plan: merge the repeats the model planned in other parts.

The model decomposes each subtask on its own, so two sibling subtasks often both plan the same
pack action (the invoice's field extraction before each check), and one plan ends with the same
tool called on the same inputs two or three times. Within one answer a repeat is already planned
once (`LlmDecomposition._to_expansion`); this merges the repeats across the whole tree.

Two leaves are the same action when they have the same agent, the same tool and the same inputs
(references to upstream outputs compared after the merges already made), and at least one of
them was planned by the model (its provenance source is an ``llm:`` call): a static method that
runs a tool twice means it. The leaf that comes first in dependency order is kept; the repeat is
removed, with a warning, and everything that waited for it waits for the kept leaf, and for what
the repeat itself waited for, so no order the plan had is lost. A part left without any leaf is
removed as well. A merge that would make the plan invalid is not made (the repeat stays).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from planning.core.dag import DagPlan
from planning.core.errors import PlanInvalid
from planning.core.refs import REF_KEY, is_ref
from planning.core.tree import Compound, Leaf, Node, thaw

__all__ = ["add_dependencies", "merge_repeated_actions"]


def _is_model_planned(leaf: Leaf) -> bool:
    return leaf.provenance.source.startswith("llm:")


def _renamed(inputs: Mapping[str, Any], merged: Mapping[str, str]) -> dict[str, Any]:
    """Return plain `inputs` with references to merged repeats pointing at the kept leaf."""
    out: dict[str, Any] = {}
    for name, value in thaw(inputs).items():
        if is_ref(value) and value[REF_KEY] in merged:
            value = {**value, REF_KEY: merged[value[REF_KEY]]}
        out[name] = value
    return out


def _signature(leaf: Leaf, merged: Mapping[str, str]) -> str:
    inputs = _renamed(leaf.inputs, merged)
    return json.dumps([leaf.agent, leaf.tool, inputs], sort_keys=True, default=str)


def _without(root: Compound, repeat: str, kept: str) -> Compound:
    """Return the tree without leaf `repeat` (and the parts it leaves empty), pointing at `kept`.

    A dependency on the repeat, or on a part removed with it, becomes a dependency on `kept`;
    an input reference to the repeat refers to `kept`.
    """
    gone: set[str] = set()

    def prune(node: Compound) -> Compound:
        children: list[Node] = []
        for child in node.children:
            if isinstance(child, Leaf):
                if child.key == repeat:
                    gone.add(child.key)
                    continue
                children.append(child)
                continue
            pruned = prune(child)
            if pruned.children:
                children.append(pruned)
            else:
                gone.add(child.key)
        return replace(node, children=tuple(children))

    def rewrite(deps: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if deps is None or not gone.intersection(deps):
            return deps
        return tuple(dict.fromkeys(kept if dep in gone else dep for dep in deps))

    def point(node: Node) -> Node:
        if isinstance(node, Leaf):
            inputs = node.inputs
            if any(is_ref(v) and v[REF_KEY] == repeat for v in inputs.values()):
                inputs = _renamed(inputs, {repeat: kept})
            return replace(node, depends_on=rewrite(node.depends_on), inputs=inputs)
        return replace(
            node,
            depends_on=rewrite(node.depends_on),
            children=tuple(point(child) for child in node.children),
        )

    pruned = prune(root)
    result = point(pruned)
    assert isinstance(result, Compound)
    return result


def add_dependencies(root: Compound, key: str, added: tuple[str, ...]) -> Compound:
    """Return the tree with leaf `key` also waiting for `added` (its implicit order kept)."""

    def visit(node: Compound) -> Compound:
        children: list[Node] = []
        previous: str | None = None
        for child in node.children:
            if isinstance(child, Leaf) and child.key == key:
                own = child.depends_on
                if own is None:
                    own = () if previous is None else (previous,)
                child = replace(child, depends_on=tuple(dict.fromkeys((*own, *added))))
            elif isinstance(child, Compound):
                child = visit(child)
            children.append(child)
            previous = child.key
        return replace(node, children=tuple(children))

    return visit(root)


def _restore_order(
    root: Compound, before: DagPlan, repeat: str, kept: str
) -> tuple[Compound, DagPlan]:
    """Make every leaf wait again for all it waited for before the merge (the repeat: `kept`)."""
    plan = DagPlan.build(root)
    for key in before.topological_order():
        if key == repeat:
            continue
        wanted = {kept if up == repeat else up for up in before.upstream(key)} - {key}
        missing = wanted - plan.upstream(key)
        if not missing:
            continue
        # the latest of the missing leaves are enough: the others are upstream of them
        latest = tuple(
            sorted(
                m
                for m in missing
                if not any(m in before.upstream(other) for other in missing if other != m)
            )
        )
        root = add_dependencies(root, key, latest)
        plan = DagPlan.build(root)
    return root, plan


def merge_repeated_actions(root: Compound) -> tuple[Compound, tuple[str, ...]]:
    """Return the tree with each model-planned repeat of an action merged, and a warning each.

    A tree that is not a valid plan is returned unchanged (its validation reports it).
    """
    try:
        plan = DagPlan.build(root)
    except PlanInvalid:
        return root, ()
    merged: dict[str, str] = {}  # repeat key -> key of the leaf kept
    first: dict[str, Leaf] = {}  # signature -> the first leaf of that action
    warnings: list[str] = []
    for key in plan.topological_order():
        leaf = plan.leaf(key)
        if leaf.tool is None:
            continue
        signature = _signature(leaf, merged)
        kept = first.get(signature)
        if kept is None:
            first[signature] = leaf
            continue
        if not (_is_model_planned(leaf) or _is_model_planned(kept)):
            continue
        try:
            trial = _without(root, key, kept.key)
            trial, trial_plan = _restore_order(trial, plan, key, kept.key)
        except PlanInvalid:
            continue
        merged[key] = kept.key
        root, plan = trial, trial_plan
        parent = plan.parent_of(kept.key)
        where = f" (in {parent.name!r})" if parent is not None and parent is not plan.root else ""
        warnings.append(
            f"step {key!r} ({leaf.task!r}) repeats step {kept.key!r}{where}: the same agent, "
            f"tool {leaf.tool!r} and inputs. The plan runs it once: what waited for {key!r} "
            f"waits for {kept.key!r}"
        )
    return root, tuple(warnings)
