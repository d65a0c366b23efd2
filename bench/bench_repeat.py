"""A repeated goal planned three times through the real planning path (DESIGN §9, "LLM cost").

A hybrid incident case of a kind no method of the pack covers (certificate expiry) is submitted
and planned with `planning.actions.materialise_plan`: Django, the database decomposition cache,
the real openai client against the fake OpenAI server at 100 ms a call, in a process of its own.
The model answers the root with two steps and a subtask, and the subtask with two steps: 2 calls.

- `repeat.cache.run{1,2,3}`: the same goal and description three times. Run 1 asks the model;
  runs 2 and 3 are answered by the decomposition cache (target 0 calls).
- `repeat.promoted.run{1,2,3}`: the first case is approved and run to its end through the
  oversight actions, an officer promotes its plan to a method, a second officer approves it; then
  three cases of the same kind with different descriptions (so the cache cannot answer them) are
  planned by the promoted method (target 0 calls).
- `repeat.uncached.calls`: for contrast, a different description before the promotion: the root
  is asked again (1 call); the subtask's request is the same as before, so the cache answers it.

Calls are counted at the fake server and must agree with the plan version's `llm_calls`.
The database is a fresh SQLite file in a temporary directory unless
`CASEHUB_BENCH_REPEAT_DATABASE_URL` names another (an empty PostgreSQL database, say).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.fakes.openai_server import RecordedRequest, fake_openai_process, fake_stats

LATENCY_S = 0.1
RUNS = 3
KIND = "certificate-expiry"

TARGETS = {
    "repeat.cache.run2.calls": ("<=", 0.0),
    "repeat.cache.run3.calls": ("<=", 0.0),
    "repeat.promoted.run1.calls": ("<=", 0.0),
    "repeat.promoted.run2.calls": ("<=", 0.0),
    "repeat.promoted.run3.calls": ("<=", 0.0),
}


def respond(request: RecordedRequest) -> str:
    """Answer like a model planning a certificate expiry, and an agent's step with a result.

    Runs in the fake server's own process (spawned), so it is a module-level function.
    """
    if "steps" not in json.dumps(request.json_schema):
        return json.dumps({"summary": "done"})
    if "Goal: notify-stakeholders" in request.user_prompt:
        steps: list[dict[str, Any]] = [
            {
                "id": "draft",
                "agent": "forensic-analyst",
                "task": "Draft the notice about the expired certificate",
                "rationale": "knows what happened",
                "depends_on": [],
            },
            {
                "id": "send",
                "agent": "incident-commander",
                "task": "Send the notice to the stakeholders",
                "rationale": "owns the communication",
                "depends_on": ["draft"],
            },
        ]
    else:
        steps = [
            {
                "id": "triage",
                "agent": "incident-commander",
                "task": "Triage the certificate expiry",
                "rationale": "owns incidents",
                "depends_on": [],
            },
            {
                "id": "renew",
                "agent": "incident-commander",
                "task": "Renew and deploy the certificate",
                "rationale": "has the access",
                "depends_on": ["triage"],
            },
            {
                "id": "notify",
                "subtask": "notify-stakeholders",
                "description": "tell the stakeholders what happened",
                "depends_on": ["renew"],
            },
        ]
    return json.dumps({"steps": steps})


def run() -> dict[str, float]:
    """Return the calls and wall-clock of each run, cached and promoted."""
    with tempfile.TemporaryDirectory(prefix="casehub-bench-repeat-") as tmp:
        var_dir = Path(tmp)
        out = var_dir / "result.json"
        with fake_openai_process(latency_s=LATENCY_S, responder=respond) as fake:
            env = {
                **os.environ,
                **fake,
                "DJANGO_SETTINGS_MODULE": "casehub.settings",
                "SECRET_KEY": os.environ.get("SECRET_KEY", "bench-only-not-a-secret"),
                "CASEHUB_VAR_DIR": str(var_dir),
                "DATABASE_URL": os.environ.get(
                    "CASEHUB_BENCH_REPEAT_DATABASE_URL", f"sqlite:///{var_dir / 'bench.sqlite3'}"
                ),
                "CASEHUB_LLM_MAX_RETRIES": "0",
            }
            root = Path(__file__).resolve().parent.parent
            subprocess.run(
                [sys.executable, "-m", "bench.bench_repeat", str(out)],
                env=env,
                cwd=root,
                check=True,
            )
        figures: dict[str, float] = json.loads(out.read_text())
    _print(figures)
    return figures


def _print(figures: dict[str, float]) -> None:
    print(f"  {'path':<10} {'run':>4} {'LLM calls':>10} {'wall-clock':>11}")
    for path in ("cache", "promoted"):
        for n in range(1, RUNS + 1):
            calls = figures[f"repeat.{path}.run{n}.calls"]
            wall = figures[f"repeat.{path}.run{n}.wall_s"]
            print(f"  {path:<10} {n:>4} {calls:>10.0f} {wall:>9.3f} s")
    uncached = figures["repeat.uncached.calls"]
    print(f"  other description, before the promotion: {uncached:.0f} LLM call(s)")


# The child: Django set up against a fresh database --------------------------------------------


def _planned(fake: dict[str, str], submitter: Any, description: str) -> tuple[Any, float, int]:
    from planning.actions import materialise_plan, submit_case

    case = submit_case(
        submitter=submitter,
        title=f"Incident: {KIND}",
        goal="Respond to the incident",
        description=description,
        domain="incident",
        strategy="hybrid",
        max_depth=3,
        inputs={"kind": KIND, "service": "web"},
    )
    before = fake_stats(fake)["chat_requests"]
    started = time.perf_counter()
    result = materialise_plan(case.pk)
    wall = time.perf_counter() - started
    calls = fake_stats(fake)["chat_requests"] - before
    if result.version is None:
        raise RuntimeError(f"planning failed: {result.reason}")
    if result.version.llm_calls != calls:
        raise RuntimeError(f"{calls} requests, the version says {result.version.llm_calls}")
    case.refresh_from_db()
    return case, wall, calls


def _warm_up(submitter: Any) -> None:
    from planning.actions import materialise_plan, submit_case

    case = submit_case(
        submitter=submitter,
        title="Warm-up",
        goal="Respond to the incident",
        domain="incident",
        strategy="hybrid",
        inputs={"kind": "database-outage", "service": "billing-db"},
    )
    if materialise_plan(case.pk).version is None:
        raise RuntimeError("the warm-up case did not plan")


def _child(out: Path) -> None:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from planning.catalogue import sync_packs
    from planning.models import PlanNode
    from planning.promotion.actions import approve_method, propose_method
    from tests import personas
    from tests.planning.promotion_flow import run_to_end

    sync_packs()
    fake = {"OPENAI_BASE_URL": os.environ["OPENAI_BASE_URL"]}
    analyst = personas.analyst("bench-ana")
    doer = personas.analyst("bench-bea")
    officer = personas.officer("bench-olivia")
    second = personas.second_officer("bench-oscar")
    figures: dict[str, float] = {}
    description = "The certificate of the web front end expired at midnight."
    # warm up the imports with a case the pack's own method plans (no LLM call, nothing cached)
    _warm_up(analyst)
    first = None
    for n in range(1, RUNS + 1):
        case, wall, calls = _planned(fake, analyst, description)
        first = first or case
        figures[f"repeat.cache.run{n}.calls"] = float(calls)
        figures[f"repeat.cache.run{n}.wall_s"] = round(wall, 4)
    _, _, uncached = _planned(fake, analyst, "A different certificate expired this morning.")
    figures["repeat.uncached.calls"] = float(uncached)

    assert first is not None
    run_to_end(first, officer, doer)
    root = PlanNode.objects.get(version_id=first.current_version_id, parent=None)
    method = propose_method(
        user=officer,
        case_id=first.pk,
        node_id=root.pk,
        name="certificate-expiry",
        guard=[{"key": "kind", "op": "equals", "value": KIND}],
    )
    approve_method(user=second, method_id=method.pk)
    for n in range(1, RUNS + 1):
        case, wall, calls = _planned(fake, analyst, f"Certificate expiry number {n}, new text.")
        sources = set(
            PlanNode.objects.filter(version_id=case.current_version_id).values_list(
                "provenance__source", flat=True
            )
        )
        if sources != {method.source}:
            raise RuntimeError(f"run {n} was not planned by the promoted method: {sources}")
        figures[f"repeat.promoted.run{n}.calls"] = float(calls)
        figures[f"repeat.promoted.run{n}.wall_s"] = round(wall, 4)
    out.write_text(json.dumps(figures))


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
