"""Goal-oriented (GOAP) decomposition: A* over facts to the cheapest set of capabilities.

A fact is available when its key is present in the state with a value other than None or
False. Each capability consumes input facts and produces output facts at a cost. The plan's
edges run from the producer of a fact to each capability that consumes it, so independent
capabilities form parallel branches and shared inputs form diamonds. A pack writes each leaf
once, as a static `Step`, and offers it here with `Capability.from_step`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from planning.core.dag import DagPlan
from planning.core.errors import BudgetExceeded, GoalAlreadySatisfied, NoMethodMatched
from planning.core.static import Step
from planning.core.tree import Compound, FailurePolicy, Goal, Leaf, Provenance, freeze

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class Capability:
    """What one agent can do: consume `inputs` facts, produce `outputs` facts, at `cost`."""

    name: str
    agent: str
    task: str
    inputs: frozenset[str] = frozenset()
    outputs: frozenset[str]
    cost: float = 1.0
    rationale: str = ""
    tool: str | None = None
    tool_inputs: Mapping[str, Any] = field(default=_EMPTY)
    expected_output: str | None = None
    failure_policy: FailurePolicy = "abort"
    risk: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", frozenset(self.inputs))
        object.__setattr__(self, "outputs", frozenset(self.outputs))
        object.__setattr__(self, "tool_inputs", freeze(dict(self.tool_inputs)))
        if not self.outputs:
            raise ValueError(f"capability {self.name!r} produces nothing")
        if self.cost < 0:
            raise ValueError(f"capability {self.name!r} has a negative cost")

    @classmethod
    def from_step(
        cls,
        step: Step,
        *,
        inputs: Iterable[str] = (),
        outputs: Iterable[str],
        cost: float = 1.0,
    ) -> Capability:
        """Return the capability that runs `step`'s leaf, from `inputs` facts to `outputs` facts.

        The step's sibling order, reads and effects belong to static and forward planning and
        are left behind. Raises `ValueError` when it produces nothing or costs less than zero.
        """
        return cls(
            name=step.key,
            agent=step.agent,
            task=step.task,
            inputs=frozenset(inputs),
            outputs=frozenset(outputs),
            cost=cost,
            rationale=step.rationale,
            tool=step.tool,
            tool_inputs=step.inputs,
            expected_output=step.expected_output,
            failure_policy=step.failure_policy,
            risk=step.risk,
        )


def available_facts(state: Mapping[str, Any]) -> frozenset[str]:
    """Return the keys of `state` that count as established facts."""
    return frozenset(k for k, v in state.items() if v is not None and v is not False)


class GoalOrientedDecomposition:
    """Search for the cheapest capabilities that turn the state's facts into the goal's."""

    strategy_name = "goal"

    def __init__(
        self,
        capabilities: Iterable[Capability],
        goals: Mapping[str, Iterable[str]],
        *,
        max_expansions: int = 100_000,
    ) -> None:
        self.capabilities = tuple(capabilities)
        names = [c.name for c in self.capabilities]
        if len(names) != len(set(names)):
            raise ValueError("capability names must be unique")
        self.goals: Mapping[str, frozenset[str]] = MappingProxyType(
            {name: frozenset(facts) for name, facts in goals.items()}
        )
        self.max_expansions = max_expansions

    def _relevant(self, wanted: frozenset[str], have: frozenset[str]) -> tuple[Capability, ...]:
        needed = set(wanted - have)
        relevant: dict[str, Capability] = {}
        changed = True
        while changed:
            changed = False
            for cap in self.capabilities:
                if cap.name not in relevant and cap.outputs & needed:
                    relevant[cap.name] = cap
                    needed |= cap.inputs - have
                    changed = True
        return tuple(c for c in self.capabilities if c.name in relevant)

    def _search(
        self, goal: str, wanted: frozenset[str], start: frozenset[str]
    ) -> tuple[Capability, ...]:
        caps = self._relevant(wanted, start)
        cheapest: dict[str, float] = {}
        for cap in caps:
            for fact in cap.outputs:
                cheapest[fact] = min(cheapest.get(fact, cap.cost), cap.cost)

        def heuristic(facts: frozenset[str]) -> float:
            return max((cheapest.get(f, 0.0) for f in wanted - facts), default=0.0)

        counter = itertools.count()
        frontier: list[tuple[float, float, int, frozenset[str]]] = [
            (heuristic(start), 0.0, next(counter), start)
        ]
        best: dict[frozenset[str], float] = {start: 0.0}
        came_from: dict[frozenset[str], tuple[frozenset[str], Capability]] = {}
        expansions = 0
        while frontier:
            _, cost, _, facts = heapq.heappop(frontier)
            if cost > best.get(facts, float("inf")):
                continue
            if wanted <= facts:
                path: list[Capability] = []
                while facts in came_from:
                    facts, cap = came_from[facts]
                    path.append(cap)
                return tuple(reversed(path))
            expansions += 1
            if expansions > self.max_expansions:
                raise BudgetExceeded("search_nodes", self.max_expansions, expansions)
            for cap in caps:
                if cap.inputs <= facts and not cap.outputs <= facts:
                    nxt = facts | cap.outputs
                    new_cost = cost + cap.cost
                    if new_cost < best.get(nxt, float("inf")):
                        best[nxt] = new_cost
                        came_from[nxt] = (facts, cap)
                        heapq.heappush(
                            frontier, (new_cost + heuristic(nxt), new_cost, next(counter), nxt)
                        )
        missing = sorted(wanted - start)
        producible = frozenset().union(*(c.outputs for c in caps))
        inputs = frozenset().union(wanted, *(c.inputs for c in caps))
        unobtainable = sorted(inputs - start - producible)
        detail = f"no capabilities produce {', '.join(missing)} from the available facts"
        if unobtainable:
            detail += f"; nothing produces {', '.join(unobtainable)}"
        raise NoMethodMatched(goal, [c.name for c in caps], detail)

    def plan(self, goal: Goal, state: Mapping[str, Any]) -> DagPlan:
        """Plan `goal`; raise `NoMethodMatched` (no goal facts or no path) or
        `GoalAlreadySatisfied`."""
        if goal.name not in self.goals:
            raise NoMethodMatched(goal.name, (), "no goal facts are declared for this goal")
        wanted = self.goals[goal.name]
        start = available_facts(state)
        if wanted <= start:
            raise GoalAlreadySatisfied(goal.name, f"facts present: {', '.join(sorted(wanted))}")
        path = self._search(goal.name, wanted, start)
        # Keep only capabilities whose outputs someone needs, walking back from the goal.
        needed = set(wanted - start)
        kept: list[Capability] = []
        for cap in reversed(path):
            if cap.outputs & needed:
                kept.append(cap)
                needed -= cap.outputs
                needed |= cap.inputs - start
        kept.reverse()
        leaves: list[Leaf] = []
        for i, cap in enumerate(kept):
            producers: list[str] = []
            for fact in sorted(cap.inputs - start):
                producer = next(p for p in reversed(kept[:i]) if fact in p.outputs)
                if producer.name not in producers:
                    producers.append(producer.name)
            leaves.append(
                Leaf(
                    key=cap.name,
                    agent=cap.agent,
                    task=cap.task,
                    rationale=cap.rationale
                    or f"produces {', '.join(sorted(cap.outputs))} (cost {cap.cost:g})",
                    tool=cap.tool,
                    inputs=cap.tool_inputs,
                    depends_on=tuple(producers),
                    expected_output=cap.expected_output,
                    failure_policy=cap.failure_policy,
                    risk=cap.risk,
                    provenance=Provenance(strategy="goal", source=cap.name, depth=1),
                )
            )
        root = Compound(
            key=goal.name,
            name=goal.name,
            description=goal.description,
            children=tuple(leaves),
            provenance=Provenance(strategy="goal", source="a-star", depth=0),
        )
        return DagPlan.build(root)
