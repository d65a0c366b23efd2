"""Plan every goal with every strategy that applies, and score each plan.

The strategies are built the way `planning.planner.build_request` builds them for a case (the
pack's code methods; the pack's agents, or every pack's without one; the settings' default
budgets), without the database: no promoted methods, no decomposition cache, no case budgets.
The LLM strategies call the model through the planner's own client (`LlmClient`, the real
`openai` client), so the fake model is reached over loopback HTTP like a real server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from eval.dataset import EvalGoal, catalogue_for
from eval.scoring import Failure, overlap, tree_depth, validity_failures
from planning.core.dag import DagPlan
from planning.core.errors import PlanningError
from planning.core.forward import ForwardDecomposition
from planning.core.hybrid import HybridDecomposition
from planning.core.llm.client import LlmClient
from planning.core.llm.decomposition import LlmBudgets, LlmDecomposition
from planning.core.llm.pricing import PriceTable
from planning.core.llm.records import LlmCallRecord, LlmSettings
from planning.core.static import MethodLibrary, StaticDecomposition
from planning.core.strategy import Strategy

# the settings' defaults of one planning run (CASEHUB_LLM_MAX_CALLS, _MAX_TOKENS,
# CASEHUB_PLAN_MAX_LEAVES, _MAX_FANOUT)
BUDGETS = LlmBudgets(max_calls=60, max_tokens=500_000, max_leaves=500, max_fanout=12)
HYBRID_DEPTH = 2  # a case's default max_depth
ERROR_CHARS = 300


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategySpec:
    """One column of the evaluation: a strategy and, for the LLM, the depth it plans to."""

    label: str
    kind: str
    depth: int = 0

    @property
    def needs_pack(self) -> bool:
        """Tell whether the strategy plans only goals of a pack (static, forward, goal)."""
        return self.kind in ("static", "forward", "goal")

    @property
    def uses_llm(self) -> bool:
        """Tell whether the strategy may call the model."""
        return self.kind in ("llm", "hybrid")


STRATEGIES: tuple[StrategySpec, ...] = (
    StrategySpec(label="static", kind="static"),
    StrategySpec(label="forward", kind="forward"),
    StrategySpec(label="goal", kind="goal"),
    StrategySpec(label="llm-d1", kind="llm", depth=1),
    StrategySpec(label="llm-d2", kind="llm", depth=2),
    StrategySpec(label="llm-d3", kind="llm", depth=3),
    StrategySpec(label="hybrid", kind="hybrid", depth=HYBRID_DEPTH),
)


@dataclass
class _Calls:
    records: list[LlmCallRecord] = field(default_factory=list)

    def __call__(self, record: LlmCallRecord) -> None:
        self.records.append(record)  # list.append is atomic: the planner calls from threads


def _strategy(
    goal: EvalGoal, spec: StrategySpec, settings: LlmSettings | None, calls: _Calls
) -> tuple[Strategy, LlmClient | None]:
    pack = goal.domain_pack
    if spec.kind in ("static", "forward") and pack is not None:
        planner = StaticDecomposition if spec.kind == "static" else ForwardDecomposition
        return planner(pack.methods), None
    if spec.kind == "goal" and pack is not None:
        return pack.goal_planner(goal.state()), None
    if settings is None:
        raise ValueError(f"{spec.label} needs a model")
    client = LlmClient(settings, on_call=calls)
    agents = catalogue_for(pack).agents.values()
    depth = spec.depth or HYBRID_DEPTH
    # as planning/planner.py builds it: the pack's code methods give the prompt its example,
    # its capabilities the actions a step may name
    llm = LlmDecomposition(
        client,
        tuple(agents),
        max_depth=depth,
        budgets=BUDGETS,
        examples=pack.methods if pack else None,
        example_task=pack.root_task if pack else "",
        actions=pack.capabilities_for if pack else None,
    )
    if spec.kind == "llm":
        return llm, client
    return HybridDecomposition(
        StaticDecomposition(pack.methods if pack else MethodLibrary()), llm
    ), (client)


def _cost(records: Sequence[LlmCallRecord], prices: PriceTable) -> float | None:
    total = Decimal(0)
    for record in records:
        cost = prices.cost(record.model, record.prompt_tokens, record.completion_tokens)
        if cost is None:
            return None
        total += cost
    return float(round(total, 9))


def run_one(
    goal: EvalGoal,
    spec: StrategySpec,
    settings: LlmSettings | None,
    prices: PriceTable,
) -> dict[str, Any]:
    """Plan `goal` with `spec` and return the run's scores as JSON-ready data."""
    calls = _Calls()
    client: LlmClient | None = None
    plan: DagPlan | None = None
    error: tuple[str, str] | None = None
    started = time.perf_counter()
    try:
        strategy, client = _strategy(goal, spec, settings, calls)
        plan = strategy.plan(goal.planning_goal(), goal.state())
    except PlanningError as exc:
        error = (type(exc).__name__, str(exc)[:ERROR_CHARS])
    finally:
        if client is not None:
            client.close()
    wall = time.perf_counter() - started
    records = sorted(calls.records, key=lambda r: r.request_hash + r.response_text)
    run: dict[str, Any] = {
        "goal": goal.id,
        "pack": goal.pack or "none",
        "kind": goal.kind,
        "strategy": spec.label,
        "delivered": plan is not None,
        "llm_calls": len(records),
        "tokens": sum(r.prompt_tokens + r.completion_tokens for r in records),
        "repairs": sum(1 for r in records if any(m.get("role") == "assistant" for m in r.messages)),
        "cost_usd": _cost(records, prices) if records else 0.0,
        "wall_s": round(wall, 4),
    }
    if plan is None:
        kind, message = error or ("Error", "")
        failures = [Failure(check=f"not_delivered.{kind}", detail=message)]
        run |= {
            "valid": False,
            "failures": [f.as_data() for f in failures],
            "node_f1": 0.0,
            "edge_f1": 0.0,
            "node_precision": 0.0,
            "node_recall": 0.0,
            "leaves": 0,
            "depth": 0,
            "critical_path": 0,
            "warnings": [],
        }
        return run
    catalogue = catalogue_for(goal.domain_pack)
    failures = validity_failures(plan, catalogue, goal.constraints)
    scores = overlap(plan, goal.reference_plan())
    run |= {
        "valid": not failures,
        "failures": [f.as_data() for f in failures],
        "node_f1": round(scores.node_f1, 4),
        "edge_f1": round(scores.edge_f1, 4),
        "node_precision": round(scores.node_precision, 4),
        "node_recall": round(scores.node_recall, 4),
        "leaves": len(plan.leaves),
        "depth": tree_depth(plan),
        "critical_path": len(plan.critical_path()),
        "warnings": list(plan.warnings),
    }
    return run


def applicable(goal: EvalGoal, spec: StrategySpec) -> bool:
    """Tell whether `spec` applies to `goal` (static, forward and goal planning need a pack)."""
    return goal.pack is not None or not spec.needs_pack


def run_all(
    goals: Sequence[EvalGoal],
    specs: Sequence[StrategySpec],
    settings: LlmSettings | None,
    prices: PriceTable,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Return the runs of every applicable (goal, strategy), goal by goal."""
    runs = []
    for goal in goals:
        for spec in specs:
            if not applicable(goal, spec) or (spec.uses_llm and settings is None):
                continue
            run = run_one(goal, spec, settings, prices)
            runs.append(run)
            if progress is not None:
                progress(run)
    return runs
