"""Order two pack actions the way the pack does when the model left the order out.

A domain pack declares each of its actions with the facts it needs and the facts it produces
(`Capability.inputs` and `.outputs`: the legal review produces the reviewed findings a freeze
needs; a fail-over restores the service whose connectivity is then verified). The model often
plans both actions of such a pair but makes them independent, and a plan that freezes an
account beside its legal review is not one to approve. So when one action's output facts are
another's input facts and both are in the plan, the consumer waits for the producer, with a
warning. Only pairs with at least one model-planned leaf are touched (a static method's order
is its author's); a pair the plan already runs the other way round is left as it is, with a
warning, since adding the edge would make a cycle.

A leaf is an action's when it carries the action's agent, tool and task: the leaf an
LLM-planned step naming the action becomes, or a static method's leaf written from the same
step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from planning.core.dag import DagPlan
from planning.core.errors import PlanInvalid
from planning.core.goal import Capability, available_facts
from planning.core.llm.repeats import add_dependencies
from planning.core.refs import REF_KEY, is_ref
from planning.core.tree import Compound, Leaf, Node, thaw

__all__ = ["fill_preconditions", "order_pack_actions"]


def _action_of(leaf: Leaf, actions: Sequence[Capability]) -> Capability | None:
    for action in actions:
        if (leaf.agent, leaf.tool, leaf.task) == (action.agent, action.tool, action.task):
            return action
    return None


def _is_model_planned(leaf: Leaf) -> bool:
    return leaf.provenance.source.startswith("llm:")


def order_pack_actions(
    root: Compound, actions: Sequence[Capability]
) -> tuple[Compound, tuple[str, ...]]:
    """Return the tree with each consumer action waiting for its producers, and a warning each.

    A tree that is not a valid plan is returned unchanged (its validation reports it).
    """
    plan = _plan_of(root, actions)
    if plan is None:
        return root, ()
    placed = [
        (leaf, action) for leaf in plan.leaves if (action := _action_of(leaf, actions)) is not None
    ]
    warnings: list[str] = []
    for consumer, needs in placed:
        producers = [
            (leaf, action)
            for leaf, action in placed
            if leaf.key != consumer.key
            and action.outputs & needs.inputs
            and (_is_model_planned(leaf) or _is_model_planned(consumer))
        ]
        for producer, makes in producers:
            facts = ", ".join(sorted(makes.outputs & needs.inputs))
            if producer.key in plan.upstream(consumer.key):
                continue
            if consumer.key in plan.upstream(producer.key):
                warnings.append(
                    f"step {consumer.key!r} ({consumer.task!r}) needs {facts}, which step "
                    f"{producer.key!r} ({producer.task!r}) produces, but the plan runs it "
                    f"before {producer.key!r}: check the order"
                )
                continue
            try:
                trial = add_dependencies(root, consumer.key, (producer.key,))
                trial_plan = DagPlan.build(trial)
            except PlanInvalid:
                continue
            root, plan = trial, trial_plan
            warnings.append(
                f"step {consumer.key!r} ({consumer.task!r}) needs {facts}, which step "
                f"{producer.key!r} ({producer.task!r}) produces: it now waits for "
                f"{producer.key!r}, as the domain pack orders them"
            )
    return root, tuple(warnings)


def _leaf_for(
    action: Capability, key: str, keys: Mapping[str, str], deps: tuple[str, ...], source: Leaf
) -> Leaf | None:
    """Return the leaf of a pulled-in `action` (None when an output it uses has no leaf)."""
    inputs: dict[str, Any] = {}
    for name, value in thaw(action.tool_inputs).items():
        if is_ref(value):
            if value[REF_KEY] not in keys:
                return None
            value = {**value, REF_KEY: keys[value[REF_KEY]]}
        inputs[name] = value
    return Leaf(
        key=key,
        agent=action.agent,
        task=action.task,
        rationale=action.rationale,
        tool=action.tool,
        inputs=inputs,
        depends_on=deps,
        expected_output=action.expected_output,
        failure_policy=action.failure_policy,
        risk=action.risk,
        provenance=source.provenance,
    )


def _insert_before(root: Compound, key: str, leaves: Sequence[Leaf]) -> Compound:
    def visit(node: Compound) -> Compound:
        children: list[Node] = []
        for child in node.children:
            if isinstance(child, Compound):
                child = visit(child)
            elif child.key == key:
                children.extend(leaves)
            children.append(child)
        return replace(node, children=tuple(children))

    return visit(root)


def _safe_producers(
    missing: Sequence[str], actions: Sequence[Capability], produced: set[str], consumer: str
) -> list[Capability]:
    """Return the actions that provide `missing`, each after its own needs; update `produced`.

    For each fact the cheapest action that produces it and carries no risk mark (the first
    offered on a tie), its own needs first; a fact without one stays missing.
    """
    chosen: list[Capability] = []

    def provide(fact: str, chain: frozenset[str]) -> None:
        if fact in produced:
            return
        candidates = [
            a for a in actions if fact in a.outputs and a.risk is None and a.name not in chain
        ]
        if not candidates:
            return
        best = min(candidates, key=lambda a: a.cost)
        for need in sorted(best.inputs):
            provide(need, chain | {best.name})
        if best.inputs <= produced:
            chosen.append(best)
            produced.update(best.outputs)

    for fact in missing:
        provide(fact, frozenset({consumer}))
    return chosen


def fill_preconditions(
    root: Compound, actions: Sequence[Capability], state: Mapping[str, Any]
) -> tuple[Compound, tuple[str, ...]]:
    """Return the tree with the facts its model-planned consequential actions need provided.

    Each with a warning. A consequential action is one the pack marks with a risk (a freeze, a
    payment hold, a fail-over). A fact it needs that neither the case's state nor any action in
    the plan provides is
    provided by the pack's cheapest action that produces it and carries no risk mark (its own
    needs first, recursively): the server never adds a consequential step (a financial or
    destructive one) on its own; such a fact stays unprovided. The added leaves go just before
    the action, which waits for them. A tree that is not a valid plan is returned unchanged.
    """
    plan = _plan_of(root, actions)
    if plan is None:
        return root, ()
    by_key = {leaf.key: leaf for leaf in plan.leaves}
    placed = {
        leaf.key: action
        for leaf in plan.leaves
        if (action := _action_of(leaf, actions)) is not None
    }
    keys = {action.name: key for key, action in placed.items()}  # action -> its leaf's key
    produced = set(available_facts(state)).union(*(a.outputs for a in placed.values()))
    taken = {node.key for node in plan.nodes()}
    warnings: list[str] = []
    for consumer_key in plan.topological_order():
        needs = placed.get(consumer_key)
        consumer = by_key[consumer_key]
        # only a consequential action is held to everything the pack says comes before it: a
        # read or a write that lacks an input does less, and filling in every fact a step
        # could use would make every plan the pack's largest
        if needs is None or needs.risk is None or not _is_model_planned(consumer):
            continue
        missing = sorted(needs.inputs - produced)
        if not missing:
            continue
        provided = set(produced)
        chosen = _safe_producers(missing, actions, provided, needs.name)
        added: list[tuple[Leaf, Capability]] = []
        trial_keys = dict(keys)
        for action in chosen:
            key = action.name if action.name not in taken else f"{consumer_key}.{action.name}"
            deps = tuple(
                dict.fromkeys(
                    trial_keys[a.name]
                    for a in (*placed.values(), *chosen)
                    if a.name in trial_keys and a.outputs & action.inputs
                )
            )
            leaf = _leaf_for(action, key, trial_keys, deps, consumer)
            if leaf is None:
                break
            trial_keys[action.name] = key
            added.append((leaf, action))
        if not added or len(added) < len(chosen):
            continue
        direct = tuple(leaf.key for leaf, action in added if action.outputs & needs.inputs)
        leaves = [leaf for leaf, _ in added]
        try:
            trial = add_dependencies(root, consumer_key, direct)
            trial = _insert_before(trial, consumer_key, leaves)
            DagPlan.build(trial)
        except PlanInvalid:
            continue
        root, keys, produced = trial, trial_keys, provided
        taken.update(leaf.key for leaf in leaves)
        placed.update((leaf.key, action) for leaf, action in added)
        facts = ", ".join(f for f in missing if f in produced)
        warnings.append(
            f"step {consumer_key!r} ({consumer.task!r}) needs {facts}, which nothing in the plan "
            f"provided: added {', '.join(repr(leaf.key) for leaf in leaves)} before it, the "
            "domain pack's cheapest way to it that places no consequential step"
        )
    return root, tuple(warnings)


def _plan_of(root: Compound, actions: Sequence[Any]) -> DagPlan | None:
    """Return the tree's plan, or None when there are no actions or it is not a valid plan."""
    if not actions:
        return None
    try:
        return DagPlan.build(root)
    except PlanInvalid:
        return None
