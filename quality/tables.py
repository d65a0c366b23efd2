"""The quality report as tables: for the page's accessible tables and for the CSV export.

Every table is a header row and rows of display strings; CSV cells that a spreadsheet would read
as a formula (= + - @) get a leading apostrophe.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from decimal import Decimal

from django.utils import timezone

from quality.queries import CaseQuality, GroupQuality, QualityReport

__all__ = ["GROUP_HEADER", "TABLES", "csv_text", "table_rows"]


def _num(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _money(value: Decimal | None, unpriced: Sequence[str] = ()) -> str:
    if unpriced:
        known = f"{value:.4f} + " if value else ""
        return f"{known}price unknown ({', '.join(unpriced)})"
    return "" if value is None else f"{value:.4f}"


def _rate(value: float | None) -> str:
    return "" if value is None else f"{value * 100:.1f}%"


def _group_row(g: GroupQuality) -> list[str]:
    return [
        g.key,
        str(g.cases),
        _num(g.mean_leaves),
        _num(g.mean_depth),
        _num(g.mean_width),
        _num(g.mean_critical_path),
        str(g.llm_calls),
        str(g.tokens),
        _num(g.mean_latency_ms, 0),
        _money(g.cost, g.unpriced_models),
        _num(g.mean_planning_s),
        _num(g.mean_approval_s, 0),
        _rate(g.leaf_success),
        str(g.retries),
        _num(g.mean_ratio),
        _rate(g.verified_rate),
        str(g.verification_runs),
    ]


GROUP_HEADER = [
    "cases",
    "mean leaves",
    "mean depth",
    "mean width",
    "mean critical path (steps)",
    "LLM calls",
    "tokens",
    "mean latency per call (ms)",
    "estimated cost (USD)",
    "mean planning time (s)",
    "mean time to approval (s)",
    "leaf success",
    "retries",
    "mean makespan ÷ critical path",
    "verification pass rate",
    "verified cases",
]


def _case_table(rows: Sequence[CaseQuality], *, titles: bool) -> list[list[str]]:
    return [
        [
            str(r.case_id),
            *([r.title] if titles else []),
            r.pack,
            r.strategy,
            r.status,
            timezone.localtime(r.created_at).strftime("%Y-%m-%d %H:%M"),
            "" if r.version is None else str(r.version),
            "" if r.leaves is None else str(r.leaves),
            "" if r.depth is None else str(r.depth),
            "" if r.width is None else str(r.width),
            "" if r.critical_path is None else str(r.critical_path),
            str(r.llm_calls),
            str(r.tokens),
            str(r.latency_ms),
            _money(r.cost, r.unpriced_models),
            _num(r.planning_s),
            _num(r.approval_s, 0),
            f"{r.leaves_succeeded}/{r.leaves_succeeded + r.leaves_failed}",
            str(r.retries),
            _num(r.makespan_s),
            _num(r.path_s),
            _num(r.ratio),
            "" if r.verified is None else ("passed" if r.verified else "failed"),
        ]
        for r in rows
    ]


TABLES = ("cases", "strategies", "packs", "gates", "models", "series")


def table_rows(report: QualityReport, table: str, *, titles: bool) -> list[list[str]]:
    """Return a table of the report as text cells, its header first (the page shows the same
    cells). Raises KeyError for a table not in TABLES."""
    if table == "cases":
        header = [
            "case",
            *(["title"] if titles else []),
            "pack",
            "strategy",
            "status",
            "created",
            "version",
            "leaves",
            "depth",
            "width",
            "critical path (steps)",
            "LLM calls",
            "tokens",
            "LLM latency (ms)",
            "estimated cost (USD)",
            "planning time (s)",
            "time to approval (s)",
            "leaves succeeded",
            "retries",
            "makespan (s)",
            "critical path (s)",
            "makespan ÷ critical path",
            "goal verification",
        ]
        return [header, *_case_table(report.cases, titles=titles)]
    if table == "strategies":
        return [["strategy", *GROUP_HEADER], *(_group_row(g) for g in report.strategies)]
    if table == "packs":
        return [["pack", *GROUP_HEADER], *(_group_row(g) for g in report.packs)]
    if table == "gates":
        header = ["by", "value", "gate kind", "closed", "approved", "rejected", "edited"]
        return [
            [*header, "edit rate", "reject rate"],
            *(
                [
                    g.dimension,
                    g.value or "(none)",
                    g.kind,
                    str(g.decided),
                    str(g.approved),
                    str(g.rejected),
                    str(g.edited),
                    _rate(g.edit_rate),
                    _rate(g.reject_rate),
                ]
                for g in report.gates
            ),
        ]
    if table == "models":
        return [
            ["model", "calls", "prompt tokens", "completion tokens", "estimated cost (USD)"],
            *(
                [
                    m.model,
                    str(m.calls),
                    str(m.prompt_tokens),
                    str(m.completion_tokens),
                    "price unknown" if m.cost is None else f"{m.cost:.4f}",
                ]
                for m in report.models
            ),
        ]
    if table == "series":
        return [
            [
                report.filter.bucket,
                "cases",
                "mean leaves",
                "tokens",
                "estimated cost (USD)",
                "verification pass rate",
                "gates closed",
                "gate edit rate",
                "gate reject rate",
            ],
            *(
                [
                    p.start.isoformat(),
                    str(p.cases),
                    _num(p.mean_leaves),
                    str(p.tokens),
                    f"{p.cost:.4f}" + (" + price unknown" if p.unpriced else ""),
                    _rate(p.verified_rate),
                    str(p.gates_decided),
                    _rate(p.edit_rate),
                    _rate(p.reject_rate),
                ]
                for p in report.series
            ),
        ]
    raise KeyError(table)


def _safe_cell(cell: str) -> str:
    # A spreadsheet runs a cell starting with = + - @ (or a tab/CR) as a formula.
    return "'" + cell if cell[:1] in ("=", "+", "-", "@", "\t", "\r") else cell


def csv_text(rows: Iterable[Sequence[str]]) -> str:
    """Return the rows as CSV, every cell safe from formula injection."""
    out = io.StringIO()
    writer = csv.writer(out)
    for row in rows:
        writer.writerow([_safe_cell(cell) for cell in row])
    return out.getvalue()
