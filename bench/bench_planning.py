"""Recursive LLM planning against the fake OpenAI server at a fixed latency (DESIGN §9).

Full trees of depth 3 with b = 5 entries per answer (1 + 5 + 25 = 31 calls) and b = 8
(1 + 8 + 64 = 73 calls), 100 ms per call, with the default concurrency (64 calls in flight).
Sibling compounds are expanded concurrently, so the wall-clock should be about depth x one call:
``ratio = wall / (depth x 0.1 s)``, target ≤ 1.15 for both (one call after another would give
10.3 and 24.3); the wall-clock is the median of seven runs. Also the calls a repeated goal costs
once the cache holds its answers (target 0).
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass

from planning.core.llm.cache import InMemoryDecompositionCache
from planning.core.llm.client import LlmClient
from planning.core.llm.decomposition import LlmBudgets, LlmDecomposition, expected_calls
from planning.core.llm.records import LlmSettings
from planning.core.tree import Goal
from tests.fakes.openai_server import RecordedRequest, Reply, fake_openai_process, fake_stats

LATENCY_S = 0.1
CONCURRENCY = 64  # the default of CASEHUB_LLM_CONCURRENCY
TREES = ((5, 3), (8, 3))  # (fan-out b, depth d)
REPEATS = 7  # the median of seven runs: a shared machine's scheduling noise is ms-sized


def _name(branching: int, depth: int) -> str:
    return f"planning.b{branching}_d{depth}"


TARGETS = {
    **{f"{_name(b, d)}.ratio": ("<=", 1.15) for b, d in TREES},
    **{f"{_name(b, d)}.calls": ("<=", float(expected_calls(b, d))) for b, d in TREES},
    "llm.repeat_goal.calls": ("<=", 0.0),
}

_GOAL = re.compile(r"^Goal: (.*)$", re.MULTILINE)
_FANOUT = re.compile(r"At most (\d+) steps")
GOAL = Goal(name="investigate-fraud", description="investigate a suspected fraud case")
STATE = {"case": {"id": "C-17", "amount": 125000}}


@dataclass(frozen=True, slots=True)
class _Agent:
    slug: str
    name: str
    description: str
    capabilities: tuple[str, ...]
    kind: str = "llm"


AGENTS = (
    _Agent("analyst", "Analyst", "analyst of the fraud team", ("review", "analyse")),
    _Agent("writer", "Report writer", "report writer of the fraud team", ("write-report",)),
)


def _respond(request: RecordedRequest) -> Reply:
    """Answer with b nested entries above the last level and b agent entries at it.

    It runs in the fake server's own process, so b is read from the request (its fan-out rule).
    """
    match = _GOAL.search(request.user_prompt)
    goal = match.group(1) if match else "goal"
    fanout = _FANOUT.search(request.system_prompt)
    branching = int(fanout.group(1)) if fanout else 1
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
        for i in range(branching)
    ]
    return json.dumps({"steps": steps})


def _planner(
    env: dict[str, str],
    branching: int,
    depth: int,
    cache: InMemoryDecompositionCache | None = None,
) -> LlmDecomposition:
    settings = LlmSettings(
        api_key=env["OPENAI_API_KEY"],
        base_url=env["OPENAI_BASE_URL"],
        model=env["CASEHUB_LLM_MODEL"],
        timeout_s=30.0,
        max_retries=0,
        max_concurrency=CONCURRENCY,
    )
    return LlmDecomposition(
        LlmClient(settings),
        AGENTS,
        max_depth=depth,
        budgets=LlmBudgets(max_calls=1000, max_leaves=10_000, max_fanout=branching),
        cache=cache,
    )


def run() -> dict[str, float]:
    """Return calls, wall-clock and ratio per tree, and the calls of a repeated goal."""
    results: dict[str, float] = {}
    # the fake provider runs in its own process, like a real one: its work must not compete
    # with the planner for this interpreter's GIL
    with fake_openai_process(latency_s=LATENCY_S, responder=_respond) as env:
        _planner(env, 2, 2).plan(GOAL, STATE)  # warm up imports and the fake's threads
        for branching, depth in TREES:
            walls: list[float] = []
            for _ in range(REPEATS):
                planner = _planner(env, branching, depth)  # a new client, as for every case
                before = fake_stats(env)["chat_requests"]
                started = time.perf_counter()
                plan = planner.plan(GOAL, STATE)
                walls.append(time.perf_counter() - started)
                planner.client.close()
                calls = fake_stats(env)["chat_requests"] - before
                if not plan.llm_calls == calls == expected_calls(branching, depth):
                    raise RuntimeError(f"b={branching}: {calls} calls, plan says {plan.llm_calls}")
                if len(plan.leaves) != branching**depth:
                    raise RuntimeError(f"b={branching}: {len(plan.leaves)} leaves")
            name = _name(branching, depth)
            wall = statistics.median(walls)
            results[f"{name}.calls"] = float(calls)
            results[f"{name}.wall_s"] = round(wall, 4)
            results[f"{name}.ratio"] = round(wall / (depth * LATENCY_S), 4)
            # best of the runs, as `timeit` reports: the run least disturbed by other processes
            results[f"{name}.ratio_best"] = round(min(walls) / (depth * LATENCY_S), 4)

        cache = InMemoryDecompositionCache()
        _planner(env, 5, 2, cache).plan(GOAL, STATE)
        before = fake_stats(env)["chat_requests"]
        _planner(env, 5, 2, cache).plan(GOAL, STATE)
        results["llm.repeat_goal.calls"] = float(fake_stats(env)["chat_requests"] - before)
    return results
