"""The planning-quality metrics: each figure on a small dataset built with the real actions, the
filters, the CSV export, who may read them, and constant query counts."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEvent
from execution import actions as execution
from oversight.actions.edits import edit_plan
from oversight.actions.gates import DecisionInput, decide_gate
from oversight.models import Gate, GateKind, GateStatus
from planning.core.llm.pricing import PriceTable
from planning.models import Case, CaseStatus, LlmCall, NodeStatus, PlanNode, PlanVersion
from quality import queries, tables
from tests.cases import planned_invoice_case
from tests.personas import PASSWORD

pytestmark = pytest.mark.django_db

# Leaf run times (start, end) in seconds after T0 for the executed case: the longest chain of
# run times is extract 10 + lookup 10 + check-duplicate 30 + audit 10 + hold 10 = 70 s, while
# the case took from 0 to 110 s.
TIMES = {
    "extract-fields": (0, 10),
    "lookup-supplier": (10, 20),
    "check-duplicate": (20, 50),
    "check-totals": (20, 30),
    "check-po": (25, 35),
    "audit-report": (60, 70),
    "place-hold": (100, 110),
}


def _pending(case: Case, kind: str, key: str | None = None) -> Gate:
    gates = Gate.objects.filter(case=case, kind=kind, status=GateStatus.PENDING)
    if key is not None:
        gates = gates.filter(node__key=key)
    return gates.get()


def _decide(gate: Gate, user: Any, decision: str = "approve", **kwargs: Any) -> None:
    decide_gate(gate_id=gate.pk, user=user, decision=DecisionInput(decision=decision, **kwargs))


def _leaves(case: Case) -> dict[str, PlanNode]:
    nodes = PlanNode.objects.filter(version_id=case.current_version_id, kind="leaf")
    return {n.key: n for n in nodes}


def _run_ready(case: Case) -> None:
    while ready := [n for n in _leaves(case).values() if n.status == NodeStatus.READY]:
        for node in ready:
            execution.execute_leaf(node.pk, worker="test")


def executed_case(analyst: Any, officer: Any) -> Case:
    """The invoice case approved, run (its first step once lost and retried) and completed,
    with exact timestamps and two priced LLM calls."""
    case = planned_invoice_case(analyst)
    _decide(_pending(case, GateKind.PLAN), officer)
    first = _leaves(case)["extract-fields"]
    execution.claim_leaf(first.pk, worker="lost")
    PlanNode.objects.filter(pk=first.pk).update(lease_until="2000-01-01T00:00:00Z")
    assert execution.reconcile_execution().recovered == (first.pk,)
    _run_ready(case)
    _decide(_pending(case, GateKind.STEP, "place-hold"), officer, password=PASSWORD)
    _run_ready(case)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    # Timestamps only: the run times above, planning 2.5 s, approval 120 s after the plan.
    started = (
        AuditEvent.objects.filter(chain=f"case:{case.pk}", action="planning.plan.started")
        .values_list("time", flat=True)
        .get()
    )
    planned = started + timedelta(seconds=2.5)
    PlanVersion.objects.filter(pk=case.current_version_id).update(created_at=planned)
    Gate.objects.filter(case=case, kind=GateKind.PLAN).update(
        decided_at=planned + timedelta(seconds=120)
    )
    t0 = planned + timedelta(seconds=200)
    for key, (start, end) in TIMES.items():
        PlanNode.objects.filter(version_id=case.current_version_id, key=key).update(
            started_at=t0 + timedelta(seconds=start), finished_at=t0 + timedelta(seconds=end)
        )
    for prompt, completion, latency in ((1000, 500, 200), (3000, 1000, 400)):
        LlmCall.objects.create(
            case=case,
            model="gpt-4o-mini",
            purpose="llm_step",
            prompt_hash="0" * 64,
            prompt_tokens=prompt,
            completion_tokens=completion,
            latency_ms=latency,
        )
    return case


def reviewed_case(analyst: Any, officer: Any, reviewer: Any) -> Case:
    """The invoice case edited once by an officer (its hold step), then its plan rejected by
    another (an editor may not decide their own version); one LLM call of a model with no
    price."""
    case = planned_invoice_case(analyst)
    edit_plan(
        case_id=case.pk,
        user=officer,
        node_key="place-hold",
        changes={"task": "Place a payment hold and tell the supplier"},
        reason_code="incomplete",
        reason="tell the supplier too",
    )
    case.refresh_from_db()
    _decide(_pending(case, GateKind.PLAN), reviewer, "reject", reason_code="incorrect", reason="no")
    LlmCall.objects.create(
        case=case, model="mystery-model", prompt_hash="0" * 64, prompt_tokens=10, latency_ms=50
    )
    return case


@pytest.fixture
def priced(settings: Any) -> None:
    settings.CASEHUB_LLM_PRICE_TABLE = PriceTable.parse("gpt-4o-mini=0.15/0.60")


@pytest.fixture
def dataset(analyst: Any, officer: Any, second_officer: Any, priced: None) -> tuple[Case, Case]:
    return executed_case(analyst, officer), reviewed_case(analyst, officer, second_officer)


def _report(**params: str) -> queries.QualityReport:
    return queries.quality_report(queries.parse_filter(params))


def _row(report: queries.QualityReport, case: Case) -> queries.CaseQuality:
    return next(r for r in report.cases if r.case_id == case.pk)


# Figures -------------------------------------------------------------------------------------


def test_an_executed_case_has_its_plan_llm_timing_and_execution_figures(dataset):
    done, _ = dataset
    row = _row(_report(), done)
    assert (row.version, row.versions, row.leaves, row.depth, row.width) == (1, 1, 7, 1, 3)
    assert row.critical_path == 5
    assert (row.llm_calls, row.prompt_tokens, row.completion_tokens) == (2, 4000, 1500)
    assert row.latency_ms == 600
    # 4,000 prompt tokens at $0.15 and 1,500 completion tokens at $0.60 per million.
    assert row.cost == Decimal("0.0015") and row.unpriced_models == ()
    assert row.planning_s == pytest.approx(2.5)
    assert row.approval_s == pytest.approx(120)
    assert (row.leaves_succeeded, row.leaves_failed) == (7, 0)
    assert (row.attempts, row.retries) == (8, 1)
    assert row.makespan_s == pytest.approx(110)
    assert row.path_s == pytest.approx(70)
    assert row.ratio == pytest.approx(110 / 70)
    assert row.verified is True


def test_an_edited_then_rejected_case_counts_its_gates_and_an_unknown_price(dataset):
    _, reviewed = dataset
    report = _report()
    row = _row(report, reviewed)
    assert (row.version, row.versions, row.status) == (2, 2, CaseStatus.REJECTED)
    assert row.cost is None and row.unpriced_models == ("mystery-model",)
    assert row.approval_s is None and row.ratio is None and row.verified is None
    rates = {(g.dimension, g.value, g.kind): g for g in report.gates}
    plan = rates[("strategy", "static", "plan")]
    # The executed case's plan gate approved; the edit closed version 1's; version 2's rejected.
    assert (plan.approved, plan.rejected, plan.edited) == (1, 1, 1)
    assert plan.edit_rate == pytest.approx(1 / 3) and plan.reject_rate == pytest.approx(1 / 3)
    step = rates[("strategy", "static", "step")]
    # The hold approved on the executed case; the hold edited on the reviewed one (its version-2
    # gate was voided by the rejection: not counted).
    assert (step.approved, step.rejected, step.edited) == (1, 0, 1)
    assert rates[("agent", "payments-clerk", "step")].edited == 1
    assert rates[("pack", "invoice", "plan")].decided == 3
    _, gates = queries.case_quality(reviewed.pk)
    assert {g.kind: (g.approved, g.rejected, g.edited) for g in gates} == {
        "plan": (0, 1, 1),
        "step": (0, 0, 1),
    }


def test_strategy_totals_models_and_series_add_up(dataset):
    report = _report()
    (static,) = report.strategies
    assert static.key == "static" and static.cases == 2
    assert static.mean_leaves == pytest.approx(7)
    assert static.llm_calls == 3 and static.tokens == 5510
    assert static.mean_latency_ms == pytest.approx(650 / 3)
    # The priced part is summed; the unpriced model is named, never taken as free.
    assert static.cost == Decimal("0.0015") and static.unpriced_models == ("mystery-model",)
    assert static.mean_planning_s is not None
    assert static.verified == 1 and static.verification_runs == 1
    assert static.leaf_success == pytest.approx(1.0) and static.retries == 1
    assert static.mean_ratio == pytest.approx(110 / 70)
    models = {m.model: m for m in report.models}
    assert models["gpt-4o-mini"].cost == Decimal("0.0015")
    assert models["mystery-model"].cost is None
    assert [p.start for p in report.series][-1] == timezone.localdate()
    assert len(report.series) == 30
    today = report.series[-1]
    assert today.cases == 2 and today.verified_rate == pytest.approx(1.0)
    assert (today.gates_decided, today.gates_edited, today.gates_rejected) == (5, 2, 1)
    assert sum(p.cases for p in report.series) == 2


def test_filters_select_by_period_pack_and_strategy(dataset):
    done, reviewed = dataset
    Case.objects.filter(pk=reviewed.pk).update(created_at=timezone.now() - timedelta(days=40))
    assert [r.case_id for r in _report(period="30d").cases] == [done.pk]
    assert {r.case_id for r in _report(period="90d").cases} == {done.pk, reviewed.pk}
    assert len(_report(period="90d").series) == len({p.start for p in _report(period="90d").series})
    weekly = _report(period="90d")
    assert weekly.filter.bucket == "week"
    assert all(p.start.weekday() == 0 for p in weekly.series)
    # The gates land in the week the database truncates their opening to, the same as Python's.
    assert sum(p.gates_decided for p in weekly.series) == 5
    assert sum(p.cases for p in weekly.series) == 2
    assert [r.case_id for r in _report(pack="invoice").cases] == [done.pk]
    assert _report(pack="none").cases == []
    assert _report(strategy="llm").cases == [] and _report(strategy="llm").gates == []
    past = (timezone.localdate() - timedelta(days=40)).isoformat()
    ranged = _report(**{"from": past, "to": past})
    assert [r.case_id for r in ranged.cases] == [reviewed.pk]
    assert ranged.filter.as_query() == {"from": past, "to": past}


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"period": "5y"}, "period"),
        ({"pack": "nope"}, "pack"),
        ({"strategy": "magic"}, "strategy"),
        ({"from": "2026-13-01"}, "from"),
        ({"from": "yesterday"}, "from"),
        ({"from": "2026-02-02", "to": "2026-02-01"}, "from"),
        ({"period": "7d", "from": "2026-02-01"}, "period"),
    ],
)
def test_an_invalid_filter_names_its_parameter(params, name):
    with pytest.raises(queries.FilterInvalid) as caught:
        queries.parse_filter(params)
    assert caught.value.name == name


def test_the_critical_path_in_time_follows_dependencies_not_the_sum():
    leaves = [
        ("a", [], 5.0, 0),
        ("b", ["a"], 1.0, 1),
        ("c", ["a"], 7.0, 2),
        ("d", ["b", "c"], 2.0, 3),
        ("e", [], 13.0, 4),
    ]
    assert queries._longest_path(leaves) == 14.0
    assert queries._longest_path([]) == 0.0


def test_csv_cells_that_start_a_formula_get_an_apostrophe():
    text = tables.csv_text([["=1+1", "+2", "-3", "@SUM(A1)", "plain", ""]])
    assert next(csv.reader(io.StringIO(text))) == ["'=1+1", "'+2", "'-3", "'@SUM(A1)", "plain", ""]


# Pages ---------------------------------------------------------------------------------------


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_officers_read_the_page_with_its_plots_tables_and_csv_links(dataset, officer):
    done, _ = dataset
    response = _client(officer).get(reverse("quality:quality"))
    assert response.status_code == 200
    html = response.content.decode()
    for chart in ("chart-series", "chart-tokens", "chart-shape", "chart-times", "chart-gates"):
        assert f'id="{chart}"' in html
    assert 'id="quality-data"' in html and "vendor/chartjs/chart.umd.js" in html
    for table in tables.TABLES:
        assert f'data-csv="{table}"' in html
    assert "Verify INV-1042" in html and "price unknown" in html
    csv_link = reverse("quality:quality-csv") + "?table=cases&amp;period=30d"
    assert f'href="{csv_link}"' in html
    filtered = _client(officer).get(reverse("quality:quality"), {"pack": "invoice"})
    assert "?table=gates&amp;period=30d&amp;pack=invoice" in filtered.content.decode()
    assert reverse("quality:case-quality", args=[done.pk]) in html
    assert response.context["data"]["ratio"]["values"] == [pytest.approx(110 / 70)]
    assert b'data-nav="quality"' in response.content


def test_the_case_page_shows_one_cases_figures(dataset, officer):
    done, _ = dataset
    response = _client(officer).get(reverse("quality:case-quality", args=[done.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    assert "1.57" in html and "$0.0015" in html and "passed" in html
    assert _client(officer).get(reverse("quality:case-quality", args=[999999])).status_code == 404


def test_the_case_page_links_its_quality_figures_for_those_who_may_read_them(analyst, officer):
    case = planned_invoice_case(analyst)
    link = reverse("quality:case-quality", args=[case.pk]).encode()
    page = reverse("planning:case-detail", args=[case.pk])
    assert link in _client(officer).get(page).content
    assert link not in _client(analyst).get(page).content


def test_the_csv_export_is_an_attachment_with_every_case_and_safe_cells(analyst, officer, priced):
    case = planned_invoice_case(analyst, goal="Verify invoice INV-1042 again")
    Case.objects.filter(pk=case.pk).update(title='=HYPERLINK("http://x")')
    response = _client(officer).get(reverse("quality:quality-csv"), {"table": "cases"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith(
        'attachment; filename="casehub-quality-cases-'
    )
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0][:3] == ["case", "title", "pack"]
    assert rows[1][0] == str(case.pk) and rows[1][1] == '\'=HYPERLINK("http://x")'
    gates = _client(officer).get(reverse("quality:quality-csv"), {"table": "gates"})
    assert next(csv.reader(io.StringIO(gates.content.decode())))[0] == "by"


def test_admins_read_the_figures_without_case_titles(analyst, admin_user):
    planned_invoice_case(analyst)
    client = _client(admin_user)
    page = client.get(reverse("quality:quality"))
    assert page.status_code == 200 and "Verify INV-1042" not in page.content.decode()
    rows = list(
        csv.reader(
            io.StringIO(
                client.get(reverse("quality:quality-csv"), {"table": "cases"}).content.decode()
            )
        )
    )
    assert "title" not in rows[0] and len(rows) == 2


def test_analysts_auditors_and_outsiders_are_refused(analyst, auditor, outsider):
    case = planned_invoice_case(analyst)
    for user in (analyst, auditor, outsider):
        client = _client(user)
        assert client.get(reverse("quality:quality")).status_code == 403
        assert client.get(reverse("quality:quality-csv"), {"table": "cases"}).status_code == 403
        assert client.get(reverse("quality:case-quality", args=[case.pk])).status_code == 403
    nav = _client(analyst).get(reverse("home")).content
    assert b'data-nav="quality"' not in nav


def test_an_invalid_filter_shows_its_message_and_the_csv_answers_400(officer):
    client = _client(officer)
    page = client.get(reverse("quality:quality"), {"period": "5y"})
    assert page.status_code == 400
    assert (
        "unknown period" in page.content.decode() and 'data-error="period"' in page.content.decode()
    )
    assert (
        client.get(reverse("quality:quality-csv"), {"table": "cases", "pack": "x"}).status_code
        == 400
    )
    bad_table = client.get(reverse("quality:quality-csv"), {"table": "secrets"})
    assert bad_table.status_code == 400 and b"not one of" in bad_table.content


# Query counts --------------------------------------------------------------------------------


def _queries(run: Any) -> int:
    with CaptureQueriesContext(connection) as captured:
        run()
    return len(captured.captured_queries)


def test_the_report_and_the_page_take_the_same_queries_for_3_and_30_cases(
    analyst, officer, second_officer, priced, django_assert_num_queries
):
    executed_case(analyst, officer)
    reviewed_case(analyst, officer, second_officer)
    planned_invoice_case(analyst)
    client = _client(officer)
    url = reverse("quality:quality")
    client.get(url)  # warm the session and the permission caches
    # Cases with their figures, LLM usage per case and per model, the executed plans' leaves,
    # gates by strategy, pack and agent, gates per day.
    with django_assert_num_queries(8):
        _report()
    page_small = _queries(lambda: client.get(url))
    csv_small = _queries(lambda: client.get(reverse("quality:quality-csv"), {"table": "cases"}))
    for _ in range(9):
        executed_case(analyst, officer)
        reviewed_case(analyst, officer, second_officer)
        planned_invoice_case(analyst)
    assert Case.objects.count() == 30
    with django_assert_num_queries(8):
        report = _report()
    assert len(report.cases) == 30 and sum(1 for r in report.cases if r.ratio) == 10
    assert _queries(lambda: client.get(url)) == page_small
    csv_large = _queries(lambda: client.get(reverse("quality:quality-csv"), {"table": "cases"}))
    assert csv_large == csv_small
