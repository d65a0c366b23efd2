"""Static HTN decomposition: ordered methods with guard predicates, first match wins.

Domain packs describe tasks with `Method`s. A method's `decompose(state)` returns the
children of the task: `Step`s (leaf specifications), `TaskRef`s (subtasks decomposed by
their own methods), or ready-made `Leaf`/`Compound` nodes. Strategies stamp provenance.

A method names its children with fixed keys, so a subtask used twice (a `notify` at the start
and at the end) would repeat them. `place_keys` keeps the first use of a key and prefixes a
repeat with its parent's key, the way the LLM planner names what it creates
("handle.notify.send-notice"); dependencies and input references written with a repeated key
mean the nearest use before them among the siblings (of the node or of an ancestor).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from planning.core.dag import DagPlan
from planning.core.errors import BudgetExceeded, NoMethodMatched
from planning.core.refs import REF_KEY, is_ref
from planning.core.tree import (
    Compound,
    Goal,
    Leaf,
    LeafSpec,
    Node,
    Provenance,
    StrategyName,
    thaw,
)

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class Step(LeafSpec):
    """A leaf specification emitted by a method; `reads`/`effects` drive forward planning."""

    reads: frozenset[str] = frozenset()
    effects: Mapping[str, Any] = field(default=_EMPTY)

    def __post_init__(self) -> None:
        # by name: a slotted dataclass is rebuilt, so the zero-argument super() misses it
        LeafSpec.__post_init__(self)
        object.__setattr__(self, "effects", MappingProxyType(dict(self.effects)))
        object.__setattr__(self, "reads", frozenset(self.reads))

    def to_leaf(self, provenance: Provenance, depends_on: tuple[str, ...] | None = None) -> Leaf:
        """Return the leaf for this step (with `depends_on` overriding the declared one)."""
        spec = {f.name: getattr(self, f.name) for f in fields(LeafSpec)}
        if depends_on is not None:
            spec["depends_on"] = depends_on
        return Leaf(**spec, provenance=provenance)


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRef:
    """A subtask to decompose with the methods for `task`; its key defaults to the task name."""

    task: str
    key: str = ""
    description: str = ""
    depends_on: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", self.task)
        if self.depends_on is not None:
            object.__setattr__(self, "depends_on", tuple(self.depends_on))


type Item = Step | TaskRef | Leaf | Compound
type Guard = Callable[[Mapping[str, Any]], bool]
type Decompose = Callable[[Mapping[str, Any]], Sequence[Item]]


def always(state: Mapping[str, Any]) -> bool:
    """Return True: a guard for unconditional methods."""
    return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Method:
    """One way to decompose `task`, applicable when `guard(state)` holds."""

    name: str
    task: str
    guard: Guard = always
    decompose: Decompose
    cost: float = 0.0
    duration_s: float = 0.0
    description: str = ""
    # The provenance source of what the method plans when it is not the method's own code (a
    # method promoted from an LLM-planned subtree: "promoted:<name>@v<n>"); empty: the name.
    source: str = ""


class MethodLibrary:
    """An immutable, ordered collection of methods indexed by task name."""

    __slots__ = ("_by_task",)

    def __init__(self, methods: Iterable[Method] = ()) -> None:
        by_task: dict[str, list[Method]] = {}
        names: set[str] = set()
        for method in methods:
            if method.name in names:
                raise ValueError(f"duplicate method name {method.name!r}")
            names.add(method.name)
            by_task.setdefault(method.task, []).append(method)
        self._by_task: Mapping[str, tuple[Method, ...]] = MappingProxyType(
            {task: tuple(ms) for task, ms in by_task.items()}
        )

    def methods_for(self, task: str) -> tuple[Method, ...]:
        """Return the methods for `task` in the order they are tried (empty when none)."""
        return self._by_task.get(task, ())

    def __contains__(self, task: object) -> bool:
        return task in self._by_task

    def __iter__(self) -> Iterator[Method]:
        for methods in self._by_task.values():
            yield from methods


@dataclass(frozen=True, slots=True)
class _Siblings:
    """The children of one node as their method wrote them and as placed, and which is open."""

    keys: tuple[tuple[str, str], ...]
    at: int

    def find(self, written: str) -> str | None:
        placed = [new for i, (old, new) in enumerate(self.keys) if old == written and i < self.at]
        if placed:
            return placed[-1]
        return next((new for old, new in self.keys if old == written), None)


type KeyScope = tuple[_Siblings, ...]
"""The sibling groups from the root down to the node being placed, innermost last."""


def _resolve(scope: KeyScope, written: str) -> str:
    for siblings in reversed(scope):
        placed = siblings.find(written)
        if placed is not None:
            return placed
    return written


def _free_key(key: str, parent: str, taken: AbstractSet[str]) -> str:
    if key not in taken:
        return key
    candidate, n = f"{parent}.{key}", 2
    while candidate in taken:
        candidate, n = f"{parent}.{key}-{n}", n + 1
    return candidate


def _placed[T: Item](item: T, key: str, scope: KeyScope) -> T:
    changes: dict[str, Any] = {}
    if item.key != key:
        changes["key"] = key
    if item.depends_on is not None:
        depends_on = tuple(_resolve(scope, d) for d in item.depends_on)
        if depends_on != item.depends_on:
            changes["depends_on"] = depends_on
    if isinstance(item, Step | Leaf):
        moved = {
            name: {**thaw(value), REF_KEY: source}
            for name, value in item.inputs.items()
            if is_ref(value) and (source := _resolve(scope, str(value[REF_KEY]))) != value[REF_KEY]
        }
        if moved:
            changes["inputs"] = {**thaw(item.inputs), **moved}
    return replace(item, **changes) if changes else item


def place_keys[T: Item](
    children: Sequence[T], parent: str, taken: frozenset[str], scope: KeyScope = ()
) -> tuple[tuple[tuple[T, KeyScope], ...], frozenset[str]]:
    """Give `parent`'s children keys unused in `taken`; return each with its scope, and `taken`.

    A key already taken becomes "<parent>.<key>" (then "-2", "-3"… should that be taken too);
    the children's dependencies and input references are rewritten to the placed keys. Place a
    child's own children with the scope returned for it.
    """
    used = set(taken)
    keys: list[tuple[str, str]] = []
    for child in children:
        key = _free_key(child.key, parent, used)
        used.add(key)
        keys.append((child.key, key))
    placed = tuple(keys)
    out: list[tuple[T, KeyScope]] = []
    for i, child in enumerate(children):
        inner = (*scope, _Siblings(placed, i))
        out.append((_placed(child, placed[i][1], inner), inner))
    return tuple(out), frozenset(used)


def unique_keys(root: Compound) -> Compound:
    """Return the tree with every repeated key placed the way static planning places it.

    Keys already unique stay as they are; a repeat becomes "<parent>.<key>", and dependencies and
    input references follow it (the nearest earlier use). For trees built elsewhere (hybrid).
    """

    def fill(node: Node, taken: frozenset[str], scope: KeyScope) -> tuple[Node, frozenset[str]]:
        if isinstance(node, Leaf) or not node.children:
            return node, taken
        placed, taken = place_keys(node.children, node.key, taken, scope)
        children: list[Node] = []
        for child, inner in placed:
            done, taken = fill(child, taken, inner)
            children.append(done)
        return replace(node, children=tuple(children)), taken

    filled, _ = fill(root, frozenset({root.key}), ())
    assert isinstance(filled, Compound)
    return filled


def is_within_budget(method: Method, cost_budget: float | None, time_budget: float | None) -> bool:
    """Tell whether `method` fits the cost and time budgets (None = unlimited)."""
    if cost_budget is not None and method.cost > cost_budget:
        return False
    return not (time_budget is not None and method.duration_s > time_budget)


def stamp(node: Node, provenance: Provenance) -> Node:
    """Return `node` (recursively) with `provenance`, children one level deeper."""
    if isinstance(node, Leaf):
        return replace(node, provenance=provenance)
    deeper = replace(provenance, depth=provenance.depth + 1)
    return replace(
        node, provenance=provenance, children=tuple(stamp(c, deeper) for c in node.children)
    )


class StaticDecomposition:
    """Decompose with the first applicable method per task; the state is never changed."""

    strategy_name: StrategyName = "static"

    def __init__(
        self,
        library: MethodLibrary,
        *,
        cost_budget: float | None = None,
        time_budget: float | None = None,
        max_depth: int = 16,
    ) -> None:
        self.library = library
        self.cost_budget = cost_budget
        self.time_budget = time_budget
        self.max_depth = max_depth

    def _choose(self, task: str, state: Mapping[str, Any]) -> Method:
        tried: list[str] = []
        skipped: list[str] = []
        for method in self.library.methods_for(task):
            tried.append(method.name)
            if not is_within_budget(method, self.cost_budget, self.time_budget):
                skipped.append(method.name)
                continue
            if method.guard(state):
                return method
        detail = f"over budget: {', '.join(skipped)}" if skipped else ""
        raise NoMethodMatched(task, tried, detail)

    def expand_with_method(
        self, task: str, state: Mapping[str, Any], depth: int
    ) -> tuple[Method, tuple[Node, ...]]:
        """Apply the first applicable method for `task`; return it and the children it makes.

        Children are at `depth`. A `TaskRef` becomes a `Compound` placeholder with no children
        (named after its task) for the caller to expand. Raises `NoMethodMatched`.
        """
        method = self._choose(task, state)
        source = method.source or method.name
        provenance = Provenance(strategy=self.strategy_name, source=source, depth=depth)
        children: list[Node] = []
        for item in method.decompose(state):
            if isinstance(item, Step):
                children.append(item.to_leaf(provenance))
            elif isinstance(item, TaskRef):
                children.append(
                    Compound(
                        key=item.key,
                        name=item.task,
                        description=item.description,
                        depends_on=item.depends_on,
                        provenance=provenance,
                    )
                )
            else:
                children.append(stamp(item, provenance))
        return method, tuple(children)

    def _fill(
        self, node: Node, state: Mapping[str, Any], taken: frozenset[str], scope: KeyScope
    ) -> tuple[Node, frozenset[str]]:
        if isinstance(node, Leaf):
            return node, taken
        provenance = node.provenance
        children = node.children
        if not children:
            depth = provenance.depth
            if depth + 1 > self.max_depth:
                raise BudgetExceeded("depth", self.max_depth, depth + 1)
            method, children = self.expand_with_method(node.name, state, depth + 1)
            provenance = replace(provenance, source=method.source or method.name)
        placed, taken = place_keys(children, node.key, taken, scope)
        filled: list[Node] = []
        for child, inner in placed:
            done, taken = self._fill(child, state, taken, inner)
            filled.append(done)
        return replace(node, children=tuple(filled), provenance=provenance), taken

    def plan(self, goal: Goal, state: Mapping[str, Any]) -> DagPlan:
        """Decompose `goal.name` fully; raise `NoMethodMatched`, `BudgetExceeded`, `PlanInvalid`."""
        root = Compound(
            key=goal.name,
            name=goal.name,
            description=goal.description,
            provenance=Provenance(strategy=self.strategy_name, source=goal.name, depth=0),
        )
        filled, _ = self._fill(root, MappingProxyType(dict(state)), frozenset({root.key}), ())
        assert isinstance(filled, Compound)
        return DagPlan.build(filled)
