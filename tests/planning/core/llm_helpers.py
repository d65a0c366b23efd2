"""Shared helpers for the LLM planning tests: agents, scripted answers, a client factory."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planning.core.llm.client import LlmClient
from planning.core.llm.records import LlmCallRecord, LlmSettings
from tests.fakes.openai_server import FakeOpenAIServer, RecordedRequest, Reply


@dataclass(frozen=True, slots=True, kw_only=True)
class Agent:
    slug: str
    name: str
    description: str = ""
    capabilities: tuple[str, ...] = ()
    kind: str = "llm"
    enabled: bool = True


AGENTS = (
    Agent(
        slug="analyst",
        name="Analyst",
        description="domain expert for financial records",
        capabilities=("review", "analyse"),
    ),
    Agent(slug="writer", name="Report writer", capabilities=("write-report",)),
    Agent(slug="investigator", name="Investigator", capabilities=("interview",), kind="human"),
)

_GOAL_LINE = re.compile(r"^Goal: (.*)$", re.MULTILINE)


def goal_of(request: RecordedRequest) -> str:
    """Return the goal named in a planning request."""
    match = _GOAL_LINE.search(request.user_prompt)
    assert match is not None, request.user_prompt
    return match.group(1)


def is_repair(request: RecordedRequest) -> bool:
    """Tell whether the request is a repair round (it carries the previous answer)."""
    return any(m.get("role") == "assistant" for m in request.messages)


def leaf(
    step_id: str, agent: str = "analyst", task: str = "", depends_on: Sequence[str] | None = None
) -> dict[str, Any]:
    return {
        "id": step_id,
        "agent": agent,
        "task": task or f"do {step_id}",
        "rationale": f"{agent} is suited",
        "depends_on": None if depends_on is None else list(depends_on),
    }


def subtask(
    step_id: str, name: str = "", description: str = "", depends_on: Sequence[str] | None = None
) -> dict[str, Any]:
    return {
        "id": step_id,
        "subtask": name or step_id,
        "description": description or f"achieve {step_id}",
        "depends_on": None if depends_on is None else list(depends_on),
    }


def answer(*steps: Mapping[str, Any]) -> str:
    return json.dumps({"steps": list(steps)})


def by_goal(answers: Mapping[str, Reply]) -> Callable[[RecordedRequest], Reply]:
    """Return a responder answering each planning request by the goal it names."""

    def respond(request: RecordedRequest) -> Reply:
        return answers[goal_of(request)]

    return respond


def settings_for(server: FakeOpenAIServer, **overrides: Any) -> LlmSettings:
    """Return settings pointing at the fake server (no transport retries unless asked)."""
    values: dict[str, Any] = {
        "api_key": server.api_key,
        "base_url": server.base_url,
        "model": server.model,
        "timeout_s": 10.0,
        "max_retries": 0,
        "max_concurrency": 64,
    }
    values.update(overrides)
    return LlmSettings(**values)


def make_client(
    server: FakeOpenAIServer,
    records: list[LlmCallRecord] | None = None,
    **overrides: Any,
) -> LlmClient:
    """Return a real client pointed at the fake server; `overrides` are LlmSettings fields."""
    return LlmClient(
        settings_for(server, **overrides), on_call=records.append if records is not None else None
    )
