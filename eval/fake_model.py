"""The deterministic fake model of the evaluation: a keyword planner behind the fake server.

It answers the planner's real requests (through the real `openai` client and the fake
OpenAI-compatible server of the tests) from the request alone, so two runs give the same plans:
it picks the offered agents whose name, description and capabilities share words with the goal,
gives each a task built from its first capability, and orders the steps as a diamond (the first
step, the middle ones after it, the last after all). When the request offers a domain pack's
actions, an action whose id, task and tool share more words with the goal than an agent does
(leaving out the case's own values, such as a service name, which a task and the goal both
repeat)
takes that agent's place: the step names the action (and the first offered agent, which the
action's own replaces); on a tie the agent wins. Above the last level it keeps the first
agent as a step and hands the rest to one subtask. For about one request in three (chosen by a
hash of its goal and description) its first answer names a step id that does not exist
(`depends_on: ["s0"]`), the mistake small models make; a repair request gets the answer without
it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from eval.scoring import words
from tests.fakes.openai_server import RecordedRequest

MODEL_NAME = "fake-model"
_GOAL = re.compile(r"^Goal: (.*)$", re.MULTILINE)
_DESCRIPTION = re.compile(r"^Description: (.*)$", re.MULTILINE)
_AGENT = re.compile(r"^- ([A-Za-z0-9_.-]+): (.*)$", re.MULTILINE)
_CAPABILITIES = re.compile(r"\(capabilities: ([^)]*)\)\s*$")
_ACTION = re.compile(
    r"^- ([A-Za-z0-9_.-]+): (.*) \(agent ([^,;)]+)(?:, tool ([^;)]+))?", re.MULTILINE
)
_ACTIONS_HEADING = "Available actions"
_MAX_STEPS = re.compile(r"At most (\d+) steps")
MOST_AGENTS = 4


@dataclass(frozen=True, slots=True)
class _Agent:
    slug: str
    text: str
    capabilities: tuple[str, ...]

    @property
    def action(self) -> str:
        """Return the agent's first capability as an action ("fraud.analyse" → "analyse fraud")."""
        if not self.capabilities:
            return f"handle as {self.slug}"
        noun, _, verb = self.capabilities[0].partition(".")
        return f"{verb or noun} {noun if verb else ''}".strip().replace("-", " ")


@dataclass(frozen=True, slots=True)
class _Action:
    id: str
    task: str
    tool: str

    @property
    def text(self) -> str:
        """Return the words the action is matched on: its id, task and tool."""
        return f"{self.id} {self.task} {self.tool}".replace("-", " ").replace("_", " ")


def _agents(prompt: str) -> list[_Agent]:
    section = prompt.split("Available agents:", 1)[-1].split("Current state (JSON):", 1)[0]
    section = section.split(_ACTIONS_HEADING, 1)[0]
    agents = []
    for slug, rest in _AGENT.findall(section):
        found = _CAPABILITIES.search(rest)
        capabilities = tuple(c.strip() for c in found.group(1).split(",")) if found else ()
        agents.append(_Agent(slug, f"{slug} {rest}", capabilities))
    return agents


def _actions(prompt: str) -> list[_Action]:
    if _ACTIONS_HEADING not in prompt:
        return []
    section = prompt.split(_ACTIONS_HEADING, 1)[1].split("\n", 1)[-1]
    lines = []
    for line in section.split("\n"):
        if not line.startswith("- "):
            break
        lines.append(line)
    return [
        _Action(action_id, task, tool)
        for action_id, task, _, tool in _ACTION.findall("\n".join(lines))
    ]


def _case_values(prompt: str) -> frozenset[str]:
    """Return the words of the string values of the request's state (none when unreadable)."""
    try:
        state = json.loads(prompt.split("Current state (JSON):", 1)[1])
    except (IndexError, ValueError):
        return frozenset()
    if not isinstance(state, dict):
        return frozenset()
    text = " ".join(str(v) for v in state.values() if isinstance(v, str | list))
    return words(text.replace("-", " "))


