"""Hybrid (ChatHTN) decomposition: static methods first, the LLM only where none applies.

At every compound the static methods are tried first. Only `NoMethodMatched` hands that one
subtree to the LLM, with a hint naming the methods that were tried; any other error propagates.
Compounds the LLM creates go through the same step, so a known task the model names is planned
by its static method. Sibling compounds are expanded concurrently, as in the LLM strategy.
Provenance: strategy "hybrid", source "static:<method>", a promoted method's own source
("promoted:<name>@v<n>"), or "llm:<call>".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from planning.core.dag import DagPlan
from planning.core.errors import NoMethodMatched
from planning.core.llm.decomposition import LlmDecomposition
from planning.core.llm.expansion import (
    Expansion,
    ExpansionJob,
    LlmBudgets,
    PlanningRun,
    share_leaves,
)
from planning.core.llm.ordering import fill_preconditions, order_pack_actions
from planning.core.llm.records import LlmNotConfigured
from planning.core.llm.repeats import merge_repeated_actions
from planning.core.static import StaticDecomposition, unique_keys
from planning.core.tree import Goal, Leaf, Node, Provenance, StrategyName

__all__ = ["HybridDecomposition"]


def _fallback_hint(error: NoMethodMatched) -> str:
    if error.methods_tried:
        tried = ", ".join(error.methods_tried)
        hint = (
            f"no predefined method applies to {error.task!r} in the current state "
            f"(methods tried: {tried}); plan this part yourself"
        )
    else:
        hint = f"no predefined method exists for {error.task!r}; plan this part yourself"
    return f"{hint} ({error.detail})" if error.detail else hint


class HybridDecomposition:
    """Plan with static methods, asking the LLM only for subtrees no method covers."""

    strategy_name: StrategyName = "hybrid"

    def __init__(self, static: StaticDecomposition, llm: LlmDecomposition | None = None) -> None:
        """Combine a static planner with an LLM planner (None: no provider configured)."""
        self.static = static
        self.llm = llm

    def plan(self, goal: Goal, state: Mapping[str, Any]) -> DagPlan:
        """Decompose `goal` fully and return the plan.

        Raises `LlmNotConfigured` when a subtree needs the LLM and there is none,
        `LlmPlanningError`, `BudgetExceeded`, `PlanInvalid`, and whatever a static method
        raises other than `NoMethodMatched`.
        """
        frozen_state = MappingProxyType(dict(state))
        run = (
            self.llm.new_run()
            if self.llm is not None
            # without a model only static methods run: the LLM's leaf ceiling does not apply
            else PlanningRun(LlmBudgets(max_leaves=100_000), max_concurrency=8)
        )
        root = ExpansionJob(key=goal.name, goal=goal, depth=0)
        tree, warnings = run.execute(root, lambda job: self._expand(run, job, frozen_state))
        # Expansions run concurrently and a method may reuse a subtask: place keys once, at the end;
        # then an action the model planned again in another part is run once
        merged, notes = merge_repeated_actions(unique_keys(tree))
        # and two pack actions (one of them the model's) the pack orders are ordered
        actions = () if self.llm is None else tuple(self.llm.actions_for(frozen_state).values())
        filled, added = fill_preconditions(merged, actions, frozen_state)
        ordered, more = order_pack_actions(filled, actions)
        return DagPlan.build(ordered, warnings=warnings + notes + added + more, llm_calls=run.calls)

    def _expand(self, run: PlanningRun, job: ExpansionJob, state: Mapping[str, Any]) -> Expansion:
        run.check_cancelled()
        if job.preset:
            return self._from_static(run, job, job.preset_source, job.preset)
        try:
            method, children = self.static.expand_with_method(job.goal.name, state, job.depth + 1)
        except NoMethodMatched as exc:
            if self.llm is None:
                tried = ", ".join(exc.methods_tried) or "none"
                raise LlmNotConfigured(
                    lead=f"No method of the domain pack plans {exc.task!r} for this case "
                    f"(tried: {tried}), and without an LLM provider hybrid planning cannot "
                    "plan the rest."
                ) from exc
            llm_job = replace(job, hint=_fallback_hint(exc))
            return self.llm.expand(run, llm_job, state, strategy=self.strategy_name)
        return self._from_static(run, job, method.source or f"static:{method.name}", children)

    def _from_static(
        self,
        run: PlanningRun,
        job: ExpansionJob,
        source: str,
        children: tuple[Node, ...],
    ) -> Expansion:
        provenance = Provenance(strategy=self.strategy_name, source=source, depth=job.depth + 1)
        siblings = {child.key for child in children}

        def rekey(key: str) -> str:
            # inside a subtree the model created, a method's fixed keys could repeat elsewhere
            return f"{job.key}.{key}" if job.namespaced else key

        def redepend(deps: tuple[str, ...] | None) -> tuple[str, ...] | None:
            if deps is None:
                return None
            return tuple(rekey(d) if d in siblings else d for d in deps)

        labels = {
            child.key: child.task if isinstance(child, Leaf) else child.name for child in children
        }
        out: list[Node | ExpansionJob] = []
        for child in children:
            if isinstance(child, Leaf):
                out.append(
                    replace(
                        child,
                        key=rekey(child.key),
                        depends_on=redepend(child.depends_on),
                        provenance=provenance,
                    )
                )
                continue
            goal = Goal(
                name=child.name,
                description=child.description,
                parent=job.goal.name,
                siblings=tuple(label for key, label in labels.items() if key != child.key),
            )
            out.append(
                ExpansionJob(
                    key=rekey(child.key),
                    goal=goal,
                    depth=job.depth + 1,
                    level=job.level,
                    depends_on=redepend(child.depends_on),
                    namespaced=job.namespaced,
                    # a method may hand back a ready-made compound: keep its children
                    preset=child.children,
                    preset_source=source,
                )
            )
        run.add_leaves(sum(1 for child in out if isinstance(child, Leaf)))
        budget = run.budgets.max_leaves if job.max_leaves is None else job.max_leaves
        return Expansion(
            strategy=self.strategy_name, source=source, children=share_leaves(budget, out)
        )
