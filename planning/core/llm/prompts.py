"""The messages of a recursive decomposition request (DESIGN §3).

Two system prompt variants: above the last level the model may return nested entries that are
decomposed again; at the last level the prompt describes agent assignments only and never
mentions the nested format. A planner agent's own instructions take the place of the built-in
opening; the answer format and the rules always follow. The user prompt carries the parent goal,
the sibling tasks, the goal and its description, the agents (id, name, description,
capabilities), the domain pack's actions for the case when there are any (id, task, agent,
tool, and the actions whose output it uses), an example decomposition from the domain pack's own
methods when there is one (one JSON object per step: ids, texts, depends_on; no agents), and the
rendered state. With actions, the system prompt's agent assignment carries ``"action"``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from planning.core.goal import Capability
from planning.core.llm.examples import DecompositionExample
from planning.core.refs import referenced_keys
from planning.core.tree import Goal

__all__ = [
    "AgentInfo",
    "answer_excerpt",
    "render_action",
    "render_example",
    "render_state",
    "repair_prompt",
    "system_prompt",
    "user_prompt",
]

MAX_STATE_CHARS = 12_000
# A repair request quotes this much of the rejected answer and of the problems found in it, so
# that it fits the context window of a small local model however long the bad answer was.
MAX_EXCERPT_CHARS = 1_000
MAX_PROBLEM_CHARS = 2_000


class AgentInfo(Protocol):
    """What the planner tells the model about an agent (``AgentSpec`` satisfies it)."""

    @property
    def slug(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def capabilities(self) -> Sequence[str]: ...

    @property
    def kind(self) -> str: ...


_ROLE = """\
You are the planning component of CaseHub, where human reviewers approve agent plans before \
anything runs."""

_TASK = """\
Decompose the goal in the request into a short, ordered list of steps.

