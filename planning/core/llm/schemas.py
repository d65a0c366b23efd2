"""The decomposition answers the model is asked for (DESIGN §3), and how one is checked.

An answer is ``{"steps": [...]}``; a step is an agent assignment
``{"id", "agent", "task", "rationale", "depends_on"}`` or, below the last level, a nested entry
``{"id", "subtask", "description", "depends_on"}`` that is decomposed again one level deeper.
``depends_on`` names earlier steps of the same answer: ``null`` means "after the previous step",
``[]`` means independent. A bare JSON list of steps is accepted too.

The pydantic models give the JSON schemas sent with each request. `read_answer` checks an answer
entry by entry against what was offered (the level's entry kinds, the agents, the fan-out, earlier
siblings only), so that a repair request can quote every problem and what still fails after the
repairs can be dropped without losing the valid entries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from planning.core.errors import flatten_errors
from planning.core.llm.client import format_problems

__all__ = [
    "STEP_ID_PATTERN",
    "AgentPlanResponse",
    "AgentStep",
    "Answer",
    "AnswerInvalid",
    "AnswerRules",
    "Entry",
    "NestedPlanResponse",
    "Step",
    "SubtaskStep",
    "dependencies",
    "read_answer",
    "require_clean",
]

STEP_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"

_ID_DESCRIPTION = "short unique id of this step: letters, digits, '-' or '_' (no dots or spaces)"
_DEPENDS_DESCRIPTION = (
    "ids of EARLIER steps this step waits for; null = after the previous step; [] = independent"
)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value.strip()


class AgentStep(BaseModel):
    """One executable step assigned to one agent."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=STEP_ID_PATTERN, description=_ID_DESCRIPTION)
    agent: str = Field(description="the id of one of the available agents")
    task: str = Field(description="what the agent must do, as one concrete action")
    rationale: str = Field(description="why this agent and this step")
    depends_on: list[str] | None = Field(default=None, description=_DEPENDS_DESCRIPTION)

    _agent = field_validator("agent", "task")(_not_blank)

    @model_validator(mode="before")
    @classmethod
    def _rationale_may_be_missing(cls, data: Any) -> Any:
        # the schema asks for a rationale; an answer without one is still a usable step
        if isinstance(data, dict) and data.get("rationale") is None:
            return {**data, "rationale": ""}
        return data


