"""`python -m eval` on the fake model, over loopback HTTP, on a subset of the goals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from eval.__main__ import main
from eval.fake_model import respond
from tests.fakes.openai_server import FakeOpenAIServer

SUBSET = ["--goals", "fraud-01", "incident-05", "general-04"]


def _run(out: Path, *extra: str) -> dict[str, Any]:
    assert main([*SUBSET, "--out", str(out), "--quiet", *extra]) == 0
    results: dict[str, Any] = json.loads((out / "fake-model.json").read_text())
    return results


def _without_times(results: dict[str, Any]) -> dict[str, Any]:
    results = dict(results, date=None)
    results["runs"] = [dict(run, wall_s=None) for run in results["runs"]]
    results["summary"] = {k: dict(v, wall_s=None) for k, v in results["summary"].items()}
    return results


def test_a_run_plans_every_applicable_strategy_and_writes_json_and_markdown(
    tmp_path: Path,
) -> None:
    results = _run(tmp_path)
    runs = {(run["goal"], run["strategy"]): run for run in results["runs"]}
    # static, forward and goal planning need a pack: the goal without one gets the four others
    assert {s for g, s in runs if g == "general-04-purge-audit"} == {
        "llm-d1",
        "llm-d2",
        "llm-d3",
        "hybrid",
    }
    assert len(runs) == 7 + 7 + 4
    static = runs[("fraud-01-large-transfer", "static")]
    assert static["valid"] and static["node_f1"] == static["edge_f1"] == 1.0
    assert static["llm_calls"] == 0
    assert static["critical_path"] == 5 and static["depth"] == 2
    # no static method covers a certificate expiry; hybrid asks the model for it
    assert runs[("incident-05-certificate", "static")]["failures"][0]["check"] == (
        "not_delivered.NoMethodMatched"
    )
    hybrid = runs[("incident-05-certificate", "hybrid")]
    assert hybrid["delivered"] and hybrid["llm_calls"] >= 1 and hybrid["tokens"] > 0
    # an LLM plan carries no tool: the fraud goal's required tools are missing
    llm = runs[("fraud-01-large-transfer", "llm-d2")]
    assert llm["delivered"] and not llm["valid"]
    assert "constraint.required_tool" in {f["check"] for f in llm["failures"]}
    assert results["summary"]["static"]["runs"] == 2
    table = (tmp_path / "fake-model.md").read_text()
    assert "| static | 2 | 50.0 | 50.0 | 0.500 | 0.500 |" in table
    assert "| fraud-01-large-transfer | easy | ✓ 1.00 / 1.00 |" in table


def test_two_runs_on_the_fake_model_score_the_same(tmp_path: Path) -> None:
    first = _run(tmp_path / "1", "--strategies", "llm-d1", "llm-d3", "hybrid")
    second = _run(tmp_path / "2", "--strategies", "llm-d1", "llm-d3", "hybrid")
    assert first["summary"]["llm-d3"]["llm_calls"] > 0
    assert _without_times(first) == _without_times(second)


def test_an_unknown_strategy_is_refused(tmp_path: Path) -> None:
    assert main([*SUBSET, "--out", str(tmp_path), "--strategies", "magic"]) == 2
    assert not (tmp_path / "fake-model.json").exists()


def test_a_named_model_on_openai_base_url_is_evaluated_and_priced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeOpenAIServer(model="local-model", responder=respond) as server:
        base_url = server.base_url
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        monkeypatch.setenv("CASEHUB_LLM_MODEL", "local/model:q4")
        monkeypatch.setenv("CASEHUB_LLM_PRICES", "local/model:q4=1/2")
        code = main(
            [
                *SUBSET,
                "--out",
                str(tmp_path),
                "--quiet",
                "--strategies",
                "llm-d1",
                "--server-version",
                "llama.cpp b1234",
            ]
        )
        assert code == 0
        sent = {request.body["model"] for request in server.requests}
    assert sent == {"local/model:q4"}
    results = json.loads((tmp_path / "local_model_q4.json").read_text())
    assert (results["model"], results["server"]) == ("local/model:q4", base_url)
    assert results["server_version"] == "llama.cpp b1234"
    run = results["runs"][0]
    # prompt tokens at $1 and completion tokens at $2 per million; the fake reports chars / 4
    assert run["tokens"] > 0
    assert 0 < run["cost_usd"] <= 2 * run["tokens"] / 1_000_000
    assert (tmp_path / "local_model_q4.md").exists()
