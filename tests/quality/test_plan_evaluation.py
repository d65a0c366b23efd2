"""The officers' page of the planning evaluation: `eval/results/*.json` per model, with plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from quality import evaluations

URL = "quality:plan-evaluation"


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _result(model: str, valid_pct: float) -> dict[str, Any]:
    figures = {
        "runs": 2,
        "delivered_pct": 100.0,
        "valid_pct": valid_pct,
        "node_f1": 0.5,
        "edge_f1": 0.25,
        "leaves": 3.0,
        "depth": 1.0,
        "critical_path": 2.0,
        "llm_calls": 4,
        "tokens": 900,
        "repairs": 1,
        "warnings": 0,
        "wall_s": 0.5,
        "cost_usd": None,
        "valid_by_pack": {"fraud": valid_pct, "none": 0.0},
        "failures": {},
    }
    return {
        "model": model,
        "date": "2026-12-04T20:00:00Z",
        "server": "llama.cpp on loopback",
        "server_version": "b4567",
        "goals": 2,
        "strategies": ["llm-d2"],
        "summary": {"llm-d2": figures},
        "runs": [],
    }


def test_officers_read_the_committed_fake_model_results_with_a_plot(officer):
    response = _client(officer).get(reverse(URL))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-model="fake-model"' in html and 'id="evaluation-data"' in html
    for strategy in ("static", "forward", "goal", "llm-d1", "llm-d2", "llm-d3", "hybrid"):
        assert f'data-strategy="{strategy}"' in html
    assert "vendor/chartjs/chart.umd.js" in html and "quality/plan_evaluation.js" in html
    assert response.context["data"]["fake-model"]["labels"][0] == "static"


def test_the_page_shows_every_model_and_names_a_file_it_cannot_read(
    officer, admin_user, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, django_assert_num_queries
):
    (tmp_path / "small.json").write_text(json.dumps(_result("small-model", 40.0)))
    (tmp_path / "big.json").write_text(json.dumps(_result("big-model", 90.0)))
    (tmp_path / "notes.json").write_text('{"model": "half a result"}')
    monkeypatch.setattr(evaluations, "RESULTS_DIR", tmp_path)
    client = _client(admin_user)
    # the session, the user, its permissions (two) and the navigation: none for the results
    with django_assert_num_queries(5):
        response = client.get(reverse(URL))
    assert response.status_code == 200
    html = response.content.decode()
    assert html.index('data-model="big-model"') < html.index('data-model="small-model"')
    assert "llama.cpp on loopback (b4567)" in html and "price unknown" in html
    assert 'data-unreadable="notes.json"' in html
    assert response.context["data"]["small-model"]["valid"] == [40.0]
    assert response.context["data"]["small-model"]["edge_f1"] == [25.0]
    assert _client(officer).get(reverse(URL)).status_code == 200


def test_the_page_shows_f1_on_one_scale_in_the_table_and_the_plot(
    officer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "m.json").write_text(json.dumps(_result("m", 40.0)))
    monkeypatch.setattr(evaluations, "RESULTS_DIR", tmp_path)
    response = _client(officer).get(reverse(URL))
    html = response.content.decode()
    row = html.split('<tr data-strategy="llm-d2">', 1)[1].split("</tr>", 1)[0]
    cells = [cell.split("</td>", 1)[0] for cell in row.split("<td>")[1:]]
    # runs, then delivered %, valid %, node F1, edge F1: the F1 of the plot, 0 to 100
    assert cells[1:5] == ["100.0", "40.0", "50.0", "25.0"]
    assert response.context["data"]["m"]["node_f1"] == [50.0]
    assert "node F1 (0 to 100)" in html and "0.500" not in html


def test_without_results_the_page_says_how_to_make_them(
    officer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(evaluations, "RESULTS_DIR", tmp_path)
    html = _client(officer).get(reverse(URL)).content.decode()
    assert 'data-empty="evaluations"' in html and "make eval" in html


def test_a_model_name_from_a_results_file_is_escaped(
    officer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "x.json").write_text(json.dumps(_result("<script>alert(1)</script>", 1.0)))
    monkeypatch.setattr(evaluations, "RESULTS_DIR", tmp_path)
    html = _client(officer).get(reverse(URL)).content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_analysts_auditors_and_outsiders_are_refused(analyst, auditor, outsider):
    for user in (analyst, auditor, outsider):
        assert _client(user).get(reverse(URL)).status_code == 403


def test_the_quality_page_links_the_evaluation(officer):
    html = _client(officer).get(reverse("quality:quality")).content.decode()
    assert f'href="{reverse(URL)}"' in html
