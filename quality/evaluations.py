"""The planning evaluation's results as the officers' page reads them: `eval/results/*.json`.

`make eval` writes one file per model (`eval/results/<model>.json`); this module reads the parts
the page shows (the run's metadata and the figures per strategy), checked with pydantic. A file
that is not such a result is named, not shown.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from pydantic import BaseModel, ConfigDict, ValidationError

RESULTS_DIR = Path(settings.BASE_DIR) / "eval" / "results"


class StrategyFigures(BaseModel):
    """One strategy's figures over the evaluation set."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    runs: int
    delivered_pct: float
    valid_pct: float
    node_f1: float
    edge_f1: float
    leaves: float
    depth: float
    critical_path: float
    llm_calls: int
    tokens: int
    repairs: int
    warnings: int
    wall_s: float
    cost_usd: float | None
    valid_by_pack: dict[str, float]

    # The page shows F1 on the scale of its percentages, 0 to 100 (the files keep 0 to 1).
    @property
    def node_f1_score(self) -> float:
        return f1_score(self.node_f1)

    @property
    def edge_f1_score(self) -> float:
        return f1_score(self.edge_f1)


def f1_score(f1: float) -> float:
    """Return an F1 (0 to 1) on the page's scale: 0 to 100, to one decimal."""
    return round(100 * f1, 1)


class Evaluation(BaseModel):
    """One model's evaluation run."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str
    date: str
    server: str
    server_version: str | None = None
    goals: int
    summary: dict[str, StrategyFigures]


@dataclass(frozen=True, slots=True, kw_only=True)
class Evaluations:
    """The readable results, by model name, and the files that could not be read."""

    results: tuple[Evaluation, ...]
    unreadable: tuple[str, ...]

    def chart_data(self) -> Mapping[str, object]:
        """Return what plan_evaluation.js draws: per model, per strategy, the rates in %."""
        return {
            result.model: {
                "labels": list(result.summary),
                "valid": [s.valid_pct for s in result.summary.values()],
                "delivered": [s.delivered_pct for s in result.summary.values()],
                "node_f1": [s.node_f1_score for s in result.summary.values()],
                "edge_f1": [s.edge_f1_score for s in result.summary.values()],
            }
            for result in self.results
        }


def read_evaluations(directory: Path | None = None) -> Evaluations:
    """Return the evaluation results under `directory` (default `eval/results/`), by model."""
    folder = RESULTS_DIR if directory is None else directory
    results: list[Evaluation] = []
    unreadable: list[str] = []
    for path in sorted(folder.glob("*.json")):
        try:
            results.append(Evaluation.model_validate(json.loads(path.read_text())))
        except (OSError, ValueError, ValidationError):
            unreadable.append(path.name)
    results.sort(key=lambda result: result.model)
    return Evaluations(results=tuple(results), unreadable=tuple(unreadable))
