"""The version history, the diff page and the step edit form (RELIABILITY R2, R9, O2, O7, W4)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from audit.chain import case_chain
from audit.models import AuditEvent
from oversight.actions.edits import edit_plan
from oversight.models import Gate, GateKind, GateStatus
from planning.actions import materialise_plan, submit_case
from planning.models import Agent, Case, PlanNode
from tests import personas

pytestmark = pytest.mark.django_db


@pytest.fixture
def people() -> dict[str, Any]:
    return {"analyst": personas.analyst(), "officer": personas.officer()}


@pytest.fixture
def case(people: dict[str, Any]) -> Case:
    case = submit_case(
        submitter=people["analyst"],
        title="Verify <INV-1042>",
        goal="Verify invoice INV-1042",
        domain="invoice",
        strategy="static",
        inputs={"invoice_id": "INV-1042"},
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    Agent.objects.create(
        slug="second-auditor", name="Second auditor", kind=Agent.Kind.TOOL, tools=["check_totals"]
    )
    return case


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _node(case: Case, key: str) -> PlanNode:
    """Return the step `key` of the case's current version (as the database has it now)."""
    case.refresh_from_db()
    return PlanNode.objects.get(version=case.current_version, key=key)


def _edit_url(case: Case, key: str) -> str:
    return reverse("oversight:plan-edit", args=[case.pk, _node(case, key).pk])


def _edit(case: Case, user: Any, key: str, changes: dict[str, Any], code: str = "other") -> Any:
    return edit_plan(
        case_id=case.pk,
        user=user,
        node_key=key,
        changes=changes,
        reason_code=code,
        reason="<b>not bold</b>",
    )


