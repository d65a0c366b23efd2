"""Recursive LLM planning against the fake OpenAI server at a fixed latency (DESIGN §9).

b = 5 entries per answer, depth 2 (6 calls) and depth 3 (31 calls), 100 ms per call. Sibling
compounds are expanded concurrently, so the wall-clock should be about depth x one call:
``ratio = wall / (depth x 0.1 s)``, target ≤ 1.3 (one call after another would give 10.3 at
depth 3); the wall-clock is the median of five runs. Also the calls a repeated goal
costs once the cache holds its answers (target 0).
"""

from __future__ import annotations

import json
import re
import statistics
import time

from planning.core.llm.cache import InMemoryDecompositionCache
from planning.core.llm.client import LlmClient, LlmSettings
from planning.core.llm.decomposition import LlmBudgets, LlmDecomposition, expected_calls
from planning.core.tree import Goal
from tests.fakes.openai_server import RecordedRequest, Reply, fake_openai_process, fake_stats

LATENCY_S = 0.1
BRANCHING = 5
DEPTHS = (2, 3)
REPEATS = 5  # the median of five runs: a shared machine's scheduling noise is ms-sized

TARGETS = {
    **{f"planning.depth{d}.ratio": ("<=", 1.3) for d in DEPTHS},
    **{f"planning.depth{d}.calls": ("<=", float(expected_calls(BRANCHING, d))) for d in DEPTHS},
    "llm.repeat_goal.calls": ("<=", 0.0),
}

_GOAL = re.compile(r"^Goal: (.*)$", re.MULTILINE)
GOAL = Goal(name="investigate-fraud", description="investigate a suspected fraud case")
STATE = {"case": {"id": "C-17", "amount": 125000}}


class _Agent:
    def __init__(self, slug: str, name: str, capabilities: tuple[str, ...]) -> None:
        self.slug = slug
        self.name = name
        self.description = f"{name} of the fraud team"
        self.capabilities = capabilities


AGENTS = (
    _Agent("analyst", "Analyst", ("review", "analyse")),
    _Agent("writer", "Report writer", ("write-report",)),
)


def _respond(request: RecordedRequest) -> Reply:
    """Answer with b nested entries above the last level and b agent entries at it."""
    match = _GOAL.search(request.user_prompt)
    goal = match.group(1) if match else "goal"
    nested = "subtask" in request.system_prompt
    steps = [
        {"id": f"s{i}", "subtask": f"{goal}/s{i}", "description": f"part {i}", "depends_on": []}
        if nested
        else {
            "id": f"l{i}",
            "agent": "analyst" if i % 2 else "writer",
            "task": f"step {i} of {goal}",
            "rationale": "fits",
            "depends_on": None,
        }
        for i in range(BRANCHING)
    ]
    return json.dumps({"steps": steps})


def _planner(
    env: dict[str, str], depth: int, cache: InMemoryDecompositionCache | None
) -> LlmDecomposition:
    settings = LlmSettings.from_env({**env, "CASEHUB_LLM_MAX_RETRIES": "0"})
    return LlmDecomposition(
        LlmClient(settings),
        AGENTS,
        max_depth=depth,
        budgets=LlmBudgets(max_calls=1000, max_leaves=10_000, max_fanout=BRANCHING),
        cache=cache,
        max_concurrency=64,
    )


def run() -> dict[str, float]:
    """Return calls, wall-clock and ratio per depth, and the calls of a repeated goal."""
    results: dict[str, float] = {}
    # the fake provider runs in its own process, like a real one: its work must not compete
    # with the planner for this interpreter's GIL
    with fake_openai_process(latency_s=LATENCY_S, responder=_respond) as env:
        _planner(env, 1, None).plan(GOAL, STATE)  # warm up imports and the connection pool
        for depth in DEPTHS:
            walls: list[float] = []
            for _ in range(REPEATS):
                planner = _planner(env, depth, None)
                before = fake_stats(env)["chat_requests"]
                started = time.perf_counter()
                plan = planner.plan(GOAL, STATE)
                walls.append(time.perf_counter() - started)
                calls = fake_stats(env)["chat_requests"] - before
                if not plan.llm_calls == calls == expected_calls(BRANCHING, depth):
                    raise RuntimeError(f"depth {depth}: {calls} calls, plan says {plan.llm_calls}")
                if len(plan.leaves) != BRANCHING**depth:
                    raise RuntimeError(f"depth {depth}: {len(plan.leaves)} leaves")
            wall = statistics.median(walls)
            results[f"planning.depth{depth}.calls"] = float(calls)
            results[f"planning.depth{depth}.wall_s"] = round(wall, 4)
            results[f"planning.depth{depth}.ratio"] = round(wall / (depth * LATENCY_S), 4)
            # best of five, as `timeit` reports: the run least disturbed by other processes
            results[f"planning.depth{depth}.ratio_best"] = round(
                min(walls) / (depth * LATENCY_S), 4
            )

        cache = InMemoryDecompositionCache()
        _planner(env, 2, cache).plan(GOAL, STATE)
        before = fake_stats(env)["chat_requests"]
        _planner(env, 2, cache).plan(GOAL, STATE)
        results["llm.repeat_goal.calls"] = float(fake_stats(env)["chat_requests"] - before)
    return results
