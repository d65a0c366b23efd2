"""What a plan asks of an LLM besides planning: the steps it gives to `llm` agents.

Each such step calls the agent's model when it runs (up to `CASEHUB_LLM_AGENT_MAX_ROUNDS` calls an
attempt), so the form's estimate and the plan count them with the planning calls; and where the
installation has no LLM provider they cannot run, which the form, the plan and its gate say before
anyone approves it. The form previews the plan the methods would build (static, forward and
goal-oriented planning, and hybrid planning without a provider, call no LLM to plan).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pydantic
from django.conf import settings

from planning.core.errors import PlanningError
from planning.forms import INPUT_PREFIX, CaseForm
from planning.models import Agent, Case, PlanNode, PlanVersion, Strategy
from planning.planner import PlanningUnavailable, build_request, llm_settings


def rounds_per_step() -> int:
    """Return how many model calls one attempt of an llm step may make."""
    return max(1, int(getattr(settings, "CASEHUB_LLM_AGENT_MAX_ROUNDS", 4)))


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmSteps:
    """The steps of a plan that an `llm` agent runs, and whether this installation can run them."""

    keys: tuple[str, ...]
    agents: tuple[str, ...]
    has_provider: bool
    rounds: int

    @property
    def count(self) -> int:
        return len(self.keys)

    @property
    def max_calls(self) -> int:
        """Return the most model calls these steps make, one attempt each."""
        return self.count * self.rounds

    @property
    def cannot_run(self) -> bool:
        """Tell whether the plan has llm steps this installation has no provider for."""
        return bool(self.keys) and not self.has_provider

    @property
    def summary(self) -> str:
        """Return the plan's llm steps in one sentence ("" when there are none)."""
        if not self.keys:
            return ""
        steps = "step" if self.count == 1 else "steps"
        calls = "call" if self.max_calls == 1 else "calls"
        return (
            f"{self.count} {steps} for an LLM agent ({', '.join(self.agents)}): up to "
            f"{self.max_calls} LLM {calls} when {'it runs' if self.count == 1 else 'they run'}"
        )

    @property
    def warning(self) -> str:
        """Return why these steps cannot run here ("" when they can, or there are none)."""
        if not self.cannot_run:
            return ""
        keys = ", ".join(self.keys)
        return (
            f"This installation has no LLM provider, so {keys} cannot run: "
            f"{'it fails' if self.count == 1 else 'they fail'} when reached, and the case with "
            "them. Ask the operator to configure an LLM provider before approving this plan."
        )


def llm_steps(leaves: Iterable[tuple[str, str]]) -> LlmSteps:
    """Return the steps among `leaves` ((key, agent) pairs) whose agent is of kind `llm`."""
    pairs = list(leaves)
    kinds = dict(
        Agent.objects.filter(slug__in={agent for _, agent in pairs}).values_list("slug", "kind")
    )
    mine = [(key, agent) for key, agent in pairs if kinds.get(agent) == Agent.Kind.LLM]
    return LlmSteps(
        keys=tuple(key for key, _ in mine),
        agents=tuple(dict.fromkeys(agent for _, agent in mine)),
        has_provider=llm_settings().is_configured,
        rounds=rounds_per_step(),
    )


def version_llm_steps(version: PlanVersion | None) -> LlmSteps | None:
    """Return the llm steps of a stored plan version (None without a version)."""
    if version is None:
        return None
    leaves = PlanNode.objects.filter(version=version, kind=PlanNode.Kind.LEAF).order_by("position")
    return llm_steps(leaves.values_list("key", "agent"))


def _plans_without_llm(strategy: str) -> bool:
    if strategy in (Strategy.STATIC, Strategy.FORWARD, Strategy.GOAL):
        return True
    return strategy == Strategy.HYBRID and not llm_settings().is_configured


def preview_llm_steps(
    *, domain: str, strategy: str, inputs: Mapping[str, Any], max_depth: int
) -> LlmSteps | None:
    """Return the llm steps of the plan a case would get, planned here without an LLM call.

    None when that cannot be known before planning: a strategy that asks an LLM to plan, no
    domain pack, or inputs the pack refuses (the form says what is wrong with them).
    """
    if not domain or not _plans_without_llm(strategy):
        return None
    case = Case(domain=domain, strategy=strategy, inputs=dict(inputs), max_depth=max_depth)
    try:
        request = build_request(case, lambda record: None)
        plan = request.strategy.plan(request.goal, request.state)
    except (PlanningError, PlanningUnavailable, pydantic.ValidationError, KeyError):
        return None
    return llm_steps((leaf.key, leaf.agent) for leaf in plan.leaves)


def form_inputs(form: CaseForm) -> dict[str, Any]:
    """Return the pack inputs a case form holds as typed (bound or not), blanks left out."""
    values: dict[str, Any] = {}
    for name in form.input_names:
        value = form[name].value()
        if value is None or value == "":
            continue
        values[name.removeprefix(INPUT_PREFIX)] = value
    return values


def form_llm_steps(form: CaseForm, max_depth: int) -> LlmSteps | None:
    """Return the llm steps of the plan the case form's values would get (None: not known yet)."""
    return preview_llm_steps(
        domain=form.domain_slug,
        strategy=str(form["strategy"].value() or ""),
        inputs=form_inputs(form),
        max_depth=max_depth,
    )
