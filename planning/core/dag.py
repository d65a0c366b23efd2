"""`DagPlan`: a resolved plan tree together with the DAG of its leaves.

Flattening rules (DESIGN §3):

- a node's `depends_on` names other nodes of the tree, normally earlier siblings;
  `None` means "after the previous sibling" (nothing for a first child), `()` means independent;
- a dependency on a compound is a dependency on its exit leaves (the leaves no sibling inside
  that compound waits for);
- a compound's entry children (those that wait for no sibling) inherit the compound's
  dependencies, recursively down to leaves.

A dependency on a later sibling is legal as long as the result stays acyclic; cycles,
self-dependencies, unknown keys and dependencies between a node and its own ancestors are refused.
"""

from __future__ import annotations

import graphlib
import heapq
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from planning.core.errors import PlanInvalid
from planning.core.tree import Compound, Leaf, Node


def _quoted(keys: Collection[str]) -> str:
    return ", ".join(repr(k) for k in keys)


@dataclass(frozen=True, slots=True)
class _Index:
    nodes: dict[str, Node]
    parents: dict[str, Compound]
    order: dict[str, int]


def _index(root: Compound) -> _Index:
    nodes: dict[str, Node] = {}
    parents: dict[str, Compound] = {}
    duplicates: list[str] = []
    empty: list[str] = []

    def visit(node: Node, parent: Compound | None) -> None:
        if node.key in nodes:
            if node.key not in duplicates:
                duplicates.append(node.key)
        else:
            nodes[node.key] = node
            if parent is not None:
                parents[node.key] = parent
        if isinstance(node, Compound):
            if not node.children and parent is not None:
                empty.append(node.key)
            for child in node.children:
                visit(child, node)

    visit(root, None)
    if duplicates:
        raise PlanInvalid(f"duplicate keys in plan: {_quoted(duplicates)}", duplicates)
    if empty:
        raise PlanInvalid(f"compound tasks without children: {_quoted(empty)}", empty)
    order = {key: i for i, key in enumerate(nodes)}
    return _Index(nodes=nodes, parents=parents, order=order)


def _ancestors(key: str, parents: Mapping[str, Compound]) -> Iterator[str]:
    while key in parents:
        key = parents[key].key
        yield key


def _sibling_deps(root: Compound, index: _Index) -> dict[str, tuple[str, ...]]:
    """Resolve every node's declared dependencies, checking self, unknown and ancestry."""
    resolved: dict[str, tuple[str, ...]] = {}
    if root.depends_on:
        raise PlanInvalid(
            f"the root {root.key!r} cannot depend on anything (depends on "
            f"{_quoted(root.depends_on)})",
            (root.key, *root.depends_on),
        )
    resolved[root.key] = ()
    for node in root.walk():
        if not isinstance(node, Compound):
            continue
        previous: str | None = None
        for child in node.children:
            if child.depends_on is None:
                deps: tuple[str, ...] = () if previous is None else (previous,)
            else:
                deps = tuple(dict.fromkeys(child.depends_on))
            for dep in deps:
                if dep == child.key:
                    raise PlanInvalid(f"{child.key!r} depends on itself", (child.key,))
                if dep not in index.nodes:
                    raise PlanInvalid(
                        f"{child.key!r} depends on unknown key {dep!r}", (child.key, dep)
                    )
                if dep in set(_ancestors(child.key, index.parents)):
                    raise PlanInvalid(
                        f"{child.key!r} depends on {dep!r}, which contains it", (child.key, dep)
                    )
                if child.key in set(_ancestors(dep, index.parents)):
                    raise PlanInvalid(
                        f"{child.key!r} depends on {dep!r}, which is inside it", (child.key, dep)
                    )
            resolved[child.key] = deps
            previous = child.key
    return resolved


def _flatten(root: Compound, index: _Index) -> dict[str, frozenset[str]]:
    declared = _sibling_deps(root, index)
    exits_cache: dict[str, frozenset[str]] = {}

    def exits(key: str) -> frozenset[str]:
        if key in exits_cache:
            return exits_cache[key]
        node = index.nodes[key]
        if isinstance(node, Leaf):
            result = frozenset((key,))
        else:
            siblings = {c.key for c in node.children}
            waited_for = {d for c in node.children for d in declared[c.key] if d in siblings}
            result = frozenset().union(
                *(exits(c.key) for c in node.children if c.key not in waited_for)
            )
        exits_cache[key] = result
        return result

    inherited: dict[str, frozenset[str]] = {root.key: frozenset()}
    leaf_deps: dict[str, frozenset[str]] = {}
    for node in root.walk():
        if not isinstance(node, Compound):
            continue
        siblings = {c.key for c in node.children}
        for child in node.children:
            own = frozenset().union(*(exits(d) for d in declared[child.key]))
            is_entry = not any(d in siblings for d in declared[child.key])
            deps = own | inherited[node.key] if is_entry else own
            if isinstance(child, Leaf):
                leaf_deps[child.key] = deps
            else:
                inherited[child.key] = deps
    return leaf_deps