class SubtaskStep(BaseModel):
    """A step too large for one agent action, decomposed again one level deeper."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=STEP_ID_PATTERN, description=_ID_DESCRIPTION)
    subtask: str = Field(description="short name of the sub-plan")
    description: str = Field(description="what the sub-plan must achieve")
    depends_on: list[str] | None = Field(default=None, description=_DEPENDS_DESCRIPTION)

    _subtask = field_validator("subtask")(_not_blank)


def _step_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "subtask" if "subtask" in value else "agent"
    return "subtask" if isinstance(value, SubtaskStep) else "agent"


type Step = AgentStep | SubtaskStep
# a plain alias, not a `type` statement: that would add a named definition to the schema sent
_AnyStep = Annotated[
    Annotated[AgentStep, Tag("agent")] | Annotated[SubtaskStep, Tag("subtask")],
    Discriminator(_step_kind),
]


class NestedPlanResponse(BaseModel):
    """An answer whose steps may be agent assignments or nested entries."""

    model_config = ConfigDict(extra="forbid")

    steps: list[_AnyStep] = Field(description="the steps, in execution order")


class AgentPlanResponse(BaseModel):
    """An answer made of agent assignments only (the last level)."""

    model_config = ConfigDict(extra="forbid")

    steps: list[AgentStep] = Field(description="the steps, in execution order")


_ANY_STEP: TypeAdapter[Step] = TypeAdapter(_AnyStep)
_AGENT_STEP: TypeAdapter[AgentStep] = TypeAdapter(AgentStep)


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerRules:
    """What one request offered: the agents, the entry kinds of its level, the fan-out."""

    agents: frozenset[str]
    max_steps: int
    is_last_level: bool
    max_depth: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Entry:
    """One entry of an answer: the step when it validated, and what is wrong with it.

    `depends_on` holds the positions of the earlier entries it names (None: after the previous
    entry), also for an entry that failed, so that its dependents can wait for what it waited for.
    """

    position: int
    step: Step | None
    step_id: str | None
    label: str
    depends_on: tuple[int, ...] | None
    problems: tuple[tuple[str, str], ...] = ()

    @property
    def is_usable(self) -> bool:
        """Tell whether the entry validated and broke no rule."""
        return self.step is not None and not self.problems

    def describe(self) -> str:
        """Return a short name for warnings: the id and the task or subtask."""
        name = repr(self.step_id) if self.step_id else f"#{self.position + 1}"
        return f"{name} ({self.label!r})" if self.label else name

    def describe_problems(self) -> str:
        """Return the entry's problems for a warning, each with its field."""
        own = f"steps.{self.position}"
        return "; ".join(
            message if path == own else f"{path.removeprefix(own + '.')}: {message}"
            for path, message in self.problems
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """An answer read entry by entry, with the problems of the answer as a whole."""

    entries: tuple[Entry, ...]
    problems: tuple[tuple[str, str], ...] = ()

    @property
    def usable(self) -> tuple[Entry, ...]:
        """Return the entries that validated and broke no rule, in order."""
        return tuple(entry for entry in self.entries if entry.is_usable)

    @property
    def is_clean(self) -> bool:
        """Tell whether nothing at all is wrong with the answer."""
        return not self.problems and all(entry.is_usable for entry in self.entries)

    def report(self) -> str:
        """Return every problem, one per line, for a repair request and the call record."""
        problems: dict[str, list[str]] = {}
        for path, message in (*self.problems, *(p for e in self.entries for p in e.problems)):
            problems.setdefault(path, []).append(message)
        return format_problems(problems)


class AnswerInvalid(ValueError):
    """An answer broke a rule; `answer` holds what was read of it."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        super().__init__(answer.report())


def _steps_of(data: Any) -> tuple[list[Any], list[tuple[str, str]]]:
    if isinstance(data, list):
        return data, []
    if isinstance(data, dict) and isinstance(data.get("steps"), list):
        extra = [(str(key), "Extra inputs are not permitted") for key in data if key != "steps"]
        return data["steps"], extra
    raise ValueError('the answer must be a JSON object {"steps": [...]} with a list of steps')


def _text(raw: Any, key: str) -> str | None:
    value = raw.get(key) if isinstance(raw, dict) else None
    return value if isinstance(value, str) else None


def _declared(raw: Any, step: Step | None) -> list[str] | None:
    if step is not None:
        return step.depends_on
    value = raw.get("depends_on") if isinstance(raw, dict) else None
    if isinstance(value, list) and all(isinstance(dep, str) for dep in value):
        return value
    return None


def read_answer(data: Any, rules: AnswerRules) -> Answer:
    """Check every entry of a decoded answer against the rules of its request.

    Raises ValueError when the answer is not a list of steps at all.
    """
    raw_steps, answer_problems = _steps_of(data)
    if not raw_steps:
        answer_problems.append(("steps", "the answer has no steps; at least one is needed"))
    elif len(raw_steps) > rules.max_steps:
        answer_problems.append(
            (
                "steps",
                f"the answer has {len(raw_steps)} steps; at most {rules.max_steps} are allowed: "
                "merge steps or leave out the least important ones",
            )
        )
    every_id = {step_id for raw in raw_steps if (step_id := _text(raw, "id")) is not None}
    earlier: dict[str, int] = {}  # id -> position of its first entry
    entries: list[Entry] = []
    for position, raw in enumerate(raw_steps):
        path = f"steps.{position}"
        problems: list[tuple[str, str]] = []
        step: Step | None = None
        if rules.is_last_level and isinstance(raw, dict) and "subtask" in raw:
            problems.append(
                (
                    path,
                    "is a subtask, but this level is the depth ceiling "
                    f"(max_depth={rules.max_depth}): every step must be an agent assignment "
                    "with an agent and one concrete task",
                )
            )
        else:
            try:
                step = (_AGENT_STEP if rules.is_last_level else _ANY_STEP).validate_python(raw)
            except ValidationError as exc:
                for where, messages in flatten_errors(
                    exc.errors(include_url=False, include_input=False), path
                ).items():
                    problems.extend((where, message) for message in messages)
        step_id = step.id if step is not None else _text(raw, "id")
        who = repr(step_id) if step_id else f"#{position + 1}"
        if isinstance(step, AgentStep) and step.agent not in rules.agents:
            problems.append(
                (
                    f"{path}.agent",
                    f"{step.agent!r} is not one of the available agents "
                    f"({', '.join(sorted(rules.agents))})",
                )
            )
        if step is not None and step.id in earlier:
            problems.append(
                (f"{path}.id", f"step id {step.id!r} is used twice; ids must be unique")
            )
        declared = _declared(raw, step)
        positions: list[int] = []
        for dep in declared or ():
            if dep == step_id:
                problems.append((f"{path}.depends_on", f"step {dep!r} cannot depend on itself"))
            elif dep in earlier:
                positions.append(earlier[dep])
            elif dep in every_id:
                problems.append(
                    (
                        f"{path}.depends_on",
                        f"step {who} depends on {dep!r}, which has not appeared earlier "
                        "(depends_on may only name steps listed before it)",
                    )
                )
            else:
                problems.append(
                    (
                        f"{path}.depends_on",
                        f"step {who} depends on {dep!r}, which is not the id of any step",
                    )
                )
        if step_id is not None and step_id not in earlier:
            earlier[step_id] = position
        label = step.task if isinstance(step, AgentStep) else step.subtask if step else ""
        entries.append(
            Entry(
                position=position,
                step=step,
                step_id=step_id,
                label=label or _text(raw, "task") or _text(raw, "subtask") or "",
                depends_on=None if declared is None else tuple(dict.fromkeys(positions)),
                problems=tuple(problems),
            )
        )
    return Answer(entries=tuple(entries), problems=tuple(answer_problems))


def require_clean(answer: Answer) -> Answer:
    """Return the answer when nothing is wrong with it; raise AnswerInvalid otherwise."""
    if not answer.is_clean:
        raise AnswerInvalid(answer)
    return answer


def dependencies(entries: Sequence[Entry]) -> Mapping[int, tuple[int, ...] | None]:
    """Return the dependencies of each usable entry by position, passing through dropped ones.

    When every entry is usable the declared dependencies are kept (None: after the previous
    entry); otherwise each is explicit, and an entry that waited for a dropped one waits for what
    the dropped one waited for.
    """
    kept = {entry.position for entry in entries if entry.is_usable}
    if len(kept) == len(entries):
        return {entry.position: entry.depends_on for entry in entries}
    explicit = {
        entry.position: (
            ((entry.position - 1,) if entry.position else ())
            if entry.depends_on is None
            else entry.depends_on
        )
        for entry in entries
    }
    memo: dict[int, tuple[int, ...]] = {}

    def through(position: int) -> tuple[int, ...]:
        if position in kept:
            return (position,)
        if position not in memo:
            # explicit dependencies name earlier entries only, so this recursion ends
            memo[position] = tuple(
                dict.fromkeys(p for dep in explicit[position] for p in through(dep))
            )
        return memo[position]

    return {
        position: tuple(dict.fromkeys(p for dep in explicit[position] for p in through(dep)))
        for position in sorted(kept)
    }
