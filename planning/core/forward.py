"""Forward (SHOP-style) decomposition over a projected copy of the state.

Each `Step`'s effects are applied to a projection so that later guards see them; when no
method applies to a later task the search backtracks to the next method of an earlier one.
Leaf dependencies are derived from state access instead of sibling order: a step waits for
the last writer of every key it reads (declared `reads` plus every key the guards and
decompositions above it looked at) and of every key it writes, and for the readers of the
keys it overwrites. Steps that touch disjoint keys stay parallel. The caller's state is
never modified. A subtask used twice gets unique keys as in static planning (`place_keys`);
the keys taken so far belong to the projection, so a backtracked branch gives its keys back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from planning.core.dag import DagPlan
from planning.core.errors import BudgetExceeded, NoMethodMatched
from planning.core.static import (
    Item,
    KeyScope,
    MethodLibrary,
    Step,
    TaskRef,
    is_within_budget,
    place_keys,
    stamp,
)
from planning.core.tree import Compound, Goal, Leaf, Node, Provenance


class _RecordingView(Mapping[str, Any]):
    """A read-only view of the projected state that records the keys looked at."""

    __slots__ = ("_facts", "read")

    def __init__(self, facts: Mapping[str, Any]) -> None:
        self._facts = facts
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return self._facts[key]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return key in self._facts

    def __iter__(self) -> Iterator[str]:
        self.read.update(self._facts)
        return iter(self._facts)

    def __len__(self) -> int:
        self.read.update(self._facts)
        return len(self._facts)


@dataclass(frozen=True, slots=True)
class _Projection:
    facts: Mapping[str, Any]
    writer: Mapping[str, str]
    readers: Mapping[str, frozenset[str]]
    keys: frozenset[str]

    def apply(
        self, key: str, reads: frozenset[str], effects: Mapping[str, Any]
    ) -> tuple[tuple[str, ...], _Projection]:
        deps: set[str] = set()
        for k in reads | effects.keys():
            if k in self.writer:
                deps.add(self.writer[k])
        for k in effects:
            deps.update(self.readers.get(k, frozenset()))
        deps.discard(key)
        facts = dict(self.facts)
        facts.update(effects)
        writer = dict(self.writer)
        readers = dict(self.readers)
        for k in reads:
            readers[k] = readers.get(k, frozenset()) | {key}
        for k in effects:
            writer[k] = key
            readers[k] = frozenset()
        return tuple(sorted(deps)), _Projection(
            MappingProxyType(facts), MappingProxyType(writer), MappingProxyType(readers), self.keys
        )

    def place(
        self, items: Sequence[Item], parent: str, scope: KeyScope
    ) -> tuple[tuple[tuple[Item, KeyScope], ...], _Projection]:
        placed, keys = place_keys(items, parent, self.keys, scope)
        return placed, replace(self, keys=keys)


class _Search:
    """One planning run's backtracking search (holds the failure log and expansion count)."""

    def __init__(self, strategy: ForwardDecomposition) -> None:
        self.strategy = strategy
        self.failures: list[NoMethodMatched] = []
        self.expansions = 0

    def task(
        self,
        ref: TaskRef,
        proj: _Projection,
        depth: int,
        context: frozenset[str],
        scope: KeyScope,
    ) -> Iterator[tuple[Compound, _Projection]]:
        strategy = self.strategy
        if depth + 1 > strategy.max_depth:
            raise BudgetExceeded("depth", strategy.max_depth, depth + 1)
        tried: list[str] = []
        for method in strategy.library.methods_for(ref.task):
            tried.append(method.name)
            if not is_within_budget(method, strategy.cost_budget, strategy.time_budget):
                continue
            self.expansions += 1
            if self.expansions > strategy.max_expansions:
                raise BudgetExceeded("expansions", strategy.max_expansions, self.expansions)
            view = _RecordingView(proj.facts)
            if not method.guard(view):
                continue
            items, placed = proj.place(method.decompose(view), ref.key, scope)
            reads = context | frozenset(view.read)
            source = method.source or method.name
            provenance = Provenance(strategy="forward", source=source, depth=depth + 1)
            for children, after in self.sequence(items, placed, provenance, reads):
                node = Compound(
                    key=ref.key,
                    name=ref.task,
                    description=ref.description,
                    children=children,
                    depends_on=() if ref.depends_on is None else ref.depends_on,
                    provenance=replace(provenance, depth=depth),
                )
                yield node, after
        self.failures.append(NoMethodMatched(ref.task, tried))

    def sequence(
        self,
        items: Sequence[tuple[Item, KeyScope]],
        proj: _Projection,
        provenance: Provenance,
        context: frozenset[str],
    ) -> Iterator[tuple[tuple[Node, ...], _Projection]]:
        if not items:
            yield (), proj
            return
        (first, scope), rest = items[0], items[1:]
        for node, after in self.item(first, proj, provenance, context, scope):
            for nodes, final in self.sequence(rest, after, provenance, context):
                yield (node, *nodes), final

    def item(
        self,
        item: Item,
        proj: _Projection,
        provenance: Provenance,
        context: frozenset[str],
        scope: KeyScope,
    ) -> Iterator[tuple[Node, _Projection]]:
        if isinstance(item, Step):
            deps, after = proj.apply(item.key, item.reads | context, item.effects)
            if item.depends_on is not None:
                deps = tuple(dict.fromkeys((*deps, *item.depends_on)))
            yield item.to_leaf(provenance, depends_on=deps), after
        elif isinstance(item, TaskRef):
            yield from self.task(item, proj, provenance.depth, context, scope)
        elif isinstance(item, Leaf):
            yield stamp(item, provenance), proj
        else:
            stamped = stamp(item, provenance)
            assert isinstance(stamped, Compound)
            yield from self._compound(stamped, proj, provenance, context, scope)

    def _compound(
        self,
        node: Compound,
        proj: _Projection,
        provenance: Provenance,
        context: frozenset[str],
        scope: KeyScope,
    ) -> Iterator[tuple[Node, _Projection]]:
        if not node.children:
            ref = TaskRef(
                task=node.name,
                key=node.key,
                description=node.description,
                depends_on=node.depends_on,
            )
            yield from self.task(ref, proj, provenance.depth, context, scope)
            return
        inner = replace(provenance, depth=provenance.depth + 1)
        children, placed = proj.place(node.children, node.key, scope)
        for children_done, after in self.sequence(children, placed, inner, context):
            yield replace(node, children=children_done), after


