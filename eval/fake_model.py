"""The deterministic fake model of the evaluation: a keyword planner behind the fake server.

It answers the planner's real requests (through the real `openai` client and the fake
OpenAI-compatible server of the tests) from the request alone, so two runs give the same plans:
it picks the offered agents whose name, description and capabilities share words with the goal,
gives each a task built from its first capability, and orders the steps as a diamond (the first
step, the middle ones after it, the last after all). Above the last level it keeps the first
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


def _agents(prompt: str) -> list[_Agent]:
    section = prompt.split("Available agents:", 1)[-1].split("Current state (JSON):", 1)[0]
    agents = []
    for slug, rest in _AGENT.findall(section):
        found = _CAPABILITIES.search(rest)
        capabilities = tuple(c.strip() for c in found.group(1).split(",")) if found else ()
        agents.append(_Agent(slug, f"{slug} {rest}", capabilities))
    return agents


def _chosen(agents: list[_Agent], goal_words: frozenset[str]) -> list[_Agent]:
    scored = [(len(goal_words & words(a.text.replace(".", " "))), i) for i, a in enumerate(agents)]
    relevant = sorted((s for s in scored if s[0] > 0), key=lambda s: (-s[0], s[1]))
    picked = [agents[i] for _, i in relevant[:MOST_AGENTS]] or agents[:1]
    return picked


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
    agents = _chosen(_agents(prompt), words(f"{goal_name} {about}".replace("-", " ")))
    agents = agents[:max_steps]
    summary = about.split("\n")[0].split(". ")[0][:80]
    steps: list[dict[str, object]] = []
    if nested and len(agents) > 1:
        first, rest = agents[0], agents[1:]
        steps.append(_step("s1", first, summary, []))
        steps.append(
            {
                "id": "s2",
                "subtask": f"{goal_name[:40]} follow-up",
                "description": "; ".join(f"{a.slug} to {a.action}" for a in rest)
                + f" for: {summary}",
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
            steps.append(_step(f"s{n}", agent, summary, deps))
    if _is_flawed(f"{goal_name}\n{description}") and not is_repair:
        last_deps = steps[-1]["depends_on"]
        assert isinstance(last_deps, list)
        steps[-1]["depends_on"] = [*last_deps, "s0"]
    return json.dumps({"steps": steps})


def _step(step_id: str, agent: _Agent, summary: str, deps: list[str]) -> dict[str, object]:
    return {
        "id": step_id,
        "agent": agent.slug,
        "task": f"{agent.action.capitalize()}: {summary}",
        "rationale": f"{agent.slug} can {agent.action}",
        "depends_on": deps,
    }
