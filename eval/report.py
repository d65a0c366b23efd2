"""Summaries of the runs, the results file and its Markdown table."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from eval.scoring import count_by_check, mean

PACK_ORDER = ("invoice", "fraud", "incident", "none")


def file_stem(model: str) -> str:
    """Return the results file name of a model (`eval/results/<stem>.json`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("._") or "model"


def _percent(part: int, whole: int) -> float:
    return round(100 * part / whole, 1) if whole else 0.0


def summarise(runs: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> dict[str, Any]:
    """Return per strategy: runs, delivered and valid %, mean F1s and plan figures, totals.

    F1 means count a run that delivered nothing as 0; plan sizes are over delivered plans.
    """
    summary: dict[str, Any] = {}
    for label in labels:
        mine = [r for r in runs if r["strategy"] == label]
        if not mine:
            continue
        delivered = [r for r in mine if r["delivered"]]
        costs = [r["cost_usd"] for r in mine]
        summary[label] = {
            "runs": len(mine),
            "delivered_pct": _percent(len(delivered), len(mine)),
            "valid_pct": _percent(sum(1 for r in mine if r["valid"]), len(mine)),
            "node_f1": round(mean([r["node_f1"] for r in mine]), 3),
            "edge_f1": round(mean([r["edge_f1"] for r in mine]), 3),
            "leaves": round(mean([r["leaves"] for r in delivered]), 2),
            "depth": round(mean([r["depth"] for r in delivered]), 2),
            "critical_path": round(mean([r["critical_path"] for r in delivered]), 2),
            "llm_calls": sum(r["llm_calls"] for r in mine),
            "tokens": sum(r["tokens"] for r in mine),
            "repairs": sum(r["repairs"] for r in mine),
            "warnings": sum(len(r["warnings"]) for r in mine),
            "wall_s": round(sum(r["wall_s"] for r in mine), 3),
            "cost_usd": None if None in costs else round(sum(costs), 6),
            "valid_by_pack": {
                pack: _percent(
                    sum(1 for r in mine if r["pack"] == pack and r["valid"]),
                    sum(1 for r in mine if r["pack"] == pack),
                )
                for pack in PACK_ORDER
                if any(r["pack"] == pack for r in mine)
            },
            "failures": count_by_check([f for r in mine for f in r["failures"]]),
        }
    return summary


def _cost(value: float | None) -> str:
    return "unpriced" if value is None else f"${value:.4f}"


def markdown(results: Mapping[str, Any]) -> str:
    """Return the results as Markdown: the table per strategy, by pack, failures, per goal."""
    summary: Mapping[str, Any] = results["summary"]
    labels = list(summary)
    lines = [
        f"# Planning evaluation: {results['model']}",
        "",
        f"Run {results['date']} on {results['server']}"
        + (f" ({results['server_version']})" if results.get("server_version") else "")
        + f"; {results['goals']} goals. How to read it: "
        "[Evaluating plans](../../docs/planning.md#evaluating-plans).",
        "",
        *([f"Note: {results['note']}", ""] if results.get("note") else []),
        "| strategy | runs | delivered % | valid % | node F1 | edge F1 | leaves | depth "
        "| critical path | LLM calls | tokens | repairs | warnings | wall s | cost |",
        "|---|" + "---:|" * 14,
    ]
    for label, s in summary.items():
        lines.append(
            f"| {label} | {s['runs']} | {s['delivered_pct']:.1f} | {s['valid_pct']:.1f} "
            f"| {s['node_f1']:.3f} | {s['edge_f1']:.3f} | {s['leaves']:.2f} | {s['depth']:.2f} "
            f"| {s['critical_path']:.2f} | {s['llm_calls']} | {s['tokens']} | {s['repairs']} "
            f"| {s['warnings']} | {s['wall_s']:.2f} | {_cost(s['cost_usd'])} |"
        )
    packs = [p for p in PACK_ORDER if any(p in s["valid_by_pack"] for s in summary.values())]
    lines += [
        "",
        "## Valid plans by pack (%)",
        "",
        "| strategy | " + " | ".join(packs) + " |",
        "|---|" + "---:|" * len(packs),
    ]
    for label, s in summary.items():
        cells = [f"{s['valid_by_pack'][p]:.1f}" if p in s["valid_by_pack"] else "—" for p in packs]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    checks = sorted({c for s in summary.values() for c in s["failures"]})
    lines += ["", "## Why plans were not valid (failed checks)", ""]
    if checks:
        lines += [
            "| check | " + " | ".join(labels) + " |",
            "|---|" + "---:|" * len(labels),
        ]
        for check in checks:
            cells = [str(summary[label]["failures"].get(check, 0)) for label in labels]
            lines.append(f"| {check} | " + " | ".join(cells) + " |")
    else:
        lines.append("Every plan was valid.")
    lines += [
        "",
        "## Per goal (valid ✓ or not ✗, then node F1 / edge F1; — : the strategy does not apply)",
        "",
        "| goal | kind | " + " | ".join(labels) + " |",
        "|---|---|" + "---|" * len(labels),
    ]
    by_goal: dict[str, dict[str, Mapping[str, Any]]] = {}
    kinds: dict[str, str] = {}
    for run in results["runs"]:
        by_goal.setdefault(run["goal"], {})[run["strategy"]] = run
        kinds[run["goal"]] = run["kind"]
    for goal, mine in by_goal.items():
        cells = []
        for label in labels:
            run = mine.get(label)
            if run is None:
                cells.append("—")
            else:
                mark = "✓" if run["valid"] else "✗"
                cells.append(f"{mark} {run['node_f1']:.2f} / {run['edge_f1']:.2f}")
        lines.append(f"| {goal} | {kinds[goal]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