class ForwardDecomposition:
    """Plan with methods against a projected state that each step's effects update."""

    strategy_name = "forward"

    def __init__(
        self,
        library: MethodLibrary,
        *,
        cost_budget: float | None = None,
        time_budget: float | None = None,
        max_depth: int = 16,
        max_expansions: int = 10_000,
    ) -> None:
        self.library = library
        self.cost_budget = cost_budget
        self.time_budget = time_budget
        self.max_depth = max_depth
        self.max_expansions = max_expansions

    def plan(self, goal: Goal, state: Mapping[str, Any]) -> DagPlan:
        """Decompose `goal.name`; raise `NoMethodMatched`, `BudgetExceeded` or `PlanInvalid`."""
        search = _Search(self)
        start = _Projection(
            MappingProxyType(dict(state)),
            MappingProxyType({}),
            MappingProxyType({}),
            frozenset({goal.name}),
        )
        ref = TaskRef(task=goal.name, description=goal.description)
        for root, _ in search.task(ref, start, 0, frozenset(), ()):
            return DagPlan.build(root)
        root_failure = search.failures[-1]
        below = search.failures[:-1]
        if not below:
            raise root_failure
        first = below[0]
        raise NoMethodMatched(
            goal.name,
            root_failure.methods_tried,
            f"every applicable method failed further down; first failure: {first}",
        )
