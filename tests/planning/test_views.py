"""Case pages: who may see what, the submission form, a step's URL, error pages, live refresh,
and constant query counts."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from observability.metrics import EventCount
from planning import rules
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


class FormReader(HTMLParser):
    """Read a page's form as a browser would submit it untouched, and each select's options."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}
        self.options: dict[str, list[dict[str, Any]]] = {}
        self.hx_includes: list[str] = []
        self.textareas: dict[str, dict[str, str | None]] = {}
        self._select: str | None = None
        self._textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if "hx-include" in a:
            self.hx_includes.append(a["hx-include"] or "")
        name = a.get("name") or ""
        if tag == "input" and name:
            kind = a.get("type", "text")
            if kind == "checkbox":
                if "checked" in a:
                    self.values[name] = a.get("value") or "on"
            elif kind not in {"submit", "button"}:
                self.values[name] = a.get("value") or ""
        elif tag == "select":
            self._select = name
            self.options[name] = []
        elif tag == "option" and self._select is not None:
            option = {"value": a.get("value", ""), "disabled": "disabled" in a, "label": ""}
            self.options[self._select].append(option)
            if "selected" in a:
                self.values[self._select] = option["value"]
        elif tag == "textarea":
            self._textarea = name
            self.textareas[name] = a
            self.values[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._select is not None and self.options[self._select]:
            self.options[self._select][-1]["label"] += data
        if self._textarea is not None:
            self.values[self._textarea] += data.removeprefix("\n")


def read_form(html: str) -> FormReader:
    reader = FormReader()
    reader.feed(html)
    return reader


def option(reader: FormReader, select: str, value: str) -> dict[str, Any]:
    return next(o for o in reader.options[select] if o["value"] == value)


@pytest.fixture
def provider(settings: Any) -> None:
    """An LLM provider is configured (nothing is called: these tests never plan)."""
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"


def test_form_defaults_are_the_first_pack_and_static_and_they_submit(
    analyst: Any, packs: None, django_capture_on_commit_callbacks: Any
) -> None:
    client = client_for(analyst)
    form = read_form(client.get(reverse("planning:case-new")).content.decode())
    assert form.values["domain"] == "invoice"
    assert form.values["strategy"] == "static"
    assert form.values["max_depth"] == "2"
    submitted = {
        **form.values,
        "title": "Check INV-1042",
        "goal": "Verify the invoice",
        "input_invoice_id": "INV-1042",
    }
    with django_capture_on_commit_callbacks(execute=False):
        response = client.post(reverse("planning:case-new"), submitted)
    assert response.status_code == 302, response.content.decode()[:2000]
    case = Case.objects.get()
    assert (case.domain, case.strategy, case.max_depth) == ("invoice", "static", 2)


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
    bare = client.get(reverse("planning:case-new"), {"domain": ""}).content.decode()
    assert "input_invoice_id" not in bare
    assert 'name="inputs"' in bare  # domain-less: an optional JSON object


def test_domain_change_refreshes_inputs_and_strategies_only(analyst: Any, packs: None) -> None:
    response = htmx_get(
        client_for(analyst), reverse("planning:case-new"), "planning-options", domain="incident"
    )
    body = response.content.decode().strip()
    assert body.startswith('<div id="planning-options"')
    assert 'name="input_service"' in body and 'name="input_severity"' in body
    assert 'name="strategy"' in body and 'id="llm-estimate"' in body
    assert "<html" not in body and 'name="title"' not in body
    assert "HX-Request" in response["Vary"]


def test_disabled_pack_is_not_offered(analyst: Any, packs: None) -> None:
    from planning.models import DomainPack

    DomainPack.objects.filter(slug="fraud").update(enabled=False)
    page = client_for(analyst).get(reverse("planning:case-new")).content.decode()
    assert 'value="fraud"' not in page
    assert 'value="invoice"' in page


def test_without_a_provider_llm_is_disabled_with_the_reason_and_hybrid_stays_static(
    analyst: Any, packs: None
) -> None:
    client = client_for(analyst)
    form = read_form(client.get(reverse("planning:case-new")).content.decode())
    llm = option(form, "strategy", "llm")
    assert llm["disabled"] and "needs an LLM provider" in llm["label"]
    assert not option(form, "strategy", "hybrid")["disabled"]
    assert not option(form, "strategy", "static")["disabled"]
    # Without a pack nothing could plan: "none" itself is offered disabled, with the reason.
    none = option(form, "domain", "")
    assert none["disabled"] and "needs an LLM provider" in none["label"]
    estimate = htmx_get(
        client, reverse("planning:case-new"), "llm-estimate", domain="invoice", strategy="hybrid"
    ).content.decode()
    assert "static methods only" in estimate


def test_without_a_domain_pack_strategies_disabled_and_a_runnable_one_chosen(
    analyst: Any, packs: None, provider: None
) -> None:
    client = client_for(analyst)
    body = htmx_get(
        client, reverse("planning:case-new"), "planning-options", domain="", strategy="static"
    ).content.decode()
    form = read_form(body)
    for strategy in ("static", "forward", "goal"):
        found = option(form, "strategy", strategy)
        assert found["disabled"] and "needs a domain pack" in found["label"]
    assert not option(form, "strategy", "llm")["disabled"]
    assert not option(form, "strategy", "hybrid")["disabled"]
    assert form.values["strategy"] == "llm"  # static cannot run here: the first that can
    assert 'data-unavailable="static"' in body
    page = read_form(client.get(reverse("planning:case-new")).content.decode())
    assert not option(page, "domain", "")["disabled"]


@pytest.mark.parametrize(
    ("domain", "strategy", "message"),
    [
        ("", "static", "needs a domain pack"),
        ("invoice", "llm", "needs an LLM provider"),
        ("", "hybrid", "needs a domain pack or an LLM provider"),
    ],
)
def test_a_strategy_that_cannot_run_is_refused_when_posted_anyway(
    analyst: Any, packs: None, domain: str, strategy: str, message: str
) -> None:
    response = client_for(analyst).post(
        reverse("planning:case-new"),
        {"domain": domain, "title": "t", "goal": "g", "strategy": strategy, "max_depth": "2",
         "input_invoice_id": "INV-1042"},
    )  # fmt: skip
    assert response.status_code == 422
    page = response.content.decode()
    strategy_field = page.split('data-field="strategy"', 1)[1].split('data-field="max_depth"')[0]
    assert message in strategy_field
    assert not Case.objects.exists()


REFRESH_INCLUDES = {
    "#id_domain", "#id_strategy", "#id_max_depth",
    "#domain-inputs [name^='input_']", "#domain-inputs [name='inputs_of']",
}  # fmt: skip


def test_refreshes_never_put_texts_or_the_csrf_token_in_a_url(analyst: Any, packs: None) -> None:
    page = client_for(analyst).get(reverse("planning:case-new")).content.decode()
    form = read_form(page)
    # The domain refresh and the estimate's refreshes (after a planning option or an input).
    assert len(form.hx_includes) == 3
    for include in form.hx_includes:
        selectors = {part.strip() for part in include.split(",")}
        assert selectors <= REFRESH_INCLUDES, include
    # A GET form (htmx or not) would put every field of it into the URL.
    assert not re.search(r"<form[^>]*hx-get", page)
    assert 'formmethod="get"' not in page
    assert 'method="post"' in page


def test_no_javascript_refresh_is_a_post_that_keeps_the_texts_and_submits_nothing(
    analyst: Any, packs: None
) -> None:
    description = "x" * 70_000
    response = client_for(analyst).post(
        reverse("planning:case-new"),
        {"action": "refresh", "domain": "incident", "title": "Kept", "goal": "g",
         "description": description, "strategy": "static", "max_depth": "2"},
    )  # fmt: skip
    assert response.status_code == 200
    page = response.content.decode()
    assert 'name="input_service"' in page
    assert 'value="Kept"' in page and description in page
    assert "This field is required" not in page
    assert not Case.objects.exists()


def test_an_unchecked_box_stays_unchecked_across_a_refresh(analyst: Any, packs: None) -> None:
    client = client_for(analyst)
    url = reverse("planning:case-new")
    same = read_form(
        htmx_get(client, url, "planning-options", domain="invoice", inputs_of="invoice",
                 input_invoice_id="INV-1042").content.decode()
    )  # fmt: skip
    assert "input_check_purchase_order" not in same.values  # the analyst unchecked it
    assert same.values["input_invoice_id"] == "INV-1042"
    switched = read_form(
        htmx_get(
            client, url, "planning-options", domain="invoice", inputs_of="fraud"
        ).content.decode()
    )
    assert switched.values["input_check_purchase_order"] == "on"  # a new domain: its defaults


def test_description_limit_is_the_rule_and_the_error_gives_the_count(
    analyst: Any, packs: None
) -> None:
    from planning import rules

    client = client_for(analyst)
    form = read_form(client.get(reverse("planning:case-new")).content.decode())
    assert "maxlength" not in form.textareas["description"]  # never cut silently by the browser
    too_long = "y" * (rules.DESCRIPTION_MAX_LENGTH + 1)
    response = client.post(
        reverse("planning:case-new"),
        {"domain": "invoice", "title": "t", "goal": "g", "description": too_long,
         "strategy": "static", "max_depth": "2", "input_invoice_id": "INV-1042"},
    )  # fmt: skip
    assert response.status_code == 422
    field = response.content.decode().split('data-field="description"', 1)[1]
    limit = rules.DESCRIPTION_MAX_LENGTH
    assert f"At most {limit:,} characters (this has {limit + 1:,})." in field
    assert not Case.objects.exists()


@pytest.mark.parametrize(
    ("strategy", "depth", "expected"),
    [
        ("llm", 3, "Up to 31 LLM calls (b = 5, depth 3)"),
        ("llm", 1, "Up to 1 LLM call (b = 5, depth 1)"),
        ("hybrid", 2, "Up to 6 LLM calls (b = 5, depth 2) to plan the case, fewer when static"),
        ("static", 4, "No LLM calls"),
        ("static", 9, "Choose a depth between 1 and 5"),
    ],
)
def test_expected_llm_calls_follow_strategy_and_depth(
    analyst: Any, packs: None, provider: None, strategy: str, depth: int, expected: str
) -> None:
    response = htmx_get(
        client_for(analyst), reverse("planning:case-new"), "llm-estimate",
        domain="invoice", strategy=strategy, max_depth=depth,
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
    # planning is enqueued once the transaction commits (and the metrics count its events)
    assert len([c for c in callbacks if not isinstance(c, EventCount)]) == 1


def test_domain_less_case_takes_a_json_object_of_inputs(
    analyst: Any, packs: None, provider: None, django_capture_on_commit_callbacks: Any
) -> None:
    client = client_for(analyst)
    base = {"domain": "", "title": "Outage", "goal": "Restore", "strategy": "llm", "max_depth": "2"}
    refused = client.post(reverse("planning:case-new"), {**base, "inputs": "[1, 2]"})
    assert refused.status_code == 422
    assert "Enter a JSON object" in refused.content.decode()
    with django_capture_on_commit_callbacks(execute=False):
        response = client.post(
            reverse("planning:case-new"), {**base, "inputs": '{"service": "payments"}'}
        )
    assert response.status_code == 302
    assert Case.objects.get().inputs == {"service": "payments"}


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
    assert "A goal is required." in goal_field
    # The pack schema's check comes in the same round as the form's, in the server's words.
    invoice_field = page.split('data-field="input_invoice_id"', 1)[1].split("data-field=", 1)[0]
    assert "An invoice number looks like INV-1042." in invoice_field
    response = client_for(analyst).post(
        reverse("planning:case-new"),
        {
            "domain": "invoice", "title": "t", "goal": "g", "strategy": "static",
            "max_depth": "2", "input_invoice_id": "INV-12",
        },
    )  # fmt: skip
    page = response.content.decode()
    invoice_field = page.split('data-field="input_invoice_id"', 1)[1].split("data-field=", 1)[0]
    assert 'class="errorlist" id="id_input_invoice_id_error"' in invoice_field
    assert 'value="INV-12"' in page
    assert not Case.objects.exists()


# Edit and resubmit a failed case -----------------------------------------------------------------


def test_failed_case_offers_edit_and_resubmit_to_its_submitter(analyst: Any, officer: Any) -> None:
    failed = make_case(analyst, status=CaseStatus.PLAN_FAILED, error="No method matched")
    url = reverse("planning:case-detail", args=[failed.pk])
    link = f"{reverse('planning:case-new')}?from={failed.pk}"
    assert link in client_for(analyst).get(url).content.decode()
    # The officer may read the case but submits none: no link for them.
    assert link not in client_for(officer).get(url).content.decode()
    waiting = make_case(analyst)
    assert (
        "?from="
        not in client_for(analyst)
        .get(reverse("planning:case-detail", args=[waiting.pk]))
        .content.decode()
    )


def test_resubmit_form_is_prefilled_from_the_failed_case(analyst: Any, packs: None) -> None:
    failed = make_case(
        analyst, title="Fraud on ACC-7", goal="Find out", description="Long story",
        domain="fraud", strategy="forward", max_depth=3, status=CaseStatus.PLAN_FAILED,
        inputs={"account_id": "ACC-7", "amount": "1200.50", "prior_flags": 2,
                "customer_reported": True},
    )  # fmt: skip
    response = client_for(analyst).get(reverse("planning:case-new"), {"from": failed.pk})
    assert response.status_code == 200
    page = response.content.decode()
    form = read_form(page)
    assert form.values["title"] == "Fraud on ACC-7"
    assert form.values["goal"] == "Find out"
    assert form.values["description"] == "Long story"
    assert form.values["domain"] == "fraud"
    assert form.values["strategy"] == "forward"
    assert form.values["max_depth"] == "3"
    assert form.values["input_account_id"] == "ACC-7"
    assert form.values["input_amount"] == "1200.50"
    assert form.values["input_prior_flags"] == "2"
    assert form.values["input_customer_reported"] == "on"
    assert f'data-prefilled-from="{failed.pk}"' in page
    assert "csrfmiddlewaretoken" in form.values  # a normal form, submitted by POST


def test_resubmit_of_a_domain_less_case_brings_its_json_inputs(
    analyst: Any, packs: None, provider: None
) -> None:
    failed = make_case(
        analyst, domain="", strategy="llm", inputs={"service": "payments"},
        status=CaseStatus.PLAN_FAILED,
    )  # fmt: skip
    form = read_form(
        client_for(analyst).get(reverse("planning:case-new"), {"from": failed.pk}).content.decode()
    )
    assert form.values["domain"] == ""
    assert form.values["strategy"] == "llm"
    assert json.loads(form.values["inputs"]) == {"service": "payments"}


def test_resubmit_from_a_case_one_may_not_read_is_404(
    analyst: Any, other_case: Case, packs: None
) -> None:
    client = client_for(analyst)
    assert client.get(reverse("planning:case-new"), {"from": other_case.pk}).status_code == 404
    assert client.get(reverse("planning:case-new"), {"from": "x"}).status_code == 404


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


def test_case_page_shows_the_pack_inputs_as_a_definition_list(analyst: Any, packs: None) -> None:
    case = make_case(analyst, inputs={"invoice_id": "INV-<1042>", "check_purchase_order": False})
    page = client_for(analyst).get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    inputs = page.split('class="inputs-list"', 1)[1].split("</dl>", 1)[0]
    assert "<dt>Invoice number</dt><dd>INV-&lt;1042&gt;</dd>" in inputs
    assert "<dt>Check the purchase order</dt><dd>no</dd>" in inputs


def test_case_page_shows_a_lists_items_as_values_not_json(analyst: Any, packs: None) -> None:
    case = make_case(
        analyst,
        domain="incident",
        inputs={"kind": "security-breach", "affected_hosts": ["web-1", "<web-2>"]},
    )
    page = client_for(analyst).get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    inputs = page.split('class="inputs-list"', 1)[1].split("</dl>", 1)[0]
    assert "<dd>web-1, &lt;web-2&gt;</dd>" in inputs
    assert "[" not in inputs and "&quot;" not in inputs


def test_case_page_shows_domain_less_inputs_as_values(analyst: Any) -> None:
    case = make_case(
        analyst,
        domain="",
        strategy="llm",
        inputs={"service": "<pay>", "urgent": True, "detail": {"region": "eu"}},
    )
    page = client_for(analyst).get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    inputs = page.split('class="inputs-list"', 1)[1].split("</dl>", 1)[0]
    assert "<dt>service</dt><dd>&lt;pay&gt;</dd>" in inputs
    assert "<dt>urgent</dt><dd>yes</dd>" in inputs
    # Only a nested value reads as JSON.
    assert '<dt>detail</dt><dd><pre class="json">' in inputs


def test_long_description_and_goal_are_folded_and_short_ones_are_not(analyst: Any) -> None:
    long_case = make_case(analyst, goal="g" * 400, description="d" * 5000)
    short_case = make_case(analyst, goal="Short goal", description="Short text")
    client = client_for(analyst)
    long_page = client.get(reverse("planning:case-detail", args=[long_case.pk])).content.decode()
    for name in ("goal", "description"):
        block = long_page.split(f'data-text="{name}"', 1)[1].split("</details>", 1)[0]
        assert "<details>" in block and "<summary>" in block
    assert "Show all 5000 characters" in long_page
    short_page = client.get(reverse("planning:case-detail", args=[short_case.pk])).content.decode()
    assert "<details>" not in short_page.split('class="case-body"', 1)[0]
    assert "Short text" in short_page


def test_long_rationale_is_folded_in_the_step_panel(analyst: Any) -> None:
    case = make_case(analyst)
    make_plan(case, leaves=1, labels={0: {"rationale": "because " * 100}})
    node = first_leaf(case)
    panel = htmx_get(
        client_for(analyst), reverse("planning:node-detail", args=[case.pk, node.pk]), "node-panel"
    ).content.decode()
    block = panel.split('data-text="rationale"', 1)[1]
    assert re.match(r"[^<]*<details>", block)


def test_failed_planning_shows_the_error(analyst: Any) -> None:
    case = make_case(analyst, status=CaseStatus.PLAN_FAILED, error="No LLM provider: set X")
    page = client_for(analyst).get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    assert "Planning failed." in page and "No LLM provider: set X" in page


def test_a_plan_awaiting_approval_says_nothing_runs_before_the_approval(analyst: Any) -> None:
    case = make_case(analyst)
    make_plan(case, leaves=2)
    page = client_for(analyst).get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    note = page.split('data-note="stops-here"', 1)[1].split("</p>", 1)[0]
    assert "nothing runs until a compliance officer approves the plan" in note
    assert "coming" not in note


def test_legend_lists_the_statuses_on_screen_as_swatches(analyst: Any) -> None:
    case = make_case(analyst)
    make_plan(case, leaves=3)
    PlanNode.objects.filter(version=case.current_version, key="step-2").update(status="failed")
    page = client_for(analyst).get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    legend = page.split('class="legend"', 1)[1].split("</ul>", 1)[0]
    assert re.findall(r'<li data-status="(\w+)">', legend) == ["pending", "failed"]
    assert legend.count('<span class="swatch" aria-hidden="true"></span>') == 2
    assert "(2)" in legend and "(1)" in legend
    assert "<input" not in legend and "checkbox" not in legend


@pytest.mark.parametrize(
    ("status", "polls"),
    [
        (CaseStatus.PLANNING, True),
        (CaseStatus.EXECUTING, True),
        (CaseStatus.APPROVED, True),
        (CaseStatus.VERIFYING, True),
        # An officer's decision moves it on: the submitter's open page follows (U1).
        (CaseStatus.AWAITING_APPROVAL, True),
        (CaseStatus.PLAN_FAILED, False),
        (CaseStatus.COMPLETED, False),
        (CaseStatus.FAILED, False),
        (CaseStatus.CANCELLED, False),
        (CaseStatus.REJECTED, False),
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
    assert panel.lstrip().startswith('<aside id="node-panel"')
    assert "payments-auditor" in panel and "Do step 1" in panel
    assert "needs &lt;the&gt; fields" in panel
    assert "check_totals" in panel and "&quot;n&quot;: 1" in panel
    step0 = PlanNode.objects.get(version=case.current_version, key="step-0")
    assert reverse("planning:node-detail", args=[case.pk, step0.pk]) in panel  # dependency link
    assert "test-method" in panel and "depth 1" in panel


# A step's own URL --------------------------------------------------------------------------------


def test_step_url_loaded_directly_is_the_case_page_with_that_step_open(analyst: Any) -> None:
    case = make_case(analyst)
    make_plan(case, leaves=3)
    node = PlanNode.objects.get(version=case.current_version, key="step-1")
    url = reverse("planning:node-detail", args=[case.pk, node.pk])
    page = client_for(analyst).get(url).content.decode()
    assert "<html" in page and 'id="dag"' in page and page.count('<tr data-key="step-') == 3
    assert f'data-node="step-1" data-node-url="{url}"' in page
    row = page.split('<tr data-key="step-1"', 1)[1].split(">", 1)[0]
    assert 'class="selected" aria-current="true"' in row
    assert page.count('aria-current="true"') == 1


def test_a_page_opened_while_the_plan_awaits_approval_follows_the_decision_live(
    analyst: Any,
) -> None:
    from execution.cases import cancel_case
    from tests.cases import planned_invoice_case
    from tests.execution.work_items import approve_plan
    from tests.personas import officer as make_officer

    case = planned_invoice_case(analyst)
    officer = make_officer()
    client = client_for(analyst)
    url = reverse("planning:case-detail", args=[case.pk])

    def live() -> tuple[str, bool]:
        part = htmx_get(client, url, "case-live").content.decode()
        status = re.search(r'data-status="(\w+)"', part)
        assert status is not None
        return status.group(1), 'hx-trigger="every 2s"' in part

    assert 'hx-trigger="every 2s"' in client.get(url).content.decode()
    assert live() == (CaseStatus.AWAITING_APPROVAL, True)
    approve_plan(case, officer)  # another person, in another session
    status, polls = live()
    assert status in (CaseStatus.APPROVED, CaseStatus.EXECUTING) and polls
    cancel_case(case_id=case.pk, user=officer, reason_code="duplicate", reason="twice")
    assert live() == (CaseStatus.CANCELLED, False)


def test_opening_a_step_with_htmx_pushes_its_url_and_closing_pushes_the_case(
    analyst: Any,
) -> None:
    case = make_case(analyst)
    make_plan(case, leaves=2)
    node = first_leaf(case)
    client = client_for(analyst)
    node_url = reverse("planning:node-detail", args=[case.pk, node.pk])
    case_url = reverse("planning:case-detail", args=[case.pk])
    opened = htmx_get(client, node_url, "node-panel")
    assert opened["HX-Push-Url"] == node_url
    closed = htmx_get(client, case_url, "node-panel")
    assert closed["HX-Push-Url"] == case_url
    assert closed.content.decode().lstrip().startswith('<aside id="node-panel"')
    assert "data-node=" not in closed.content.decode()
    # The poll refreshes the live part without touching the address bar.
    assert "HX-Push-Url" not in htmx_get(client, case_url, "case-live")


def test_every_page_that_answers_htmx_with_a_partial_varies_on_hx_request(
    analyst: Any, auditor: Any, packs: None
) -> None:
    case = make_case(analyst)
    make_plan(case, leaves=2)
    node = first_leaf(case)
    urls = [
        (analyst, reverse("planning:case-new"), "llm-estimate"),
        (analyst, reverse("planning:case-list"), "case-table"),
        (analyst, reverse("planning:case-detail", args=[case.pk]), "case-live"),
        (analyst, reverse("planning:node-detail", args=[case.pk, node.pk]), "node-panel"),
        (auditor, reverse("oversight:audit-list"), "audit-table"),
    ]
    for user, url, target in urls:
        client = client_for(user)
        page, partial = client.get(url), htmx_get(client, url, target)
        assert page.status_code == partial.status_code == 200, url
        assert page.content != partial.content, url
        for response in (page, partial):
            vary = {part.strip() for part in response["Vary"].split(",")}
            assert {"HX-Request", "HX-Target"} <= vary, (url, vary)


# Error pages ------------------------------------------------------------------------------------


def test_404_page_is_in_the_sites_layout_with_a_way_back(analyst: Any, other_case: Case) -> None:
    client = client_for(analyst)
    response = client.get(reverse("planning:case-detail", args=[other_case.pk]))
    assert response.status_code == 404
    page = response.content.decode()
    assert 'class="topbar"' in page and 'data-error="404"' in page
    assert f'href="{reverse("planning:case-list")}"' in page
    assert "Case of Bea" not in page


def test_404_for_htmx_is_a_small_notice_retargeted_to_the_error_region(
    analyst: Any, other_case: Case
) -> None:
    node = first_leaf(other_case)
    response = htmx_get(
        client_for(analyst),
        reverse("planning:node-detail", args=[other_case.pk, node.pk]),
        "node-panel",
    )
    assert response.status_code == 404
    body = response.content.decode().strip()
    assert body.startswith('<div class="notice error-box" role="alert" data-error-notice="404"')
    assert "<html" not in body
    assert response["HX-Retarget"] == "#htmx-error"
    assert response["HX-Reswap"] == "innerHTML"
    assert "HX-Request" in response["Vary"]


def test_403_page_names_the_reason_in_the_layout_and_as_htmx_notice(outsider: Any) -> None:
    client = client_for(outsider)
    page = client.get(reverse("planning:case-list"))
    assert page.status_code == 403
    body = page.content.decode()
    assert 'class="topbar"' in body and 'data-error="403"' in body
    assert "Only analysts, compliance officers and auditors read cases." in body
    assert f'href="{reverse("home")}"' in body
    notice = htmx_get(client, reverse("planning:case-list"), "case-table")
    assert notice.status_code == 403
    assert notice.content.decode().strip().startswith('<div class="notice error-box"')
    assert notice["HX-Retarget"] == "#htmx-error"


def test_404_for_a_visitor_offers_to_sign_in(db: None) -> None:
    response = Client().get("/no-such-page/")
    assert response.status_code == 404
    page = response.content.decode()
    assert 'data-error="404"' in page
    assert f'href="{reverse("login")}"' in page
    assert "not yours to see" not in page
    # A page that exists asks a visitor to sign in first, before anything is looked up.
    assert Client().get("/cases/999999/").status_code == 302


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


def test_case_list_offers_every_status_a_case_can_reach(analyst: Any) -> None:
    form = read_form(client_for(analyst).get(reverse("planning:case-list")).content.decode())
    offered = {o["value"]: o for o in form.options["status"]}
    for status in CaseStatus.values:
        assert not offered[status]["disabled"] and "(coming)" not in offered[status]["label"]


def test_step_page_query_count_is_constant_up_to_500_leaves(
    officer: Any, analyst: Any, django_assert_num_queries: Any
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    small = make_case(analyst)
    make_plan(small, leaves=3, groups=1)
    big = make_case(analyst)
    make_plan(big, leaves=500, groups=20)
    client = client_for(officer)

    def step_url(case: Case, key: str) -> str:
        node = PlanNode.objects.filter(version=case.current_version, key=key).get()
        assert node.depends_on  # its dependencies are looked up too
        return reverse("planning:node-detail", args=[case.pk, node.pk])

    small_url = step_url(small, "step-2")
    client.get(small_url)  # warm the session
    with CaptureQueriesContext(connection) as few:
        client.get(small_url)
    big_url = step_url(big, "step-22")
    with django_assert_num_queries(len(few.captured_queries)):
        response = client.get(big_url)
    page = response.content.decode()
    assert page.count('<tr data-key="step-') == 500 and 'data-node="step-22"' in page
    assert len(few.captured_queries) <= 10


def test_the_case_forms_limits_read_as_the_servers_do(analyst: Any, packs: None) -> None:
    response = client_for(analyst).post(
        reverse("planning:case-new"),
        {
            "domain": "invoice", "title": "t" * (rules.TITLE_MAX_LENGTH + 1), "goal": "g",
            "strategy": "static", "max_depth": "99", "input_invoice_id": "INV-1042",
        },
    )  # fmt: skip
    page = response.content.decode()
    assert response.status_code == 422
    assert "Ensure this value" not in page
    assert f"At most {rules.TITLE_MAX_LENGTH:,} characters (this has 201)." in page
    assert f"At most {rules.MAX_DEPTH_LIMIT}." in page
    # The description's limit is said beside the box, not enforced by cutting a paste short.
    assert 'data-limit="10000"' in page and 'maxlength="10000"' not in page


def test_the_depth_hint_does_not_speak_of_the_llm(analyst: Any, packs: None) -> None:
    page = client_for(analyst).get(reverse("planning:case-new")).content.decode()
    hint = page.split('id="id_max_depth_helptext"', 1)[1].split("</div>", 1)[0]
    assert "LLM" not in hint and "levels the plan may break the goal down into" in hint
