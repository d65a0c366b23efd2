"""Domain packs: the methods, agents, tools and case inputs of one domain, put together."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ValidationError

from planning.core.catalogue import AgentSpec, Catalogue, ToolSpec
from planning.core.errors import flatten_errors
from planning.core.goal import Capability, GoalOrientedDecomposition
from planning.core.static import MethodLibrary
from planning.core.tree import Goal


def _has_problem(problems: Mapping[str, object], path: str) -> bool:
    return any(p == path or p.startswith(f"{path}.") for p in problems)


type StateView = Mapping[str, Any]
type DataCheck = Callable[[Mapping[str, Any], Any], Mapping[str, Sequence[str]]]
type GoalCheck = Callable[[Mapping[str, Any], Any], GoalFindings]
type InputSuggestions = Callable[[Any], Mapping[str, Mapping[str, str]]]

# The planning state's fact "this installation has no LLM provider": the app sets it (the core
# and the packs never ask Django), a pack's methods read it (`has_llm_provider`) to give the
# work of an `llm` agent to a person or a tool. A dotted name is never a case input's. Only an
# installation without a provider carries it, so the state an LLM planner is shown is unchanged.
NO_LLM_PROVIDER = "installation.no_llm_provider"


def planning_state(state: Mapping[str, Any], *, has_llm_provider: bool) -> dict[str, Any]:
    """Return the planning `state` with the installation's facts (whether an LLM can be called)."""
    facts = dict(state)
    facts.pop(NO_LLM_PROVIDER, None)
    if not has_llm_provider:
        facts[NO_LLM_PROVIDER] = True
    return facts


def case_inputs(state: Mapping[str, Any]) -> dict[str, Any]:
    """Return the case's own inputs in a planning `state`, without the installation's facts.

    A pack whose methods validate the state against its input schema (which forbids unknown
    fields) validates this instead.
    """
    return {key: value for key, value in state.items() if key != NO_LLM_PROVIDER}


def has_llm_provider(state: Mapping[str, Any]) -> bool:
    """Tell whether the installation planning for `state` can call an LLM (yes unless told not)."""
    return not state.get(NO_LLM_PROVIDER, False)


@dataclass(frozen=True, slots=True, kw_only=True)
class GoalFindings:
    """What a pack's goal check found: `problems` keep the goal from being reached (none: it is);
    `held` says, in words, what it saw hold in the outputs and the systems."""

    problems: tuple[str, ...] = ()
    held: tuple[str, ...] = ()

    @property
    def reached(self) -> bool:
        """Tell whether the check found nothing that keeps the goal from being reached."""
        return not self.problems


def _no_capabilities(state: StateView) -> tuple[Capability, ...]:
    return ()


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
    demo_port: Callable[[], Any] | None = None
    # Checks the inputs the schema accepted against the pack's data, read through a port:
    # field (as in "invoice_id" or "affected_hosts.1") → messages.
    check_data: DataCheck | None = None
    # Goal-oriented planning for one case: capabilities whose tool inputs carry the case's
    # values (e.g. the invoice number), and the root task's goal facts chosen from the state.
    capabilities: Callable[[StateView], tuple[Capability, ...]] = _no_capabilities
    goal_facts: Callable[[StateView], frozenset[str]] | None = None
    # The `llm` agent whose model and system prompt (as admins set them) plan this pack's cases
    # with the LLM; without one, or while it is disabled, the environment's model and prompt.
    planner_agent: str = ""
    # Goal-level verification once every leaf of a case ended: the outputs by leaf key and the
    # pack's port (the systems as the last step left them; None without one) → the problems
    # found (none: the goal is reached).
    goal_check: GoalCheck | None = None
    # Values the case form offers for inputs, read through the port (the systems as they are):
    # field → {value: what it is}, e.g. {"account_id": {"ACC-300": "two large payments …"}}.
    suggest_inputs: InputSuggestions | None = None

    def input_suggestions(self, port: Any | None) -> Mapping[str, Mapping[str, str]]:
        """Return the values to offer for the case inputs, by field (none without a port)."""
        if self.suggest_inputs is None or port is None:
            return MappingProxyType({})
        return self.suggest_inputs(port)

    def initial_state(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Validate case `inputs` against the schema and return the planning state.

        Raises `pydantic.ValidationError` when the inputs do not fit `input_schema`.
        """
        return self.input_schema.model_validate(dict(inputs)).model_dump(mode="json")

    def check_inputs(self, inputs: Mapping[str, Any], port: Any | None) -> dict[str, list[str]]:
        """Return every problem of case `inputs` at once, by path ("inputs.invoice_id").

        First the schema's; then the pack's `check_data` through `port` on the fields the
        schema accepted (none without a port). Raises nothing for bad inputs: it reports them.
        """
        try:
            model = self.input_schema.model_validate(dict(inputs))
        except ValidationError as exc:
            problems = flatten_errors(exc.errors(), "inputs")
            accepted = {
                name: inputs[name]
                for name in self.input_schema.model_fields
                if name in inputs and not _has_problem(problems, f"inputs.{name}")
            }
        else:
            problems = {}
            accepted = dict(model)
        if self.check_data is not None and port is not None and "inputs" not in problems:
            for path, messages in self.check_data(MappingProxyType(accepted), port).items():
                problems.setdefault(f"inputs.{path}", []).extend(messages)
        return problems

    def capabilities_for(self, state: StateView) -> tuple[Capability, ...]:
        """Return the goal-oriented capabilities available for a case in `state`."""
        return self.capabilities(state)

    def goal_facts_for(self, state: StateView) -> Mapping[str, frozenset[str]]:
        """Return the goal facts by task name for a case in `state` (none without `goal_facts`)."""
        if self.goal_facts is None:
            return MappingProxyType({})
        return MappingProxyType({self.root_task: self.goal_facts(state)})

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