def _form(node: PlanNode, **overrides: Any) -> dict[str, Any]:
    """The edit form as the page sends it when nothing is changed."""
    data: dict[str, Any] = {
        "agent": node.agent,
        "task": node.task,
        "inputs": json.dumps(node.inputs),
        "depends_on": node.declared_depends_on or [],
        "reason_code": "wrong-agent",
        "reason": "",
        "base_version": node.version.number,
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


# History -------------------------------------------------------------------------------------


def test_the_history_lists_each_version_with_its_origin_reason_and_plan_gate(
    case: Case, people: dict[str, Any]
) -> None:
    _edit(case, people["officer"], "check-totals", {"agent": "second-auditor"}, "wrong-agent")
    url = reverse("oversight:version-history", args=[case.pk])
    response = _client(people["analyst"]).get(url)
    assert response.status_code == 200
    html = response.content.decode()
    rows = re.findall(r'<tr data-version="(\d+)"', html)
    assert rows == ["2", "1"]
    assert "planned (static)" in html
    assert "edit by olivia" in html
    assert "<code data-reason-code>wrong-agent</code>" in html
    assert "&lt;b&gt;not bold&lt;/b&gt;" in html and "<b>not bold</b>" not in html
    assert "Verify &lt;INV-1042&gt;" in html
    assert 'data-gate-status="void"' in html and 'data-gate-status="pending"' in html
    # The analyst sees the history, not the edit links.
    assert "/edit/" not in html
    officer_html = _client(people["officer"]).get(url).content.decode()
    assert _edit_url(case, "check-totals") in officer_html


def test_the_history_runs_the_same_queries_for_2_and_4_versions(
    case: Case, people: dict[str, Any]
) -> None:
    client = _client(people["analyst"])
    url = reverse("oversight:version-history", args=[case.pk])

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        return len(queries.captured_queries)

    _edit(case, people["officer"], "check-totals", {"task": "Check the totals"})
    two = count()
    _edit(case, people["officer"], "check-totals", {"task": "Check the totals again"})
    _edit(case, people["officer"], "check-po", {"task": "Check the PO"})
    assert count() == two


@pytest.mark.scenario("W4")
@pytest.mark.parametrize("page", ["version-history", "version-diff"])
def test_another_analysts_case_history_and_diff_are_404(case: Case, page: str) -> None:
    for user in (personas.analyst("bob"), personas.outsider(), personas.admin()):
        response = _client(user).get(reverse(f"oversight:{page}", args=[case.pk]))
        assert response.status_code == 404


# Diff ----------------------------------------------------------------------------------------


@pytest.mark.scenario("R9")
def test_the_diff_page_shows_changed_fields_before_and_after_and_moved_dependencies(
    case: Case, people: dict[str, Any]
) -> None:
    _edit(case, people["officer"], "check-totals", {"agent": "second-auditor"}, "wrong-agent")
    _edit(case, people["officer"], "check-po", {"depends_on": ["check-totals"]})
    client = _client(people["analyst"])
    url = reverse("oversight:version-diff", args=[case.pk])

    latest = client.get(url).content.decode()  # v2 → v3 by default
    assert 'data-from="2" data-to="3"' in latest
    assert '<section class="card" aria-labelledby="deps-title"' in latest
    assert re.search(r'<tr data-node="check-po">.*?lookup-supplier.*?check-totals', latest, re.S)

    whole = client.get(url, {"from": 1, "to": 2}).content.decode()
    assert re.search(
        r'data-field="agent"><th scope="row">agent</th><td><pre class="json">payments-auditor'
        r'</pre></td><td><pre class="json">second-auditor</pre>',
        whole,
    )
    assert 'data-section="dependencies"' not in whole
    assert '<option value="1" selected>v1</option>' in whole
    assert "edit of step <code>check-totals</code> by olivia" in whole


def test_the_diff_page_lists_removed_steps_and_says_when_there_is_nothing_before(
    case: Case, people: dict[str, Any]
) -> None:
    client = _client(people["analyst"])
    url = reverse("oversight:version-diff", args=[case.pk])
    first = client.get(url)
    assert first.status_code == 200
    assert 'data-note="first"' in first.content.decode()
    _edit(case, people["officer"], "place-hold", {"remove": True})
    html = client.get(url).content.decode()
    assert re.search(r'data-section="removed".*?data-node="place-hold"', html, re.S)
    assert client.get(url, {"from": 1, "to": 1}).content.decode().count('data-note="same"') == 1
    assert client.get(url, {"to": 9}).status_code == 404
    assert client.get(url, {"from": "x"}).status_code == 404


# The edit form -------------------------------------------------------------------------------


def test_an_officer_edits_a_step_through_the_form_and_lands_on_the_diff(
    case: Case, people: dict[str, Any]
) -> None:
    client = _client(people["officer"])
    url = _edit_url(case, "check-totals")
    page = client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert '<option value="second-auditor"' in html
    assert '<option value="wrong-agent"' in html
    assert '<option value="duplicate"' not in html  # a code that does not apply to edits
    assert 'name="base_version" value="1"' in html
    assert "<script" not in html.split("<main", 1)[-1]

    node = _node(case, "check-totals")
    response = client.post(url, _form(node, agent="second-auditor", reason="knows them"))
    diff_url = reverse("oversight:version-diff", args=[case.pk])
    assert response.status_code == 302
    assert response["Location"] == f"{diff_url}?from=1&to=2"
    case.refresh_from_db()
    assert case.current_version is not None and case.current_version.number == 2
    assert _node(case, "check-totals").agent == "second-auditor"
    # Only what changed is in the edit: the other fields were sent back as they were.
    assert case.current_version.edit["changes"] == {"agent": "second-auditor"}
    assert Gate.objects.get(version__number=1, case=case, kind=GateKind.PLAN).status == (
        GateStatus.VOID
    )


@pytest.mark.scenario("O7")
def test_an_edit_without_a_reason_code_shows_the_form_again_and_changes_nothing(
    case: Case, people: dict[str, Any]
) -> None:
    client = _client(people["officer"])
    node = _node(case, "check-totals")
    events = AuditEvent.objects.filter(chain=case_chain(case.pk)).count()
    response = client.post(
        _edit_url(case, "check-totals"), _form(node, agent="second-auditor", reason_code="")
    )
    assert response.status_code == 422
    html = response.content.decode()
    assert re.search(r'data-field="reason_code">.*?A reason code is required to edit\.', html, re.S)
    assert case.versions.count() == 1
    assert AuditEvent.objects.filter(chain=case_chain(case.pk)).count() == events


def test_an_invalid_edit_shows_why_on_its_field(case: Case, people: dict[str, Any]) -> None:
    client = _client(people["officer"])
    node = _node(case, "check-totals")
    url = _edit_url(case, "check-totals")
    # An agent that cannot run the step is not offered, and not taken.
    assert '<option value="erp-connector"' not in client.get(url).content.decode()
    off_list = client.post(url, _form(node, agent="erp-connector"))
    assert off_list.status_code == 422
    assert re.search(
        r'data-field="agent">.*?Select a valid choice', off_list.content.decode(), re.S
    )
    unfit = client.post(url, _form(node, inputs='{"invoice": 7}'))
    assert unfit.status_code == 422
    said = re.search(
        r'data-field="inputs">.*?<ul class="errorlist".*?<li>(.*?)</li>',
        unfit.content.decode(),
        re.S,
    )
    assert said is not None
    assert said[1].startswith("Step check-totals: the inputs do not fit tool check_totals: ")
    assert said[1].endswith(".") and "Field required" not in said[1]
    bad_json = client.post(url, _form(node, inputs="{not json"))
    assert bad_json.status_code == 422
    assert re.search(r'data-field="inputs">.*?Not valid JSON', bad_json.content.decode(), re.S)
    nothing = client.post(url, _form(node))
    assert nothing.status_code == 422
    assert 'data-errors="form"' in nothing.content.decode()
    assert case.versions.count() == 1


def _add_url(case: Case, key: str) -> str:
    return reverse("oversight:plan-add-step", args=[case.pk, _node(case, key).pk])


def _add_form(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "key": "second-hold",
        "runner": "payments-clerk:place_payment_hold",
        "task": "Place a second hold",
        "inputs": '{"report": {"$ref": "audit-report"}}',
        "depends_on": ["place-hold"],
        "reason_code": "other",
        "reason": "two findings, two holds",
        "base_version": "1",
    }
    data.update(overrides)
    return data


def test_an_officer_adds_a_step_choosing_among_the_agents_that_can_run_it(
    case: Case, people: dict[str, Any]
) -> None:
    client = _client(people["officer"])
    edit_page = client.get(_edit_url(case, "place-hold")).content.decode()
    assert f'href="{_add_url(case, "place-hold")}" data-action="add-step"' in edit_page
    response = client.get(_add_url(case, "place-hold"))
    assert response.status_code == 200
    runners = dict(response.context["form"].fields["runner"].choices)
    # Each agent with each tool it is allowed, and nothing else.
    assert "payments-clerk:place_payment_hold" in runners
    assert "second-auditor:check_totals" in runners and "erp-connector:check_totals" not in runners
    assert "payments-clerk:check_totals" not in runners
    for value in filter(None, runners):
        slug, _, tool = value.partition(":")
        agent = Agent.objects.get(slug=slug)
        assert tool in agent.tools if tool else agent.kind != Agent.Kind.TOOL, value
    # What it waits for starts as the step it comes after.
    assert re.search(r'value="place-hold"[^>]*checked', response.content.decode())
    added = client.post(_add_url(case, "place-hold"), _add_form())
    assert added.status_code == 302
    assert added["Location"] == reverse("oversight:version-diff", args=[case.pk]) + "?from=1&to=2"
    case.refresh_from_db()
    assert _node(case, "second-hold").tool == "place_payment_hold"
    assert Gate.objects.filter(case=case, version__number=2, node__key="second-hold").exists()
    gate = Gate.objects.get(case=case, version__number=2, kind=GateKind.PLAN)
    page = _client(personas.second_officer()).get(reverse("oversight:gate-detail", args=[gate.pk]))
    assert "v2 adds step <code>second-hold</code> after <code>place-hold</code>" in (
        page.content.decode()
    )


def test_an_added_step_that_cannot_run_is_refused_in_sentences_on_its_fields(
    case: Case, people: dict[str, Any]
) -> None:
    client = _client(people["officer"])
    url = _add_url(case, "place-hold")

    def said(response: Any, field: str) -> str:
        assert response.status_code == 422
        found = re.search(
            rf'data-field="{field}">.*?<ul class="errorlist".*?<li>(.*?)</li>',
            response.content.decode(),
            re.S,
        )
        assert found is not None, response.content.decode()[-3000:]
        return found[1]

    taken = said(client.post(url, _add_form(key="audit-report")), "key")
    assert taken == "The plan already has a step audit-report: choose another key."
    missing = said(client.post(url, _add_form(inputs="{}")), "inputs")
    assert missing == (
        "Step second-hold: the inputs do not fit tool place_payment_hold: “report” is missing."
    )
    broken = said(client.post(url, _add_form(inputs='{"report": }')), "inputs")
    assert broken == "Not valid JSON: expecting value at line 1, column 12."
    early = said(client.post(url, _add_form(depends_on=["extract-fields"])), "inputs")
    assert early.endswith("takes the output of audit-report, which does not run before it.")
    off_list = said(client.post(url, _add_form(runner="erp-connector:check_totals")), "runner")
    assert off_list.startswith("Select a valid choice")
    assert case.versions.count() == 1


def test_a_stale_form_is_refused_with_a_notice(case: Case, people: dict[str, Any]) -> None:
    client = _client(people["officer"])
    node = _node(case, "check-totals")
    _edit(case, people["officer"], "check-po", {"task": "Check the PO"})
    # The form of v1 still posts to the v1 node, which is no longer current.
    response = client.post(
        reverse("oversight:plan-edit", args=[case.pk, node.pk]), _form(node, task="Again")
    )
    assert response.status_code == 200
    assert "earlier plan version" in response.content.decode()
    assert case.versions.count() == 2
    # On the current node, a base version that is not the current one is a 409.
    current = _node(case, "check-totals")
    stale = client.post(_edit_url(case, "check-totals"), _form(current, task="x", base_version=1))
    assert stale.status_code == 409
    assert "reload and edit again" in stale.content.decode()
    assert case.versions.count() == 2


@pytest.mark.scenario("O2")
def test_the_submitter_an_auditor_and_an_admin_cannot_open_the_edit_form(
    case: Case, people: dict[str, Any]
) -> None:
    url = _edit_url(case, "check-totals")
    assert _client(people["analyst"]).get(url).status_code == 403
    assert _client(people["analyst"]).post(url, _form(_node(case, "check-totals"))).status_code == (
        403
    )
    assert _client(personas.auditor()).get(url).status_code == 403
    assert _client(personas.admin()).get(url).status_code == 404  # admins read no cases
    assert _client(personas.analyst("bob")).get(url).status_code == 404
    assert case.versions.count() == 1


def test_a_compound_or_another_cases_node_has_no_edit_form(
    case: Case, people: dict[str, Any]
) -> None:
    client = _client(people["officer"])
    root = _node(case, "verify-invoice")
    assert client.get(reverse("oversight:plan-edit", args=[case.pk, root.pk])).status_code == 404
    other = submit_case(
        submitter=people["analyst"], title="Other", goal="Verify invoice INV-1042",
        domain="invoice", strategy="static", inputs={"invoice_id": "INV-1042"},
    )  # fmt: skip
    leaf = _node(case, "check-totals")
    assert client.get(reverse("oversight:plan-edit", args=[other.pk, leaf.pk])).status_code == 404


def test_the_gate_page_of_an_edited_version_says_what_changed_and_links_the_diff(
    case: Case, people: dict[str, Any]
) -> None:
    edit_plan(
        case_id=case.pk,
        user=people["officer"],
        node_key="check-totals",
        changes={"agent": "second-auditor"},
        reason_code="wrong-agent",
        reason="knows them",
    )
    gate = Gate.objects.get(case=case, version__number=2, kind=GateKind.PLAN)
    second = personas.second_officer()
    html = _client(second).get(reverse("oversight:gate-detail", args=[gate.pk])).content.decode()
    section = html.split('data-section="version-changes"', 1)[1].split("</section>", 1)[0]
    assert "What changed from v1" in section
    assert re.search(r"<code>check-totals</code>.*agent", section, re.S), section
    assert "knows them" in section
    diff_url = reverse("oversight:version-diff", args=[case.pk])
    assert f'href="{diff_url}?from=1&amp;to=2"' in section


def test_the_gate_page_of_a_first_version_has_no_changes_section(
    case: Case, people: dict[str, Any]
) -> None:
    gate = Gate.objects.get(case=case, version__number=1, kind=GateKind.PLAN)
    html = _client(people["officer"]).get(reverse("oversight:gate-detail", args=[gate.pk]))
    assert 'data-section="version-changes"' not in html.content.decode()


def test_the_edit_forms_runs_after_hint_holds_whatever_is_ticked(
    case: Case, people: dict[str, Any]
) -> None:
    html = _client(people["officer"]).get(_edit_url(case, "audit-report")).content.decode()
    assert "None selected" not in html
    assert "with none ticked it starts without waiting" in html