def _chosen(
    agents: list[_Agent],
    actions: list[_Action],
    goal_words: frozenset[str],
    case_values: frozenset[str] = frozenset(),
) -> list[_Agent | _Action]:
    # (score, agents before actions on a tie, offer order)
    scored = [
        (len(goal_words & words(a.text.replace(".", " "))), 0, i) for i, a in enumerate(agents)
    ]
    scored += [
        (len((goal_words - case_values) & words(a.text)), 1, i) for i, a in enumerate(actions)
    ]
    relevant = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1], s[2]))
    picked: list[_Agent | _Action] = [
        agents[i] if kind == 0 else actions[i] for _, kind, i in relevant[:MOST_AGENTS]
    ]
    return picked or list(agents[:1])


def _is_flawed(goal: str) -> bool:
    return int(hashlib.sha256(goal.encode()).hexdigest()[:8], 16) % 3 == 0


def _description(prompt: str) -> str:
    """Return the goal's description, every line of it (a pack case's starts with its goal)."""
    found = _DESCRIPTION.search(prompt)
    if found is None:
        return ""
    rest = prompt[found.start(1) :]
    for end in ("\nNote: ", "\nAvailable agents:"):
        rest = rest.split(end, 1)[0]
    return rest.strip()


def respond(request: RecordedRequest) -> str:
    """Return the fake model's answer to one planning request (JSON text)."""
    prompt = request.user_prompt
    goal = _GOAL.search(prompt)
    goal_name = goal.group(1).strip() if goal else "goal"
    description = _description(prompt)
    about = description.removeprefix("(none given)").strip() or goal_name
    limit = _MAX_STEPS.search(request.system_prompt)
    max_steps = int(limit.group(1)) if limit else 5
    nested = "subtask" in request.system_prompt
    is_repair = any(m.get("role") == "assistant" for m in request.messages)
    offered = _agents(prompt)
    actions = _actions(prompt)
    agents = _chosen(
        offered, actions, words(f"{goal_name} {about}".replace("-", " ")), _case_values(prompt)
    )
    agents = agents[:max_steps]
    default = offered[0].slug if offered else ""
    summary = about.split("\n")[0].split(". ")[0][:80]
    steps: list[dict[str, object]] = []
    if nested and len(agents) > 1:
        first, rest = agents[0], agents[1:]
        steps.append(_step("s1", first, summary, [], default))
        steps.append(
            {
                "id": "s2",
                "subtask": f"{goal_name[:40]} follow-up",
                "description": "; ".join(_purpose(a) for a in rest) + f" for: {summary}",
                "depends_on": ["s1"],
            }
        )
    else:
        last = len(agents)
        for n, agent in enumerate(agents, start=1):
            if n == 1:
                deps: list[str] = []
            elif n == last and n > 2:
                deps = [f"s{i}" for i in range(1, n)]
            else:
                deps = ["s1"]
            steps.append(_step(f"s{n}", agent, summary, deps, default))
    if _is_flawed(f"{goal_name}\n{description}") and not is_repair:
        last_deps = steps[-1]["depends_on"]
        assert isinstance(last_deps, list)
        steps[-1]["depends_on"] = [*last_deps, "s0"]
    if actions:
        # the schema of a request that offers actions has the property on every agent step
        for step in steps:
            if "agent" in step:
                step.setdefault("action", None)
    return json.dumps({"steps": steps})


def _purpose(pick: _Agent | _Action) -> str:
    if isinstance(pick, _Action):
        return f"{pick.id}: {pick.task}"
    return f"{pick.slug} to {pick.action}"


def _step(
    step_id: str, pick: _Agent | _Action, summary: str, deps: list[str], default: str
) -> dict[str, object]:
    if isinstance(pick, _Action):
        return {
            "id": step_id,
            "action": pick.id,
            "agent": default,
            "task": f"{pick.task}: {summary}",
            "rationale": f"the domain's own action {pick.id}",
            "depends_on": deps,
        }
    return {
        "id": step_id,
        "agent": pick.slug,
        "task": f"{pick.action.capitalize()}: {summary}",
        "rationale": f"{pick.slug} can {pick.action}",
        "depends_on": deps,
    }
