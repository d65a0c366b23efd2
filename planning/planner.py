"""Build the planning core's strategy for a case from the database configuration."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from planning.catalogue import enabled_pack, planning_agents, registered_packs
from planning.core.forward import ForwardDecomposition
from planning.core.hybrid import HybridDecomposition
from planning.core.llm.budget import BudgetBackend, CallGuard
from planning.core.llm.cache import DecompositionCache
from planning.core.llm.client import LlmClient
from planning.core.llm.decomposition import LlmBudgets, LlmDecomposition, expected_calls
from planning.core.llm.records import LlmCallRecord, LlmNotConfigured, LlmSettings
from planning.core.pack import DomainPack, planning_state
from planning.core.static import MethodLibrary, StaticDecomposition
from planning.core.strategy import Strategy as CoreStrategy
from planning.core.tree import Goal
from planning.models import Agent, Case, Strategy
from planning.models import DomainPack as DomainPackRow
from planning.promotion.methods import MethodInvalid, library_for

DEFAULT_BRANCHING = 5


class PlanningUnavailable(Exception):
    """The case cannot be planned as configured (a missing pack, agent or provider)."""


def llm_settings(model: str = "") -> LlmSettings:
    """Return the LLM provider settings from the Django settings; `model` overrides the default.

    Raises PlanningUnavailable when a setting is out of range.
    """
    try:
        return LlmSettings(
            api_key=settings.OPENAI_API_KEY or None,
            base_url=settings.OPENAI_BASE_URL or None,
            model=model.strip() or settings.CASEHUB_LLM_MODEL,
            timeout_s=float(settings.CASEHUB_LLM_TIMEOUT_S),
            max_retries=settings.CASEHUB_LLM_MAX_RETRIES,
            max_concurrency=settings.CASEHUB_LLM_CONCURRENCY,
            max_tokens_per_call=settings.CASEHUB_LLM_MAX_TOKENS_PER_CALL,
            response_format=(
                "json_object"
                if settings.CASEHUB_LLM_RESPONSE_FORMAT == "json_object"
                else "json_schema"
            ),
            temperature=settings.CASEHUB_LLM_TEMPERATURE,
        )
    except ValueError as exc:
        raise PlanningUnavailable(f"The LLM settings are invalid: {exc}.") from exc


def llm_budgets() -> LlmBudgets:
    """Return the ceilings of one planning run from the settings (the case's budgets are the
    ledger's: `budget_guard`)."""
    return LlmBudgets(
        max_calls=settings.CASEHUB_LLM_MAX_CALLS,
        max_tokens=settings.CASEHUB_LLM_MAX_TOKENS,
        max_leaves=settings.CASEHUB_PLAN_MAX_LEAVES,
        max_fanout=settings.CASEHUB_PLAN_MAX_FANOUT,
    )


def planner_model(domain: str) -> str:
    """Return the model that plans a case of `domain`: its pack's planner agent's or the default."""
    pack = enabled_pack(domain) if domain else None
    agent = _planner_agent(pack)
    return (agent.model.strip() if agent else "") or settings.CASEHUB_LLM_MODEL


def budget_backend() -> BudgetBackend | None:
    """Return the LLM budget ledger named by CASEHUB_LLM_BUDGET_BACKEND, None when unnamed.

    A dotted path, like Django's pluggable backends: the ledger lives in oversight, which
    planning never imports.
    """
    path = str(getattr(settings, "CASEHUB_LLM_BUDGET_BACKEND", "") or "")
    if not path:
        return None
    backend: BudgetBackend = import_string(path)()
    return backend


def budget_guard(case_id: int, purpose: str) -> CallGuard | None:
    """Return the guard that checks a case's LLM calls against the budgets, None when unset."""
    backend = budget_backend()
    return None if backend is None else backend.guard(case_id, purpose)


def expected_llm_calls(
    strategy: str, max_depth: int, branching: int = DEFAULT_BRANCHING
) -> int | None:
    """Return the LLM calls a full plan needs (1 + b + … + b^(d-1)); None when none are made.

    For hybrid planning this is the upper bound: static methods may cover some or all of it.
    """
    if strategy not in (Strategy.LLM, Strategy.HYBRID) or max_depth < 1:
        return None
    return expected_calls(branching, max_depth)


def pack_choices() -> list[tuple[DomainPackRow, DomainPack]]:
    """Return the enabled pack rows with their code packs."""
    rows = DomainPackRow.objects.filter(enabled=True, slug__in=list(registered_packs()))
    return [(row, registered_packs()[row.slug]) for row in rows]


@dataclass
class CallLog:
    """Collect the LLM call records of one planning run (the planner calls from many threads)."""

    records: list[LlmCallRecord] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, record: LlmCallRecord) -> None:
        with self._lock:
            self.records.append(record)


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What the planning core needs for one case: the strategy, the goal and the state."""

    strategy: CoreStrategy
    goal: Goal
    state: dict[str, Any]
    pack: DomainPack | None
    clients: tuple[LlmClient, ...] = ()

    def close(self) -> None:
        """Release the LLM clients' connections."""
        for client in self.clients:
            client.close()