Answer with JSON only: an object {"steps": [...]} that matches the response schema."""

_AGENT_FORMAT = """\
{"id": "review-data", "agent": "<agent id>", "task": "<one concrete action>", \
"rationale": "<why this agent>", "depends_on": null}"""

_ACTION_FORMAT = """\
{"id": "review-data", "action": null, "agent": "<agent id>", "task": "<one concrete action>", \
"rationale": "<why this agent>", "depends_on": null}"""

_ACTION_RULE = """\
- "action": when a step is one of the available actions, its id (the step then runs that \
action's own agent and tool, whatever "agent" says); otherwise null. Put an action after the \
actions whose output it uses."""

_NESTED_FORMAT = """\
{"id": "prepare-report", "subtask": "<short name>", "description": "<what it must achieve>", \
"depends_on": null}"""

_RULES = """\
- Use only the agents listed in the request, by their id.
- Ids are short and unique within your answer: letters, digits, "-" and "_" only.
- depends_on lists the ids of EARLIER steps that must finish first; null means "after the \
previous step"; [] means the step can start at once. Steps that do not need each other's output \
should not depend on each other, so they can run in parallel.
- At most {max_steps} steps.
- Do not decide which steps need human approval; the server decides that."""


def system_prompt(
    *, is_last_level: bool, max_steps: int, instructions: str = "", has_actions: bool = False
) -> str:
    """Return the system prompt; the last-level variant offers agent assignments only.

    `instructions` (a planner agent's system prompt) replaces the built-in opening; the answer
    format and the rules follow it unchanged. `has_actions`: the request lists the domain pack's
    actions, so an agent assignment carries ``"action"`` and the rules say how to use it.
    """
    preamble = f"{instructions.strip()}\n\n{_TASK}" if instructions.strip() else f"{_ROLE} {_TASK}"
    rules = _RULES.replace("{max_steps}", str(max_steps))
    agent_format = _AGENT_FORMAT
    if has_actions:
        agent_format = _ACTION_FORMAT
        rules = f"{rules}\n{_ACTION_RULE}"
    if is_last_level:
        return (
            f"{preamble}\n\nEvery step is an agent assignment, for work one agent does as a "
            f"single action:\n{agent_format}\n\nRules:\n{rules}"
        )
    return (
        f"{preamble}\n\nEach step is one of two kinds.\n"
        f"1. An agent assignment, for work one agent does as a single action:\n{agent_format}\n"
        "2. A subtask, for a part that is itself a plan of several actions; it is decomposed "
        f"again separately, with this plan as its context:\n{_NESTED_FORMAT}\n\n"
        f"Rules:\n{rules}\n"
        "- Use a subtask only when a part genuinely needs several agent actions; prefer agent "
        "assignments."
    )


def _jsonable(value: Any) -> Any:
    # the state is frozen: read-only mappings and sets are what `json` cannot serialise
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return str(value)


def render_state(state: Mapping[str, Any]) -> str:
    """Render the planning state as stable, indented JSON (truncated when very large)."""
    text = json.dumps(state, sort_keys=True, indent=2, default=_jsonable, ensure_ascii=False)
    if len(text) > MAX_STATE_CHARS:
        return text[:MAX_STATE_CHARS] + "\n... (state truncated)"
    return text


def _render_agent(agent: AgentInfo) -> str:
    line = f"- {agent.slug}: {agent.name}"
    if agent.description:
        line += f". {agent.description}"
    capabilities = ", ".join(agent.capabilities)
    return line + (f" (capabilities: {capabilities})" if capabilities else "")


def render_action(action: Capability) -> str:
    """Render one of the pack's actions on one line: id, task, agent, tool, what it uses."""
    line = f"- {action.name}: {action.task} (agent {action.agent}"
    if action.tool:
        line += f", tool {action.tool}"
    uses = referenced_keys(action.tool_inputs)
    if uses:
        line += f"; uses the output of {', '.join(uses)}"
    return line + ")"


def render_example(example: DecompositionExample, *, is_last_level: bool) -> str:
    """Render an example decomposition: a heading, then one JSON object per step.

    JSON keeps a task text that carries case data (a service name) quoted. At the last level a
    subtask of the example is shown as one step, as the model must answer there.
    """
    whose = "this case" if example.is_for_this_case else "another kind of case"
    lines = [
        f"Example: how this domain's own method {example.method!r} decomposes "
        f"{example.task!r} for {whose}. A guide to the size and order of steps, not the "
        "answer: write your own steps for the goal above, with the agents listed above.",
    ]
    for step in example.steps:
        entry: dict[str, Any] = {"id": step.id}
        if step.is_subtask and not is_last_level:
            entry["subtask"] = step.text
            entry["description"] = step.description
        else:
            entry["task"] = step.description or step.text if step.is_subtask else step.text
        entry["depends_on"] = None if step.depends_on is None else list(step.depends_on)
        lines.append(json.dumps(entry, ensure_ascii=False))
    return "\n".join(lines)


def user_prompt(
    goal: Goal,
    agents: Sequence[AgentInfo],
    state: Mapping[str, Any],
    *,
    hint: str = "",
    example: str = "",
    actions: Sequence[Capability] = (),
    size: str = "",
) -> str:
    """Return the planning request for ``goal`` with its context (`example` already rendered).

    `actions` are the domain pack's leaves for the case that a step may name; `size` says how
    many steps the plan (or this part of it) may still have.
    """
    parent = goal.parent or "(none: this is the top-level goal)"
    siblings = "; ".join(goal.siblings) if goal.siblings else "(none)"
    lines = [
        f"Parent goal: {parent}",
        f"Sibling tasks: {siblings}",
        f"Goal: {goal.name}",
        f"Description: {goal.description or '(none given)'}",
    ]
    if hint:
        lines.append(f"Note: {hint}")
    lines.append("Available agents:")
    lines.extend(_render_agent(agent) for agent in agents)
    if actions:
        lines.append('Available actions (name one in a step\'s "action" to run it as it is):')
        lines.extend(render_action(action) for action in actions)
    if example:
        lines.append(example)
    if goal.parent:
        lines.append(
            "Plan only this part of the parent goal: the sibling tasks are planned separately."
        )
    if size:
        lines.append(size)
    lines.append("Current state (JSON):")
    lines.append(render_state(state))
    return "\n".join(lines)


def _bounded(text: str, limit: int, unit: str) -> str:
    if len(text) <= limit:
        return text
    cut = text[:limit]
    if "\n" in cut and unit == "lines":
        cut = cut[: cut.rindex("\n")]
    omitted = text[len(cut) :]
    more = omitted.count("\n") + 1 if unit == "lines" else len(omitted)
    label = "more problem line(s)" if unit == "lines" else "more characters"
    return f"{cut}\n... ({more} {label} left out)"


def answer_excerpt(text: str, limit: int = MAX_EXCERPT_CHARS) -> str:
    """Return the start of a rejected answer, at most `limit` characters and a note of the rest."""
    return _bounded(text, limit, "characters")


def repair_prompt(
    error: str,
    *,
    truncated: bool = False,
    max_steps: int = 0,
    round_number: int = 1,
    rounds: int = 1,
    is_same_problems: bool = False,
) -> str:
    """Return the follow-up request quoting why the previous answer was rejected.

    The problems are quoted up to MAX_PROBLEM_CHARS. A truncated answer gets a request for a
    shorter one instead of a list of JSON errors. The wording moves on with `round_number` (of
    `rounds`): a later round says the answer is still wrong, says so plainly when the problems
    are the ones already quoted (`is_same_problems`), and that the last round is the last.
    """
    if truncated:
        fewer = f"at most {max_steps} steps, " if max_steps else ""
        return (
            f"Your previous answer was too long: {error}.\n"
            f"Answer again with a shorter plan: {fewer}each task and rationale one short "
            "sentence. Answer with the complete JSON only, following the same schema and rules."
        )
    counter = f"repair request {round_number} of {rounds}" if rounds > 1 else "repair request"
    if round_number <= 1:
        opening = f"Your previous answer could not be used ({counter}):"
    else:
        opening = f"Your answer still could not be used ({counter}):"
    lines = [opening, _bounded(error, MAX_PROBLEM_CHARS, "lines")]
    if round_number > 1 and is_same_problems:
        lines.append(
            "These are the same problems as in your previous answer: do not send it again. "
            "Change each step named above, or leave out a step you cannot fix."
        )
    lines.append("Answer again with the corrected JSON only, following the same schema and rules.")
    if round_number >= rounds:
        lines.append(
            "This is the last request: steps that are still wrong are left out of the plan."
        )
    return "\n".join(lines)
