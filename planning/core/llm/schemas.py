"""The decomposition answers the model is asked for (DESIGN §3), and how one is checked.

An answer is ``{"steps": [...]}``; a step is an agent assignment
``{"id", "agent", "task", "rationale", "depends_on"}`` or, below the last level, a nested entry
``{"id", "subtask", "description", "depends_on"}`` that is decomposed again one level deeper.
``depends_on`` names earlier steps of the same answer: ``null`` means "after the previous step",
``[]`` means independent. A bare JSON list of steps is accepted too. When the request offers the
domain pack's actions, an agent assignment also carries ``"action"``: the id of one of them, or
``null``; a step that names an action becomes that action's leaf (its own agent, tool and inputs),
so the ``agent`` it wrote is not checked.

`answer_schema` builds the JSON schema sent with each request from what that request offers, so
that grammar-based decoding can enforce it: an ``enum`` of the offered agents (and of the offered
actions, a property that is absent when none are offered), between 1 and the
fan-out limit of steps, bounded strings, and at the last level no subtask entries at all. It
keeps to the subset that OpenAI's strict mode, llama.cpp's JSON-schema-to-grammar converter (and
so Ollama) and vLLM's guided decoding all accept; `portability_problems` checks a schema against
that subset. `read_answer` checks an answer entry by entry against the same rules (the level's
entry kinds, the agents, the fan-out, the string bounds), so that a repair request can quote
every problem and what still fails after the repairs can be dropped without losing the valid
entries; it is the check, whatever the server enforced.

Mistakes in the ids and references of an entry do not cost the entry: they are fixed where they
are read and noted (`Entry.fixes`), quoted in a repair request sent for other problems, and
become warnings on the plan. A ``depends_on`` id that names no step, a later step or the step
itself is dropped (an entry left with none of the ids it named waits for the previous entry); a
reused id is renamed ``<id>-2`` (``-3``…), and a later ``depends_on`` naming the reused id
means the nearest entry before it that carried it, as static methods' repeated keys do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
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
from planning.core.llm.structured_output import format_problems

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
    "answer_schema",
    "dependencies",
    "portability_problems",
    "read_answer",
    "require_clean",
]

STEP_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
# Bounds of the free-text fields: they keep one answer of the fan-out limit's steps well inside
# one call's token ceiling, and grammar-based decoding enforces them while the model writes.
MAX_TASK_CHARS = 300
MAX_RATIONALE_CHARS = 300
MAX_SUBTASK_CHARS = 120
MAX_DESCRIPTION_CHARS = 500

_ID_DESCRIPTION = "short unique id of this step: letters, digits, '-' or '_' (no dots or spaces)"
_ACTION_DESCRIPTION = (
    "the id of one of the available actions when this step is that action, else null"
)
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
    task: str = Field(
        max_length=MAX_TASK_CHARS, description="what the agent must do, as one concrete action"
    )
    rationale: str = Field(
        max_length=MAX_RATIONALE_CHARS, description="why this agent and this step"
    )
    depends_on: list[str] | None = Field(default=None, description=_DEPENDS_DESCRIPTION)
    action: str | None = Field(default=None, description=_ACTION_DESCRIPTION)

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
    subtask: str = Field(max_length=MAX_SUBTASK_CHARS, description="short name of the sub-plan")
    description: str = Field(
        max_length=MAX_DESCRIPTION_CHARS, description="what the sub-plan must achieve"
    )
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


# -- the schema sent with each request ----------------------------------------------------------


def _string(description: str, *, max_length: int, min_length: int = 0) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "description": description}
    if min_length:
        schema["minLength"] = min_length
    schema["maxLength"] = max_length
    return schema


def _closed(properties: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(properties),
        "additionalProperties": False,
    }


def answer_schema(rules: AnswerRules) -> dict[str, Any]:
    """Return the JSON schema of an answer to a request with these rules.

    Raises ValueError when no agent is offered (an ``enum`` needs at least one value).
    """
    if not rules.agents:
        raise ValueError("an answer schema needs at least one agent to offer")
    step_id = {"type": "string", "pattern": STEP_ID_PATTERN, "description": _ID_DESCRIPTION}
    depends_on = {
        "anyOf": [
            {
                "type": "array",
                "items": {"type": "string", "pattern": STEP_ID_PATTERN},
                "maxItems": rules.max_steps,
            },
            {"type": "null"},
        ],
        "description": _DEPENDS_DESCRIPTION,
    }
    agent_step = _closed(
        {
            "id": step_id,
            "agent": {
                "type": "string",
                "enum": sorted(rules.agents),
                "description": "the id of one of the available agents",
            },
            "task": _string(
                "what the agent must do, as one concrete action",
                min_length=1,
                max_length=MAX_TASK_CHARS,
            ),
            "rationale": _string("why this agent and this step", max_length=MAX_RATIONALE_CHARS),
            "depends_on": depends_on,
        }
    )
    if rules.actions:
        # nullable but required (strict mode wants every property required), and right after
        # the id: a model that picks an action first writes the rest of the step to match it
        properties = dict(agent_step["properties"])
        agent_step = _closed(
            {
                "id": properties.pop("id"),
                "action": {
                    "anyOf": [
                        {"type": "string", "enum": sorted(rules.actions)},
                        {"type": "null"},
                    ],
                    "description": _ACTION_DESCRIPTION,
                },
                **properties,
            }
        )
    item: dict[str, Any] = agent_step
    if not rules.is_last_level:
        subtask_step = _closed(
            {
                "id": step_id,
                "subtask": _string(
                    "short name of the sub-plan", min_length=1, max_length=MAX_SUBTASK_CHARS
                ),
                "description": _string(
                    "what the sub-plan must achieve", max_length=MAX_DESCRIPTION_CHARS
                ),
                "depends_on": depends_on,
            }
        )
        item = {"anyOf": [agent_step, subtask_step]}
    return _closed(
        {
            "steps": {
                "type": "array",
                "items": item,
                "minItems": 1,
                "maxItems": rules.max_steps,
                "description": "the steps, in execution order",
            }
        }
    )


# -- the portable subset ---------------------------------------------------------------------------

# Keywords every target accepts and enforces: OpenAI strict mode (which also wants every object
# closed and every property required, and no anyOf at the root), llama.cpp's converter (which
# Ollama uses), and vLLM's guided decoding (xgrammar, falling back to outlines or guidance).
_PORTABLE_KEYWORDS = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "anyOf",
        "enum",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
    }
)
_PORTABLE_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})
# A pattern as simple as the converters handle: anchored, literals, classes, {m,n} repetition;
# no groups (so no lookaround or backreferences), no alternation, no escapes beyond \- and \.
_PORTABLE_PATTERN = re.compile(
    r"\^(?:[A-Za-z0-9_ -]|\\[.-]|\[[^\]\\]*\]|\{\d+(?:,\d+)?\}|[*+?])*\$"
)
_MAX_NESTING = 10  # OpenAI strict mode's limit of nesting levels
_MAX_ENUM_VALUES = 500
_MAX_PROPERTIES = 100


def portability_problems(schema: Mapping[str, Any]) -> list[str]:
    """Return why a schema falls outside the portable subset (empty when it is inside)."""
    problems: list[str] = []
    counts = {"properties": 0}
    if schema.get("type") != "object" or "anyOf" in schema:
        problems.append("$: the root must be an object schema, not a union")
    _check_portable(schema, "$", 1, problems, counts)
    if counts["properties"] > _MAX_PROPERTIES:
        problems.append(f"$: {counts['properties']} properties; at most {_MAX_PROPERTIES}")
    return problems


def _check_portable(
    node: Any, path: str, depth: int, problems: list[str], counts: dict[str, int]
) -> None:
    if not isinstance(node, Mapping):
        problems.append(f"{path}: a schema must be an object")
        return
    if depth > _MAX_NESTING:
        problems.append(f"{path}: nested deeper than {_MAX_NESTING} levels")
    for key in node:
        if key not in _PORTABLE_KEYWORDS:
            problems.append(f"{path}: keyword {key!r} is outside the portable subset")
    kind = node.get("type")
    if kind is not None and (not isinstance(kind, str) or kind not in _PORTABLE_TYPES):
        problems.append(f"{path}: type must be one of {sorted(_PORTABLE_TYPES)}, not {kind!r}")
    if kind is None and "anyOf" not in node and "enum" not in node:
        problems.append(f"{path}: a schema needs a type, an enum or an anyOf")
    if "anyOf" in node:
        options = node["anyOf"]
        if not isinstance(options, list) or not options:
            problems.append(f"{path}.anyOf: must be a non-empty list")
        else:
            for i, option in enumerate(options):
                _check_portable(option, f"{path}.anyOf[{i}]", depth + 1, problems, counts)
    if kind == "object":
        properties = node.get("properties")
        if not isinstance(properties, Mapping):
            problems.append(f"{path}: an object must list its properties")
            properties = {}
        counts["properties"] += len(properties)
        if node.get("additionalProperties") is not False:
            problems.append(f"{path}: an object must set additionalProperties to false")
        if list(node.get("required", ())) != list(properties):
            problems.append(f"{path}: every property must be required, in order")
        for name, sub in properties.items():
            _check_portable(sub, f"{path}.{name}", depth + 1, problems, counts)
    elif "properties" in node or "required" in node or "additionalProperties" in node:
        problems.append(f"{path}: object keywords on a schema of type {kind!r}")
    if kind == "array":
        if "items" not in node:
            problems.append(f"{path}: an array must give its items")
        else:
            _check_portable(node["items"], f"{path}.items", depth + 1, problems, counts)
        low, high = node.get("minItems", 0), node.get("maxItems")
        if high is not None and not (isinstance(high, int) and high >= max(1, low)):
            problems.append(f"{path}: maxItems must be an integer >= max(1, minItems)")
    elif {"items", "minItems", "maxItems"} & set(node):
        problems.append(f"{path}: array keywords on a schema of type {kind!r}")
    if kind == "string":
        pattern = node.get("pattern")
        if pattern is not None:
            if not isinstance(pattern, str) or not _PORTABLE_PATTERN.fullmatch(pattern):
                problems.append(
                    f"{path}: pattern {pattern!r} is not anchored or uses regex features "
                    "a grammar converter rejects"
                )
            if "minLength" in node or "maxLength" in node:
                # llama.cpp and vLLM ignore length bounds next to a pattern
                problems.append(f"{path}: bound the length in the pattern, not beside it")
        if "maxLength" in node and not isinstance(node["maxLength"], int):
            problems.append(f"{path}: maxLength must be an integer")
    elif {"pattern", "minLength", "maxLength"} & set(node):
        problems.append(f"{path}: string keywords on a schema of type {kind!r}")
    if "enum" in node:
        values = node["enum"]
        if not isinstance(values, list) or not values:
            problems.append(f"{path}.enum: must be a non-empty list")
        elif len(values) > _MAX_ENUM_VALUES:
            problems.append(f"{path}.enum: {len(values)} values; at most {_MAX_ENUM_VALUES}")
        elif not all(isinstance(v, str) for v in values) or kind != "string":
            problems.append(f"{path}.enum: only string enums of type string are portable")
        elif len(set(values)) != len(values):
            problems.append(f"{path}.enum: values must be unique")


_ANY_STEP: TypeAdapter[Step] = TypeAdapter(_AnyStep)
_AGENT_STEP: TypeAdapter[AgentStep] = TypeAdapter(AgentStep)


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerRules:
    """What one request offered: the agents, the entry kinds of its level, the fan-out, and the
    domain pack's actions (none without a pack)."""

    agents: frozenset[str]
    max_steps: int
    is_last_level: bool
    max_depth: int
    actions: frozenset[str] = frozenset()


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
    fixes: tuple[tuple[str, str], ...] = ()

    @property
    def is_usable(self) -> bool:
        """Tell whether the entry validated and broke no rule (fixed references aside)."""
        return self.step is not None and not self.problems

    def describe(self) -> str:
        """Return a short name for warnings: the id and the task or subtask."""
        name = repr(self.step_id) if self.step_id else f"#{self.position + 1}"
        return f"{name} ({self.label!r})" if self.label else name

    def describe_problems(self) -> str:
        """Return the entry's problems for a warning, each with its field."""
        return self._describe(self.problems)

    def describe_fixes(self) -> tuple[str, ...]:
        """Return what was fixed in the entry's id and references, one text per fix."""
        return tuple(self._describe((fix,)) for fix in self.fixes)

    def _describe(self, items: Sequence[tuple[str, str]]) -> str:
        own = f"steps.{self.position}"
        return "; ".join(
            message if path == own else f"{path.removeprefix(own + '.')}: {message}"
            for path, message in items
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
        """Tell whether the answer can be used whole (its fixed references aside)."""
        return not self.problems and all(entry.is_usable for entry in self.entries)

    @property
    def fixed(self) -> tuple[Entry, ...]:
        """Return the usable entries whose id or references were fixed, in order."""
        return tuple(entry for entry in self.usable if entry.fixes)

    def report(self) -> str:
        """Return every problem, one per line, for a repair request and the call record.

        The fixed references of the entries are listed too: a repair is the model's chance to
        name what it meant.
        """
        problems: dict[str, list[str]] = {}
        for path, message in (
            *self.problems,
            *(p for e in self.entries for p in (*e.problems, *e.fixes)),
        ):
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
    taken = set(every_id)
    earlier: dict[str, int] = {}  # id as written -> position of its nearest entry so far
    entries: list[Entry] = []
    for position, raw in enumerate(raw_steps):
        path = f"steps.{position}"
        problems: list[tuple[str, str]] = []
        fixes: list[tuple[str, str]] = []
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
        written = step.id if step is not None else _text(raw, "id")
        step_id = written
        if isinstance(step, AgentStep) and step.action is not None:
            # the action brings its own agent: the one written is not used
            if step.action not in rules.actions:
                offered = ", ".join(sorted(rules.actions)) or "none are offered: use null"
                problems.append(
                    (
                        f"{path}.action",
                        f"{step.action!r} is not one of the available actions ({offered})",
                    )
                )
        elif isinstance(step, AgentStep) and step.agent not in rules.agents:
            problems.append(
                (
                    f"{path}.agent",
                    f"{step.agent!r} is not one of the available agents "
                    f"({', '.join(sorted(rules.agents))})",
                )
            )
        if step is not None and step.id in earlier:
            step_id = _free_id(step.id, taken)
            taken.add(step_id)
            fixes.append(
                (
                    f"{path}.id",
                    f"step id {step.id!r} is used twice; ids must be unique (renamed {step_id!r})",
                )
            )
            step = step.model_copy(update={"id": step_id})
        who = repr(step_id) if step_id else f"#{position + 1}"
        declared = _declared(raw, step)
        positions: list[int] = []
        for dep in declared or ():
            if dep in earlier:
                positions.append(earlier[dep])
            elif dep == written:
                fixes.append(
                    (
                        f"{path}.depends_on",
                        f"step {dep!r} cannot depend on itself (dropped from depends_on)",
                    )
                )
            elif dep in every_id:
                fixes.append(
                    (
                        f"{path}.depends_on",
                        f"step {who} depends on {dep!r}, which has not appeared earlier "
                        "(depends_on may only name steps listed before it; dropped from "
                        "depends_on)",
                    )
                )
            else:
                fixes.append(
                    (
                        f"{path}.depends_on",
                        f"step {who} depends on {dep!r}, which is not the id of any step "
                        "(dropped from depends_on)",
                    )
                )
        if declared and not positions and fixes:
            # it meant to wait for something: "after the previous step" is the safe reading
            where, message = fixes[-1]
            then = "it now runs after the previous step" if position else "it starts first"
            fixes[-1] = (where, f"{message}; {then}")
        if written is not None:
            earlier[written] = position
        label = step.task if isinstance(step, AgentStep) else step.subtask if step else ""
        entries.append(
            Entry(
                position=position,
                step=step,
                step_id=step_id,
                label=label or _text(raw, "task") or _text(raw, "subtask") or "",
                depends_on=(
                    None
                    if declared is None or (declared and not positions)
                    # the same entry named twice is one dependency
                    else tuple(dict.fromkeys(positions))
                ),
                problems=tuple(problems),
                fixes=tuple(fixes),
            )
        )
    return Answer(entries=tuple(entries), problems=tuple(answer_problems))


def _free_id(step_id: str, taken: AbstractSet[str]) -> str:
    n = 2
    while True:
        suffix = f"-{n}"
        # ids are at most 64 characters (STEP_ID_PATTERN)
        candidate = step_id[: 64 - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
        n += 1


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