def _description(case: Case) -> str:
    return "\n\n".join(part for part in (case.goal, case.description) if part.strip())


def _planner_agent(pack: DomainPack | None) -> Agent | None:
    """Return the enabled `llm` agent the pack names as its planner, or None."""
    if pack is None or not pack.planner_agent:
        return None
    return Agent.objects.filter(slug=pack.planner_agent, enabled=True, kind=Agent.Kind.LLM).first()


def _llm(
    case: Case,
    pack: DomainPack | None,
    on_call: Callable[[LlmCallRecord], None],
    cache: DecompositionCache | None,
) -> LlmDecomposition:
    # the agents the model may assign are filtered by kind in the core, which also says clearly
    # what to enable when none is left
    agent = _planner_agent(pack)
    client = LlmClient(
        llm_settings(agent.model if agent else ""),
        on_call=on_call,
        guard=budget_guard(case.pk, "planning"),
    )
    return LlmDecomposition(
        client,
        planning_agents(pack),
        max_depth=case.max_depth,
        budgets=llm_budgets(),
        cache=cache,
        instructions=agent.system_prompt if agent else "",
        # the pack's code methods, not promoted ones: the example is the domain's own shape
        examples=pack.methods if pack else None,
        example_task=pack.root_task if pack else "",
        # the pack's leaves for the case: a step may name one and carry its tool
        actions=pack.capabilities_for if pack else None,
    )


def build_request(
    case: Case,
    on_call: Callable[[LlmCallRecord], None],
    cache: DecompositionCache | None = None,
) -> PlanRequest:
    """Return the strategy, goal and state for a case.

    Raises PlanningUnavailable (unknown or disabled pack, LLM settings out of range),
    LlmNotConfigured (LLM planning without a provider), and pydantic.ValidationError (inputs
    that no longer fit).
    """
    pack = enabled_pack(case.domain) if case.domain else None
    if case.domain and pack is None:
        raise PlanningUnavailable(f"The domain pack {case.domain!r} is unknown or disabled.")
    state = case_state(case, pack)
    if pack is not None:
        goal = Goal(name=pack.root_task, description=_description(case))
    else:
        goal = Goal(name=case.goal, description=case.description)

    strategy: CoreStrategy
    if case.strategy == Strategy.STATIC:
        strategy = StaticDecomposition(_methods(pack))
    elif case.strategy == Strategy.FORWARD:
        strategy = ForwardDecomposition(_methods(pack))
    elif case.strategy == Strategy.GOAL:
        if pack is None:
            raise PlanningUnavailable("Goal-oriented planning needs a domain pack.")
        strategy = pack.goal_planner(state)
    elif case.strategy == Strategy.LLM:
        llm_settings().require_configured("LLM planning")
        strategy = _llm(case, pack, on_call, cache)
    elif case.strategy == Strategy.HYBRID:
        static = StaticDecomposition(_library(pack) if pack else MethodLibrary())
        llm = _llm(case, pack, on_call, cache) if llm_settings().is_configured else None
        strategy = HybridDecomposition(static, llm)
    else:
        raise PlanningUnavailable(f"Unknown strategy {case.strategy!r}.")
    clients = tuple(
        planner.client
        for planner in (strategy, getattr(strategy, "llm", None))
        if isinstance(planner, LlmDecomposition)
    )
    return PlanRequest(strategy=strategy, goal=goal, state=state, pack=pack, clients=clients)


def case_state(case: Case, pack: DomainPack | None) -> dict[str, Any]:
    """Return the planning state of `case`: its inputs (as its pack reads them) and whether this
    installation has an LLM provider, which a pack's methods may need to know.

    Raises pydantic.ValidationError for inputs that no longer fit the pack.
    """
    state = pack.initial_state(case.inputs) if pack else dict(case.inputs)
    return planning_state(state, has_llm_provider=llm_settings().is_configured)


def _methods(pack: DomainPack | None) -> MethodLibrary:
    if pack is None:
        raise PlanningUnavailable("Static and forward planning need a domain pack.")
    return _library(pack)


def _library(pack: DomainPack) -> MethodLibrary:
    # The pack's code methods, then its active promoted methods (one query): a promoted method
    # never overrides code, and hybrid planning tries it before the LLM.
    try:
        return library_for(pack)
    except MethodInvalid as exc:
        raise PlanningUnavailable(str(exc)) from exc


__all__ = [
    "CallLog",
    "LlmNotConfigured",
    "PlanRequest",
    "PlanningUnavailable",
    "budget_backend",
    "budget_guard",
    "build_request",
    "case_state",
    "expected_llm_calls",
    "llm_budgets",
    "llm_settings",
    "pack_choices",
    "planner_model",
]
