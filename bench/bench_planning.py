"""Recursive LLM planning against the fake OpenAI server at a fixed latency (DESIGN §9).

Full trees of depth 3 with b = 5 entries per answer (1 + 5 + 25 = 31 calls) and b = 8
(1 + 8 + 64 = 73 calls), 100 ms per call, with the default concurrency (64 calls in flight).
Sibling compounds are expanded concurrently, so the wall-clock should be about depth x one call:
``ratio = wall / (depth x 0.1 s)``, target ≤ 1.15 for both (one call after another would give
10.3 and 24.3); the wall-clock is the median of seven runs. Also the calls a repeated goal costs
once the cache holds its answers (target 0).

Beside each tree, in the same run, its floor: the request bodies one plan of it sent, sent again
level by level (each level's at once on a pool of ``CONCURRENCY`` threads) through a new
transport of the planner's (`ChatTransport`: the `openai` SDK and its HTTP client), with no
planning code around them.
``transport_floor_ratio`` is that wall-clock ÷ (depth x 0.1 s), ``ratio_vs_transport_floor``
the planner's wall-clock ÷ the floor's: what the planner's own work adds to the calls it makes.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from planning.core.llm.cache import InMemoryDecompositionCache
from planning.core.llm.client import LlmClient
from planning.core.llm.decomposition import LlmBudgets, LlmDecomposition, expected_calls
from planning.core.llm.records import LlmSettings
from planning.core.llm.transport import ChatTransport
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


def _settings(env: dict[str, str]) -> LlmSettings:
    return LlmSettings(
        api_key=env["OPENAI_API_KEY"],
        base_url=env["OPENAI_BASE_URL"],
        model=env["CASEHUB_LLM_MODEL"],
        timeout_s=30.0,
        max_retries=0,
        max_concurrency=CONCURRENCY,
    )


def _planner(
    env: dict[str, str],
    branching: int,
    depth: int,
    cache: InMemoryDecompositionCache | None = None,
) -> LlmDecomposition:
    return LlmDecomposition(
        LlmClient(_settings(env)),
        AGENTS,
        max_depth=depth,
        budgets=LlmBudgets(max_calls=1000, max_leaves=10_000, max_fanout=branching),
        cache=cache,
    )


def _recorded_levels(env: dict[str, str], branching: int, depth: int) -> list[list[dict[str, Any]]]:
    """Plan the tree once and return the request bodies the planner sent, level by level (a
    goal's level is the number of "/" in it: the fake names subtasks "<goal>/s<i>")."""
    planner = _planner(env, branching, depth)
    transport = planner.client.transport
    bodies: list[dict[str, Any]] = []
    exchange = transport.exchange

    def recording(build: Any, sent: list[dict[str, Any]]) -> Any:
        return exchange(lambda form: _kept(build(form), bodies), sent)

    transport.exchange = recording  # type: ignore[method-assign]
    planner.plan(GOAL, STATE)
    planner.client.close()
    levels: dict[int, list[dict[str, Any]]] = {}
    for body in bodies:
        text = "\n".join(str(m.get("content", "")) for m in body["messages"])
        match = _GOAL.search(text)
        levels.setdefault(match.group(1).count("/") if match else 0, []).append(body)
    return [levels[level] for level in sorted(levels)]


def _kept(
    built: tuple[dict[str, Any], list[dict[str, Any]]], bodies: list[dict[str, Any]]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    bodies.append(built[0])
    return built


def _transport_floor(env: dict[str, str], levels: list[list[dict[str, Any]]]) -> float:
    """Return the wall-clock of a plan's requests sent again through a new transport alone.

    The same bodies, level by level, each level's requests at once on a pool of `CONCURRENCY`
    threads, each answer parsed as the transport parses it: the `openai` SDK's and the HTTP
    stack's share of a plan, with nothing of the planner (prompts, call records, repairs, the
    plan's build). A new transport, as for each plan: its connections open inside the clock.
    """
    transport = ChatTransport(_settings(env))

    def call(body: dict[str, Any]) -> None:
        transport.exchange(lambda form: (body, []), [])

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        started = time.perf_counter()
        for level in levels:
            list(pool.map(call, level))
        wall = time.perf_counter() - started
    transport.close()
    return wall


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
            # the floor: the same calls through the same transport, no planning code
            levels = _recorded_levels(env, branching, depth)
            floor = statistics.median(_transport_floor(env, levels) for _ in range(REPEATS))
            results[f"{name}.transport_floor_ratio"] = round(floor / (depth * LATENCY_S), 4)
            results[f"{name}.ratio_vs_transport_floor"] = round(wall / floor, 4)

        cache = InMemoryDecompositionCache()
        _planner(env, 5, 2, cache).plan(GOAL, STATE)
        before = fake_stats(env)["chat_requests"]
        _planner(env, 5, 2, cache).plan(GOAL, STATE)
        results["llm.repeat_goal.calls"] = float(fake_stats(env)["chat_requests"] - before)
    return results
