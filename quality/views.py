"""The planning-quality pages: figures and plots over the filtered cases, one case's figures, and
each table as CSV.

Compliance officers (and supervisors) and admins read them; anybody else gets 403. Officers
read every case, so their tables name the cases; admins read no case, so theirs show case
numbers only. The figures come from `quality.queries`; these views read the filter and render.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from planning import rules
from planning.catalogue import registered_packs
from planning.models import Case, Strategy
from quality.evaluations import read_evaluations
from quality.queries import (
    CASE_TABLE_LIMIT,
    NO_PACK,
    PERIODS,
    FilterInvalid,
    QualityFilter,
    QualityReport,
    case_quality,
    parse_filter,
    quality_report,
)
from quality.tables import TABLES, csv_text, table_rows
from web.http import HtmxHttpRequest

TABLE_TITLES = {
    "series": "Over time",
    "strategies": "By strategy",
    "packs": "By pack",
    "gates": "Gate outcomes by strategy, pack and agent",
    "models": "LLM usage by model",
    "cases": "Per case",
}


def _require_reader(request: HtmxHttpRequest) -> None:
    if not rules.can_view_quality(request.user):
        raise PermissionDenied("Only compliance officers and admins read the quality metrics.")


def _chart_data(report: QualityReport) -> dict[str, Any]:
    """Return what quality.js draws: plain lists, one per series."""
    executed = [r for r in reversed(report.cases) if r.ratio is not None]
    step_rates = [g for g in report.gates if g.dimension == "strategy"]
    return {
        "series": {
            "labels": [p.start.isoformat() for p in report.series],
            "bucket": report.filter.bucket,
            "cases": [p.cases for p in report.series],
            "verified": [p.verified_rate for p in report.series],
            "edit_rate": [p.edit_rate for p in report.series],
            "reject_rate": [p.reject_rate for p in report.series],
            "tokens": [p.tokens for p in report.series],
            "cost": [float(p.cost) for p in report.series],
        },
        "strategies": {
            "labels": [g.key for g in report.strategies],
            "leaves": [g.mean_leaves for g in report.strategies],
            "depth": [g.mean_depth for g in report.strategies],
            "width": [g.mean_width for g in report.strategies],
            "critical_path": [g.mean_critical_path for g in report.strategies],
            "planning_s": [g.mean_planning_s for g in report.strategies],
            "approval_s": [g.mean_approval_s for g in report.strategies],
            "tokens": [g.tokens for g in report.strategies],
        },
        "gates": {
            "labels": [f"{g.value} · {g.kind}" for g in step_rates],
            "edit_rate": [g.edit_rate for g in step_rates],
            "reject_rate": [g.reject_rate for g in step_rates],
        },
        "ratio": {
            "labels": [f"#{r.case_id}" for r in executed],
            "values": [r.ratio for r in executed],
        },
    }


def _filter_choices(f: QualityFilter | None) -> dict[str, Any]:
    return {
        "periods": list(PERIODS),
        "packs": [NO_PACK, *sorted(registered_packs())],
        "strategies": Strategy.values,
        "selected": f.as_query() if f is not None else {},
    }


@require_GET
def quality(request: HtmxHttpRequest) -> HttpResponse:
    """Show the quality figures and plots of the cases the URL's filter selects.

    Raises PermissionDenied unless the user is a compliance officer or an admin; an invalid
    filter shows its message (400), with the filter form to choose again.
    """
    _require_reader(request)
    try:
        f = parse_filter(request.GET)
    except FilterInvalid as exc:
        context = {"error": exc, "choices": _filter_choices(None), "tables": []}
        return render(request, "quality/quality.html", context, status=400)
    report = quality_report(f)
    titles = rules.can_view_all_cases(request.user)
    query = urlencode(f.as_query())
    tables = []
    for name in TABLES:
        rows = table_rows(report, name, titles=titles)
        shown = rows[1 : CASE_TABLE_LIMIT + 1] if name == "cases" else rows[1:]
        tables.append(
            {
                "name": name,
                "title": TABLE_TITLES[name],
                "header": rows[0],
                "rows": shown,
                "total": len(rows) - 1,
                "query": query,
            }
        )
    context = {
        "report": report,
        "filter": f,
        "choices": _filter_choices(f),
        "tables": tables,
        "by_name": {t["name"]: t for t in tables},
        "data": _chart_data(report),
        "case_limit": CASE_TABLE_LIMIT,
        "titles": titles,
        "now": timezone.now(),
    }
    return render(request, "quality/quality.html", context)


def _bad_request(message: str) -> HttpResponse:
    return HttpResponse(
        f"Invalid request: {message}\n", status=400, content_type="text/plain; charset=utf-8"
    )


@require_GET
def quality_csv(request: HtmxHttpRequest) -> HttpResponse:
    """Return one table of the quality page as CSV (every case, not only the page's newest):
    `?table=` names it, the page's filter parameters select the cases.

    Raises PermissionDenied as the page does; an unknown table or an invalid filter answers 400
    with its message.
    """
    _require_reader(request)
    table = request.GET.get("table", "")
    if table not in TABLES:
        return _bad_request(f"table: {table[:40]!r} is not one of {', '.join(TABLES)}")
    try:
        f = parse_filter(request.GET)
    except FilterInvalid as exc:
        return _bad_request(str(exc))
    rows = table_rows(quality_report(f), table, titles=rules.can_view_all_cases(request.user))
    stamp = timezone.localtime().strftime("%Y%m%d")
    response = HttpResponse(csv_text(rows), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="casehub-quality-{table}-{stamp}.csv"'
    return response


@require_GET
def case_quality_page(request: HtmxHttpRequest, case_id: int) -> HttpResponse:
    """Show one case's quality figures and its gates' outcomes.

    Raises PermissionDenied as the quality page does, Http404 for no such case.
    """
    _require_reader(request)
    found = case_quality(case_id)
    if found is None:
        raise Http404("No such case")
    row, gates = found
    titles = rules.can_view_all_cases(request.user)
    context = {
        "row": row,
        "gates": gates,
        "titles": titles,
        "case": Case(pk=row.case_id, title=row.title) if titles else None,
    }
    return render(request, "quality/quality_case.html", context)


@require_GET
def plan_evaluation(request: HtmxHttpRequest) -> HttpResponse:
    """Show how good each strategy's plans are against the evaluation set's reference plans,
    per model that `make eval` was run on.

    Raises PermissionDenied unless the user is a compliance officer or an admin.
    """
    _require_reader(request)
    evaluations = read_evaluations()
    context = {"evaluations": evaluations, "data": evaluations.chart_data()}
    return render(request, "quality/plan_evaluation.html", context)
