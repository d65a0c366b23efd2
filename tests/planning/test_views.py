"""Case pages: who may see what, the submission form, live refresh, and constant query counts."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from planning.catalogue import sync_packs
from planning.models import Case, CaseStatus, PlanNode
from tests.personas import analyst as make_analyst
from tests.planning.factories import make_case, make_cases, make_plan

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def htmx_get(client: Client, url: str, target: str, **params: Any) -> Any:
    return client.get(url, params, HTTP_HX_REQUEST="true", HTTP_HX_TARGET=target)


@pytest.fixture
def packs(db: None) -> None:
    sync_packs()


@pytest.fixture
def other_case(db: None) -> Case:
    someone = make_analyst("bea")
    case = make_case(someone, title="Case of Bea")
    make_plan(case, leaves=3)
    return case


def first_leaf(case: Case) -> PlanNode:
    return PlanNode.objects.filter(version=case.current_version, kind="leaf").first()


# Authorization -------------------------------------------------------------------------------


def test_analyst_lists_only_own_cases(analyst: Any, other_case: Case) -> None:
    mine = make_case(analyst, title="My own case")
    response = client_for(analyst).get(reverse("planning:case-list"))
    assert response.status_code == 200
    assert mine.title in response.content.decode()
    assert other_case.title not in response.content.decode()


def test_analyst_gets_404_for_another_analysts_case_and_every_partial(
    analyst: Any, other_case: Case
) -> None:
    client = client_for(analyst)
    detail = reverse("planning:case-detail", args=[other_case.pk])
    node = reverse("planning:node-detail", args=[other_case.pk, first_leaf(other_case).pk])
    assert client.get(detail).status_code == 404
    assert htmx_get(client, detail, "case-live").status_code == 404
    assert htmx_get(client, detail, "node-panel").status_code == 404
    assert client.get(node).status_code == 404
    assert htmx_get(client, node, "node-panel").status_code == 404


@pytest.mark.parametrize("persona", ["officer", "auditor"])
def test_officers_and_auditors_read_every_case(
    persona: str, request: pytest.FixtureRequest, other_case: Case
) -> None:
    client = client_for(request.getfixturevalue(persona))
    assert other_case.title in client.get(reverse("planning:case-list")).content.decode()
    detail = client.get(reverse("planning:case-detail", args=[other_case.pk]))
    assert detail.status_code == 200
    assert "step-0" in detail.content.decode()
    node = first_leaf(other_case)
    panel = htmx_get(
        client, reverse("planning:node-detail", args=[other_case.pk, node.pk]), "node-panel"
    )
    assert panel.status_code == 200
    assert panel.content.decode().lstrip().startswith('<aside id="node-panel"')


def test_outsider_gets_403_for_the_list_and_404_for_a_case(outsider: Any, other_case: Case) -> None:
    client = client_for(outsider)
    assert client.get(reverse("planning:case-list")).status_code == 403
    assert client.get(reverse("planning:case-detail", args=[other_case.pk])).status_code == 404
    node = first_leaf(other_case)
    url = reverse("planning:node-detail", args=[other_case.pk, node.pk])
    assert htmx_get(client, url, "node-panel").status_code == 404


def test_admin_cannot_read_cases(admin_user: Any, other_case: Case) -> None:
    client = client_for(admin_user)
    assert client.get(reverse("planning:case-list")).status_code == 403
    assert client.get(reverse("planning:case-detail", args=[other_case.pk])).status_code == 404


def test_visitor_is_sent_to_the_login_page(other_case: Case) -> None:
    response = Client().get(reverse("planning:case-detail", args=[other_case.pk]))
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_node_of_another_case_is_404_under_a_case_one_may_see(
    analyst: Any, other_case: Case
) -> None:
    mine = make_case(analyst)
    make_plan(mine, leaves=2)
    foreign = first_leaf(other_case)
    url = reverse("planning:node-detail", args=[mine.pk, foreign.pk])
    client = client_for(analyst)
    assert client.get(url).status_code == 404
    assert htmx_get(client, url, "node-panel").status_code == 404


@pytest.mark.parametrize("persona", ["officer", "auditor", "outsider", "admin_user"])
def test_only_analysts_may_open_the_case_form(
    persona: str, request: pytest.FixtureRequest, packs: None
) -> None:
    client = client_for(request.getfixturevalue(persona))
    assert client.get(reverse("planning:case-new")).status_code == 403
    assert htmx_get(client, reverse("planning:case-new"), "llm-estimate").status_code == 403
    response = client.post(
        reverse("planning:case-new"),
        {"title": "t", "goal": "g", "strategy": "static", "max_depth": 2, "domain": "invoice",
         "input_invoice_id": "INV-1042"},
    )  # fmt: skip
    assert response.status_code == 403
    assert not Case.objects.exists()


# The submission form ---------------------------------------------------------------------------


def test_form_renders_the_chosen_domains_inputs_without_javascript(
    analyst: Any, packs: None
) -> None:
    client = client_for(analyst)
    page = client.get(reverse("planning:case-new"), {"domain": "invoice"}).content.decode()
    assert 'name="input_invoice_id"' in page
    assert 'name="input_check_purchase_order"' in page
    assert "none: plan from goal and description" in page
    fraud = client.get(reverse("planning:case-new"), {"domain": "fraud"}).content.decode()
    assert 'name="input_account_id"' in fraud and 'name="input_invoice_id"' not in fraud
    bare = client.get(reverse("planning:case-new")).content.decode()
    assert "input_invoice_id" not in bare


def test_domain_change_swaps_only_the_inputs_fieldset(analyst: Any, packs: None) -> None:
    response = htmx_get(
        client_for(analyst), reverse("planning:case-new"), "domain-inputs", domain="incident"
    )
    body = response.content.decode().strip()
    assert body.startswith('<fieldset id="domain-inputs"')
    assert 'name="input_service"' in body and 'name="input_severity"' in body
    assert "<html" not in body


def test_disabled_pack_is_not_offered(analyst: Any, packs: None) -> None:
    from planning.models import DomainPack

    DomainPack.objects.filter(slug="fraud").update(enabled=False)
    page = client_for(analyst).get(reverse("planning:case-new")).content.decode()
    assert 'value="fraud"' not in page
    assert 'value="invoice"' in page


@pytest.mark.parametrize(
    ("strategy", "depth", "expected"),
    [
        ("llm", 3, "Up to 31 LLM calls (b = 5, depth 3)"),
        ("llm", 1, "Up to 1 LLM call (b = 5, depth 1)"),
        ("hybrid", 2, "Up to 6 LLM calls (b = 5, depth 2), fewer when static methods"),
        ("static", 4, "No LLM calls"),
    ],
)
def test_expected_llm_calls_follow_strategy_and_depth(
    analyst: Any, packs: None, strategy: str, depth: int, expected: str
) -> None:
    response = htmx_get(
        client_for(analyst), reverse("planning:case-new"), "llm-estimate",
        strategy=strategy, max_depth=depth,
    )  # fmt: skip
    body = response.content.decode().strip()
    assert body.startswith('<p id="llm-estimate"')
    assert expected in body


def test_submitting_the_form_creates_the_case_and_opens_its_page(
    analyst: Any, packs: None, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client_for(analyst).post(
            reverse("planning:case-new"),
            {
                "domain": "invoice", "title": "Check INV-1042", "goal": "Verify the invoice",
                "description": "", "strategy": "static", "max_depth": "2",
                "input_invoice_id": "INV-1042", "input_check_purchase_order": "on",
            },
        )  # fmt: skip
    case = Case.objects.get()
    assert response.status_code == 302
    assert response.url == reverse("planning:case-detail", args=[case.pk])
    assert case.submitter == analyst
    assert case.inputs == {
        "invoice_id": "INV-1042", "check_purchase_order": True, "hold_on_findings": False,
    }  # fmt: skip
    assert case.status == CaseStatus.PLANNING
    assert len(callbacks) == 1  # planning is enqueued once the transaction commits


def test_invalid_submission_keeps_the_input_and_shows_errors_next_to_the_fields(
    analyst: Any, packs: None
) -> None:
    response = client_for(analyst).post(
        reverse("planning:case-new"),
        {
            "domain": "invoice", "title": "Keep <this> title", "goal": "",
            "description": "my notes", "strategy": "static", "max_depth": "2",
            "input_invoice_id": "not-an-invoice",
        },
    )  # fmt: skip
    assert response.status_code == 422
    page = response.content.decode()
    assert not Case.objects.exists()
    assert 'value="Keep &lt;this&gt; title"' in page
    assert "my notes" in page
    assert 'value="not-an-invoice"' in page
    assert 'data-field="goal"' in page
    goal_field = page.split('data-field="goal"', 1)[1].split('data-field="description"', 1)[0]
    assert "This field is required." in goal_field
    # Django's form check fails first on the goal; the pack's schema is checked by submit_case.
    response = client_for(analyst).post(
        reverse("planning:case-new"),
        {
            "domain": "invoice", "title": "t", "goal": "g", "strategy": "static",
            "max_depth": "2", "input_invoice_id": "INV-12",
        },
    )  # fmt: skip
    page = response.content.decode()
    invoice_field = page.split('data-field="input_invoice_id"', 1)[1].split("</div>", 3)
    assert "should match pattern" in "".join(invoice_field)
    assert 'value="INV-12"' in page
    assert not Case.objects.exists()


def test_static_strategy_without_domain_is_refused_next_to_the_domain(
    analyst: Any, packs: None
) -> None:
    response = client_for(analyst).post(
        reverse("planning:case-new"),
        {"domain": "", "title": "t", "goal": "g", "strategy": "static", "max_depth": "2"},
    )
    assert response.status_code == 422
    page = response.content.decode()
    after_domain = page.split('data-field="domain"', 1)[1]
    domain_field = after_domain.split('<fieldset id="domain-inputs"', 1)[0]
    assert "plans with a domain pack" in domain_field


# The case page -----------------------------------------------------------------------------------


def test_case_page_shows_header_dag_table_and_warnings(officer: Any, analyst: Any) -> None:
    case = make_case(analyst, title="Invoice <b>bold</b>")
    version = make_plan(case, leaves=4, groups=2)
    type(version).objects.filter(pk=version.pk).update(warnings=["dropped a <bad> entry"])
    page = client_for(officer).get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    assert "Invoice &lt;b&gt;bold&lt;/b&gt;" in page
    assert 'data-status="awaiting_approval"' in page
    assert "dropped a &lt;bad&gt; entry" in page
    assert "data-dot=" in page and "subgraph cluster_" in page
    assert page.count('<tr data-key="step-') == 4
    assert "vendor/viz/viz-global.js" in page


def test_failed_planning_shows_the_error(analyst: Any) -> None:
    case = make_case(analyst, status=CaseStatus.PLAN_FAILED, error="No LLM provider: set X")
    page = client_for(analyst).get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    assert "Planning failed." in page and "No LLM provider: set X" in page


@pytest.mark.parametrize(
    ("status", "polls"),
    [
        (CaseStatus.PLANNING, True),
        (CaseStatus.EXECUTING, True),
        (CaseStatus.APPROVED, True),
        (CaseStatus.AWAITING_APPROVAL, False),
        (CaseStatus.PLAN_FAILED, False),
        (CaseStatus.COMPLETED, False),
    ],
)
def test_live_part_polls_only_while_the_case_is_moving(
    analyst: Any, status: str, polls: bool
) -> None:
    case = make_case(analyst, status=status)
    client = client_for(analyst)
    url = reverse("planning:case-detail", args=[case.pk])
    partial = htmx_get(client, url, "case-live").content.decode().strip()
    assert partial.startswith('<div id="case-live"')
    assert ('hx-trigger="every 2s"' in partial) is polls
    assert ('hx-trigger="every 2s"' in client.get(url).content.decode()) is polls


def test_node_panel_shows_the_nodes_detail(analyst: Any) -> None:
    case = make_case(analyst)
    make_plan(case, leaves=3, labels={1: {"rationale": "needs <the> fields"}})
    node = PlanNode.objects.get(version=case.current_version, key="step-1")
    url = reverse("planning:node-detail", args=[case.pk, node.pk])
    client = client_for(analyst)
    panel = htmx_get(client, url, "node-panel").content.decode()
    assert "payments-auditor" in panel and "Do step 1" in panel
    assert "needs &lt;the&gt; fields" in panel
    assert "check_totals" in panel and "&quot;n&quot;: 1" in panel
    step0 = PlanNode.objects.get(version=case.current_version, key="step-0")
    assert reverse("planning:node-detail", args=[case.pk, step0.pk]) in panel  # dependency link
    assert "test-method" in panel and "depth 1" in panel
    full = client.get(url).content.decode()
    assert "<html" in full and 'id="node-panel"' in full


# Query counts ------------------------------------------------------------------------------------


def _count_case_page(client: Client, case: Case, captured: Any) -> int:
    with captured() as context:
        response = client.get(reverse("planning:case-detail", args=[case.pk]))
    assert response.status_code == 200
    return len(context.captured_queries)


def test_case_page_query_count_is_constant_up_to_500_leaves(
    officer: Any, analyst: Any, django_assert_num_queries: Any
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    small = make_case(analyst)
    make_plan(small, leaves=3, groups=1)
    big = make_case(analyst)
    make_plan(big, leaves=500, groups=20)
    client = client_for(officer)
    client.get(reverse("planning:case-detail", args=[small.pk]))  # warm the session

    def captured() -> CaptureQueriesContext:
        return CaptureQueriesContext(connection)

    baseline = _count_case_page(client, small, captured)
    with django_assert_num_queries(baseline):
        response = client.get(reverse("planning:case-detail", args=[big.pk]))
    assert response.content.decode().count('<tr data-key="step-') == 500
    with django_assert_num_queries(baseline):
        htmx_get(client, reverse("planning:case-detail", args=[big.pk]), "case-live")
    assert baseline <= 8


def test_case_list_query_count_is_constant_with_1000_cases(
    officer: Any, analyst: Any, django_assert_num_queries: Any
) -> None:
    client = client_for(officer)
    make_cases(analyst, 3)
    client.get(reverse("planning:case-list"))  # warm the session
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as few:
        client.get(reverse("planning:case-list"))
    make_cases(analyst, 1000)
    case = Case.objects.first()
    make_plan(case, leaves=2)
    with django_assert_num_queries(len(few.captured_queries)):
        response = client.get(reverse("planning:case-list"), {"page": 3})
    page = response.content.decode()
    assert page.count("<tr data-case=") == 25
    assert "Page 3 of 41" in page
    with django_assert_num_queries(len(few.captured_queries)):
        htmx_get(client, reverse("planning:case-list"), "case-table", status="awaiting_approval")
    assert len(few.captured_queries) <= 8


def test_case_list_filters_by_status_domain_and_mine(officer: Any, analyst: Any) -> None:
    make_case(analyst, title="Invoice waiting")
    make_case(analyst, title="Fraud failed", domain="fraud", status=CaseStatus.PLAN_FAILED)
    make_case(officer, title="Officer own", domain="", strategy="llm")
    client = client_for(officer)
    url = reverse("planning:case-list")

    def titles(**params: Any) -> set[str]:
        body = htmx_get(client, url, "case-table", **params).content.decode()
        assert body.lstrip().startswith('<div id="case-table"')
        return {t for t in ("Invoice waiting", "Fraud failed", "Officer own") if t in body}

    assert titles() == {"Invoice waiting", "Fraud failed", "Officer own"}
    assert titles(status="plan_failed") == {"Fraud failed"}
    assert titles(domain="fraud") == {"Fraud failed"}
    assert titles(domain="none") == {"Officer own"}
    assert titles(mine="1") == {"Officer own"}
    assert titles(mine="1", domain="invoice") == set()


def test_analyst_cannot_widen_the_list_with_filters(analyst: Any, other_case: Case) -> None:
    body = client_for(analyst).get(reverse("planning:case-list"), {"mine": "0"}).content.decode()
    assert other_case.title not in body
    assert 'name="mine"' not in body
