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

from collections.abc import Sequence

from planning.core.dag import DagPlan
from planning.core.errors import PlanInvalid
from planning.core.goal import Capability
from planning.core.llm.repeats import add_dependencies
from planning.core.tree import Compound, Leaf

__all__ = ["order_pack_actions"]


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
    if not actions:
        return root, ()
    try:
        plan = DagPlan.build(root)
    except PlanInvalid:
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
