"""Value objects of the plan tree: goals, compound tasks and leaf tasks.

`depends_on` on a node names other nodes of the same tree, normally its siblings:
`None` means "after the previous sibling", `()` means independent. A dependency on a
compound is a dependency on its exit leaves; a compound's entry leaves inherit the
compound's dependencies (see `planning.core.dag`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

type StrategyName = Literal["static", "forward", "goal", "llm", "hybrid"]
type FailurePolicy = Literal["retry", "continue", "abort", "escalate", "replan"]

STRATEGY_NAMES: tuple[StrategyName, ...] = ("static", "forward", "goal", "llm", "hybrid")
FAILURE_POLICIES: tuple[FailurePolicy, ...] = ("retry", "continue", "abort", "escalate", "replan")

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def freeze(value: Any) -> Any:
    """Return a deeply immutable copy of a JSON-like value (dicts → mappingproxy, lists → tuple)."""
    if isinstance(value, Mapping):
        return MappingProxyType({str(k): freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, set | frozenset):
        return frozenset(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Return a plain JSON-like copy (dicts and lists) of a frozen value."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    if isinstance(value, frozenset | set):
        return sorted((thaw(v) for v in value), key=repr)
    return value


def _freeze_deps(value: Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        raise TypeError("depends_on must be a sequence of keys, not a string")
    return tuple(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Provenance:
    """Where a node came from: the strategy, the method/capability/LLM call, and the depth."""

    strategy: StrategyName
    source: str
    depth: int

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGY_NAMES:
            raise ValueError(f"unknown strategy {self.strategy!r}")
        if self.depth < 0:
            raise ValueError("provenance depth must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class LeafSpec:
    """What a leaf does, declared once for a planned `Leaf` and a method's `Step`.

    The agent, the task, the tool and its inputs, the order among siblings, the expected output,
    the failure policy and the risk.
    """

    key: str
    agent: str
    task: str
    rationale: str = ""
    tool: str | None = None
    inputs: Mapping[str, Any] = field(default=_EMPTY)
    depends_on: tuple[str, ...] | None = None
    expected_output: str | None = None
    failure_policy: FailurePolicy = "abort"
    risk: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", freeze(dict(self.inputs)))
        object.__setattr__(self, "depends_on", _freeze_deps(self.depends_on))


@dataclass(frozen=True, slots=True, kw_only=True)
class Leaf(LeafSpec):
    """An executable step assigned to one agent, optionally through one tool."""

    provenance: Provenance

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("a leaf needs a non-empty key")
        if self.failure_policy not in FAILURE_POLICIES:
            raise ValueError(f"unknown failure policy {self.failure_policy!r}")
        # by name: a slotted dataclass is rebuilt, so the zero-argument super() misses it
        LeafSpec.__post_init__(self)

    @property
    def is_leaf(self) -> bool:
        """Tell whether this node is a leaf (always true)."""
        return True


@dataclass(frozen=True, slots=True, kw_only=True)
class Compound:
    """A goal or subtask decomposed into ordered children.

    A compound with no children is an unexpanded placeholder: strategies fill it in,
    and `DagPlan.build` refuses it.
    """

    key: str
    name: str
    description: str = ""
    children: tuple[Leaf | Compound, ...] = ()
    depends_on: tuple[str, ...] | None = None
    provenance: Provenance

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("a compound needs a non-empty key")
        object.__setattr__(self, "children", tuple(self.children))
        object.__setattr__(self, "depends_on", _freeze_deps(self.depends_on))

    @property
    def is_leaf(self) -> bool:
        """Tell whether this node is a leaf (always false)."""
        return False

    def walk(self) -> Iterator[Leaf | Compound]:
        """Yield this compound and every descendant, depth first in tree order."""
        yield self
        for child in self.children:
            if isinstance(child, Compound):
                yield from child.walk()
            else:
                yield child

    def iter_leaves(self) -> Iterator[Leaf]:
        """Yield the leaves under this compound in tree order."""
        for node in self.walk():
            if isinstance(node, Leaf):
                yield node


type Node = Leaf | Compound


@dataclass(frozen=True, slots=True, kw_only=True)
class Goal:
    """What to plan for, with the context a recursive planner shows the model."""

    name: str
    description: str = ""
    parent: str | None = None
    siblings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("a goal needs a name")
        object.__setattr__(self, "siblings", tuple(self.siblings))