@dataclass(frozen=True, slots=True, kw_only=True)
class DagPlan:
    """A fully materialised plan: the tree and the dependency DAG of its leaves."""

    root: Compound
    leaves: tuple[Leaf, ...]
    dependencies: Mapping[str, frozenset[str]]
    warnings: tuple[str, ...] = ()
    llm_calls: int = 0
    _nodes: Mapping[str, Node] = field(repr=False, compare=False)
    _parents: Mapping[str, Compound] = field(repr=False, compare=False)

    @classmethod
    def build(
        cls, root: Compound, *, warnings: Collection[str] = (), llm_calls: int = 0
    ) -> DagPlan:
        """Flatten `root` into a plan.

        Raises `PlanInvalid` (naming the keys) for an empty plan, duplicate keys, empty
        compounds, self, unknown, ancestor or cyclic dependencies.
        """
        if not any(True for _ in root.iter_leaves()):
            raise PlanInvalid(f"plan {root.key!r} has no leaf tasks", (root.key,))
        index = _index(root)
        deps = _flatten(root, index)
        leaves = tuple(root.iter_leaves())
        sorter = graphlib.TopologicalSorter(deps)
        try:
            sorter.prepare()
        except graphlib.CycleError as exc:
            cycle = [str(k) for k in exc.args[1]]
            raise PlanInvalid(
                f"dependency cycle: {' -> '.join(repr(k) for k in cycle)}",
                tuple(dict.fromkeys(cycle)),
            ) from None
        return cls(
            root=root,
            leaves=leaves,
            dependencies=MappingProxyType({leaf.key: deps[leaf.key] for leaf in leaves}),
            warnings=tuple(warnings),
            llm_calls=llm_calls,
            _nodes=MappingProxyType(index.nodes),
            _parents=MappingProxyType(index.parents),
        )

    # -- lookups ---------------------------------------------------------------------------

    def node(self, key: str) -> Node:
        """Return the node with `key`; raise `KeyError` when there is none."""
        return self._nodes[key]

    def leaf(self, key: str) -> Leaf:
        """Return the leaf with `key`; raise `KeyError` when there is no such leaf."""
        node = self._nodes[key]
        if not isinstance(node, Leaf):
            raise KeyError(key)
        return node

    def parent_of(self, key: str) -> Compound | None:
        """Return the compound containing `key` (None for the root); raise `KeyError` if unknown."""
        if key not in self._nodes:
            raise KeyError(key)
        return self._parents.get(key)

    def nodes(self) -> tuple[Node, ...]:
        """Return every node, compounds included, in tree order."""
        return tuple(self._nodes.values())

    def upstream(self, key: str) -> frozenset[str]:
        """Return every leaf that `key` waits for, directly or through others."""
        seen: set[str] = set()
        stack = list(self.dependencies[key])
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                stack.extend(self.dependencies[current])
        return frozenset(seen)

    def dependents(self) -> Mapping[str, frozenset[str]]:
        """Return leaf key → keys of the leaves that wait for it."""
        out: dict[str, set[str]] = {leaf.key: set() for leaf in self.leaves}
        for key, deps in self.dependencies.items():
            for dep in deps:
                out[dep].add(key)
        return {key: frozenset(v) for key, v in out.items()}

    # -- graph queries ---------------------------------------------------------------------

    def _tree_position(self) -> dict[str, int]:
        return {leaf.key: i for i, leaf in enumerate(self.leaves)}

    def topological_order(self) -> tuple[str, ...]:
        """Return leaf keys in dependency order, ties broken by tree order."""
        position = self._tree_position()
        sorter = graphlib.TopologicalSorter(self.dependencies)
        sorter.prepare()
        heap: list[tuple[int, str]] = []
        out: list[str] = []
        while sorter.is_active():
            for key in sorter.get_ready():
                heapq.heappush(heap, (position[key], key))
            _, key = heapq.heappop(heap)
            out.append(key)
            sorter.done(key)
        return tuple(out)

    def ready(self, done: Collection[str]) -> frozenset[str]:
        """Return the leaves not in `done` whose dependencies are all done."""
        finished = set(done)
        sorter = graphlib.TopologicalSorter(self.dependencies)
        sorter.prepare()
        ready: set[str] = set()
        progressed = True
        while progressed and sorter.is_active():
            progressed = False
            for key in sorter.get_ready():
                if key in finished:
                    sorter.done(key)
                    progressed = True
                else:
                    ready.add(key)
        return frozenset(ready)

    def critical_path(self, durations: Mapping[str, float] | None = None) -> tuple[str, ...]:
        """Return the longest chain of leaves (by count, or by `durations` when given)."""
        best: dict[str, tuple[float, str | None]] = {}
        for key in self.topological_order():
            weight = 1.0 if durations is None else float(durations.get(key, 0.0))
            length, previous = weight, None
            for dep in sorted(self.dependencies[key]):
                if best[dep][0] + weight > length:
                    length, previous = best[dep][0] + weight, dep
            best[key] = (length, previous)
        position = self._tree_position()
        end = max(best, key=lambda k: (best[k][0], -position[k]))
        chain: list[str] = []
        cursor: str | None = end
        while cursor is not None:
            chain.append(cursor)
            cursor = best[cursor][1]
        return tuple(reversed(chain))

    def levels(self) -> tuple[frozenset[str], ...]:
        """Return the leaves grouped by earliest start when every leaf takes one time unit."""
        level: dict[str, int] = {}
        for key in self.topological_order():
            level[key] = 1 + max((level[d] for d in self.dependencies[key]), default=-1)
        groups: dict[int, set[str]] = {}
        for key, n in level.items():
            groups.setdefault(n, set()).add(key)
        return tuple(frozenset(groups[n]) for n in sorted(groups))

    def width(self) -> int:
        """Return the most leaves that run together when every leaf takes one time unit."""
        return max(len(group) for group in self.levels())
