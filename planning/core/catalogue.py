"""Agents and tools: what plans may use.

Tool functions take their validated input model and a data-source port (whatever the pack
needs, e.g. an ERP reader); the Django side passes a database-backed port, tests pass the
pack's in-memory one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel

from planning.core.tree import thaw

type ToolRisk = Literal["read", "write", "financial", "external", "destructive"]
type AgentKind = Literal["tool", "llm", "human"]

TOOL_RISKS: tuple[ToolRisk, ...] = ("read", "write", "financial", "external", "destructive")
AGENT_KINDS: tuple[AgentKind, ...] = ("tool", "llm", "human")


class TransientToolError(Exception):
    """A tool's failure that may go away (a busy or unreachable upstream): a retry may help."""


def _no_checkpoint() -> None:
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """What a port with side effects needs from the leaf that calls a tool.

    `idempotency_key` is the same for every attempt of the leaf: an effect recorded under it
    must not happen again. `checkpoint` is the safe point before an effect: it raises when the
    leaf must stop (its case was cancelled, execution stopped, its attempt lost the leaf).
    """

    idempotency_key: str
    checkpoint: Callable[[], None] = _no_checkpoint


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
