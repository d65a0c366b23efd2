"""Agents, tools and domain packs: what plans may use.

Tool functions take their validated input model and a data-source port (whatever the pack
needs, e.g. an ERP reader); the Django side passes a database-backed port, tests pass the
pack's in-memory one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from planning.core.goal import Capability, GoalOrientedDecomposition
from planning.core.tree import Goal, thaw

if TYPE_CHECKING:
    # Only a type here: the static planner imports the validation, which imports this module.
    from planning.core.static import MethodLibrary

type ToolRisk = Literal["read", "write", "financial", "external", "destructive"]
type AgentKind = Literal["tool", "llm", "human"]

TOOL_RISKS: tuple[ToolRisk, ...] = ("read", "write", "financial", "external", "destructive")
AGENT_KINDS: tuple[AgentKind, ...] = ("tool", "llm", "human")


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A registered callable with pydantic input and output models and a risk class."""

    name: str
    description: str
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    risk: ToolRisk
    func: Callable[[Any, Any], BaseModel]

    def __post_init__(self) -> None:
        if self.risk not in TOOL_RISKS:
            raise ValueError(f"unknown risk class {self.risk!r} for tool {self.name!r}")

    def run(self, inputs: Mapping[str, Any], port: Any) -> BaseModel:
        """Validate `inputs`, call the tool with `port`, and return its validated output.

        Raises `pydantic.ValidationError` when the inputs or the output do not fit the models.
        """
        arguments = self.input_model.model_validate(thaw(inputs))
        result = self.func(arguments, port)
        if isinstance(result, self.output_model):
            return result
        return self.output_model.model_validate(
            result.model_dump() if isinstance(result, BaseModel) else result
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSpec:
    """An agent the planner may assign leaves to."""

    slug: str
    name: str
    description: str
    kind: AgentKind
    capabilities: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    trust: float = 0.5
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.kind not in AGENT_KINDS:
            raise ValueError(f"unknown agent kind {self.kind!r} for agent {self.slug!r}")
        object.__setattr__(self, "capabilities", tuple(self.capabilities))
        object.__setattr__(self, "tools", tuple(self.tools))


@dataclass(frozen=True, slots=True)
class Catalogue:
    """The agents and tools a plan is validated against."""

    agents: Mapping[str, AgentSpec]
    tools: Mapping[str, ToolSpec]

    @classmethod
    def from_specs(cls, agents: Iterable[AgentSpec], tools: Iterable[ToolSpec]) -> Catalogue:
        """Index specs by slug/name; raise `ValueError` on duplicates."""
        agent_map: dict[str, AgentSpec] = {}
        for agent in agents:
            if agent.slug in agent_map:
                raise ValueError(f"duplicate agent {agent.slug!r}")
            agent_map[agent.slug] = agent
        tool_map: dict[str, ToolSpec] = {}
        for tool in tools:
            if tool.name in tool_map:
                raise ValueError(f"duplicate tool {tool.name!r}")
            tool_map[tool.name] = tool
        return cls(MappingProxyType(agent_map), MappingProxyType(tool_map))

    def merged(self, other: Catalogue) -> Catalogue:
        """Return a catalogue with both catalogues' entries (`other` wins on clashes)."""
        return Catalogue(
            MappingProxyType({**self.agents, **other.agents}),
            MappingProxyType({**self.tools, **other.tools}),
        )


def _no_state(inputs: BaseModel) -> dict[str, Any]:
    return inputs.model_dump(mode="json")


@dataclass(frozen=True, slots=True, kw_only=True)
class DomainPack:
    """Methods, agents, tools and case input schema for one domain."""

    slug: str
    name: str
    description: str
    input_schema: type[BaseModel]
    root_task: str
    methods: MethodLibrary
    agents: tuple[AgentSpec, ...]
    tools: tuple[ToolSpec, ...]
    build_state: Callable[[Any], dict[str, Any]] = _no_state
    demo_port: Callable[[], Any] | None = None
    capabilities: tuple[Capability, ...] = ()
    goal_facts: Mapping[str, frozenset[str]] = field(default_factory=dict)
    # Case-specific goal-oriented planning: capabilities whose tool inputs carry the case's
    # values (e.g. the invoice number), and the root task's goal facts chosen from the state.
    # When set, they take the place of `capabilities` / `goal_facts[root_task]`.
    capabilities_from: Callable[[Mapping[str, Any]], tuple[Capability, ...]] | None = None
    goal_facts_from: Callable[[Mapping[str, Any]], frozenset[str]] | None = None

    def initial_state(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Validate case `inputs` against the schema and return the planning state.

        Raises `pydantic.ValidationError` when the inputs do not fit `input_schema`.
        """
        return self.build_state(self.input_schema.model_validate(dict(inputs)))

    def capabilities_for(self, state: Mapping[str, Any]) -> tuple[Capability, ...]:
        """Return the goal-oriented capabilities available for a case in `state`."""
        if self.capabilities_from is None:
            return self.capabilities
        return self.capabilities_from(state)

    def goal_facts_for(self, state: Mapping[str, Any]) -> Mapping[str, frozenset[str]]:
        """Return the goal facts by task name for a case in `state`."""
        facts = dict(self.goal_facts)
        if self.goal_facts_from is not None:
            facts[self.root_task] = self.goal_facts_from(state)
        return MappingProxyType(facts)

    def goal_planner(
        self, state: Mapping[str, Any], *, max_expansions: int = 100_000
    ) -> GoalOrientedDecomposition:
        """Return a goal-oriented planner over this pack's capabilities for `state`.

        Raises `ValueError` when the capabilities' names are not unique.
        """
        return GoalOrientedDecomposition(
            self.capabilities_for(state),
            self.goal_facts_for(state),
            max_expansions=max_expansions,
        )

    def catalogue(self) -> Catalogue:
        """Return this pack's agents and tools as a catalogue."""
        return Catalogue.from_specs(self.agents, self.tools)

    def goal(self, description: str = "") -> Goal:
        """Return the goal that plans this pack's root task."""
        return Goal(name=self.root_task, description=description or self.description)

    def tool(self, name: str) -> ToolSpec:
        """Return the tool called `name`; raise `KeyError` when the pack has none."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        raise KeyError(name)
