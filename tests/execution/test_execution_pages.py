"""Execution on the pages: the case page follows the run and shows the result, the cancel form,
the work item list and form, the admins' stop switch and its banner, trust in the admin."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from execution import actions as execution
from execution.models import TrustScore, WorkItem
from oversight.actions.gates import DecisionInput, decide_gate
from oversight.models import Gate, GateKind, GateStatus
from planning.catalogue import sync_packs
from planning.models import Agent, CaseStatus, NodeStatus, PlanNode
from tests import personas
from tests.cases import planned_invoice_case
from tests.execution.work_items import INVOICE_FIELDS, approve_plan, waiting_work_item
from tests.personas import PASSWORD
from tests.planning.factories import make_case, make_plan

pytestmark = pytest.mark.django_db


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def htmx_get(client: Client, url: str, target: str) -> Any:
    return client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET=target)


def case_url(case_id: int) -> str:
    return reverse("planning:case-detail", args=[case_id])


def run_ready(case_id: int) -> None:
    """Run every ready leaf of the case as a worker would, until none is ready."""
    while ready := list(
        PlanNode.objects.filter(version__case_id=case_id, status=NodeStatus.READY).values_list(
            "pk", flat=True
        )
    ):
        for pk in ready:
            execution.execute_leaf(pk, worker="test")


def completed_invoice_case(analyst: Any, officer: Any) -> int:
    """Run the INV-1042 case to its end in this process (the hold approved with a signature)."""
    case = planned_invoice_case(analyst)
    approve_plan(case, officer)
    run_ready(case.pk)
    step = Gate.objects.get(case=case, kind=GateKind.STEP, status=GateStatus.PENDING)
    decide_gate(
        gate_id=step.pk, user=officer, decision=DecisionInput(decision="approve", password=PASSWORD)
    )
    run_ready(case.pk)
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    return case.pk


# The case page follows the run ----------------------------------------------------------------


def _executing(case: Any, leaves: int, groups: int) -> None:
    """Give the case a plan in the middle of its run: succeeded, running and failed steps."""
    make_plan(case, leaves=leaves, groups=groups)
    case.status = CaseStatus.EXECUTING
    case.save(update_fields=["status"])
    now = timezone.now()
    steps = PlanNode.objects.filter(version_id=case.current_version_id, kind="leaf")
    keys = list(steps.order_by("position").values_list("key", flat=True))
    steps.filter(key__in=keys[: len(keys) // 2]).update(
        status=NodeStatus.SUCCEEDED,
        attempts=1,
        started_at=now - timedelta(seconds=3),
        finished_at=now,
        output={"checked": True, "findings": ["fine"]},
    )
    steps.filter(key=keys[-1]).update(
        status=NodeStatus.FAILED,
        attempts=3,
        started_at=now - timedelta(seconds=75),
        finished_at=now,
        error="ERP answered 503",
        error_class="transient",
    )
    steps.filter(key=keys[len(keys) // 2]).update(
        status=NodeStatus.RUNNING, attempts=2, started_at=now - timedelta(seconds=5)
    )


def test_the_case_page_shows_attempts_durations_and_errors_with_their_class(
    analyst: Any,
) -> None:
    case = make_case(analyst)
    _executing(case, leaves=4, groups=1)
    page = client_for(analyst).get(case_url(case.pk)).content.decode()
    assert 'hx-trigger="every 2s"' in page  # executing: the live part refreshes
    rows = dict(re.findall(r'<tr data-key="(step-\d+)" data-status="(\w+)"', page))
    assert rows == {
        "step-0": "succeeded",
        "step-1": "succeeded",
        "step-2": "running",
        "step-3": "failed",
    }
    assert "attempt 1</span> · 3.0 s" in page
    assert "attempt 3</span> · 1 min 15 s" in page
    assert '<span class="error-class">transient</span>: ERP answered 503' in page
    legend = page.split('class="legend"', 1)[1].split("</ul>", 1)[0]
    assert re.findall(r'<li data-status="(\w+)">', legend) == ["running", "succeeded", "failed"]
    assert 'data-link="case-execution"' in page


def test_the_step_panel_shows_the_output_as_rows_and_escapes_it(analyst: Any) -> None:
    case = make_case(analyst)
    _executing(case, leaves=2, groups=1)
    node = PlanNode.objects.get(version_id=case.current_version_id, key="step-0")
    PlanNode.objects.filter(pk=node.pk).update(
        output={"note": "<script>alert(1)</script>", "nested": {"a": [1, 2]}, "ok": False}
    )
    url = reverse("planning:node-detail", args=[case.pk, node.pk])
    panel = htmx_get(client_for(analyst), url, "node-panel").content.decode()
    assert "<script>alert(1)</script>" not in panel
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in panel
    assert '<div data-key="ok"><dt>ok</dt><dd>no</dd></div>' in panel
    assert '<pre class="json">{\n  &quot;a&quot;: [\n    1,\n    2\n  ]\n}</pre>' in panel


def test_the_case_page_of_a_500_step_run_costs_the_queries_of_a_3_step_one(
    officer: Any, analyst: Any
) -> None:
    small = make_case(analyst)
    _executing(small, leaves=3, groups=1)
    big = make_case(analyst)
    _executing(big, leaves=500, groups=20)
    client = client_for(officer)
    client.get(case_url(small.pk))  # warm the session

    def count(url: str, target: str | None = None) -> int:
        with CaptureQueriesContext(connection) as queries:
            response = htmx_get(client, url, target) if target else client.get(url)
        assert response.status_code == 200
        return len(queries.captured_queries)

    assert count(case_url(big.pk)) == count(case_url(small.pk))
    assert count(case_url(big.pk), "case-live") == count(case_url(small.pk), "case-live")
    page = client.get(case_url(big.pk)).content.decode()
    assert page.count('<tr data-key="step-') == 500
    # 250 succeeded, one running, one failed: each shows its attempts.
    assert page.count('<div class="run small"><span data-attempts=') == 252


def test_an_ended_case_shows_the_verdict_and_the_audit_reports_findings(
    analyst: Any, officer: Any
) -> None:
    case_id = completed_invoice_case(analyst, officer)
    page = client_for(analyst).get(case_url(case_id)).content.decode()
    assert 'hx-trigger="every 2s"' not in page
    result = page.split('id="case-result"', 1)[1].split("</section>", 1)[0]
    verdict = re.sub(r"<[^>]+>", "", result.split('class="verdict"', 1)[1].split("</p>", 1)[0])
    reached = "The goal is reached — and the steps reported 2 findings: see the outputs below."
    assert reached in verdict
    assert "not that what it examined is in order" in verdict
    assert re.search(r"<li>all \d+ steps ended as planned</li>", result)
    report = result.split('data-output="audit-report"', 1)[1].split("</article>", 1)[0]
    assert "recommendation</dt><dd>hold</dd>" in report
    findings = report.split("findings</dt>", 1)[1].split("</ul>", 1)[0]
    assert "duplicate payment" in findings and findings.count("<li>") >= 1
    assert 'data-output="place-hold"' in result


def test_a_failed_verdict_names_its_reasons(analyst: Any) -> None:
    case = make_case(analyst)
    _executing(case, leaves=2, groups=1)
    case.status = CaseStatus.FAILED
    case.verification = {"passed": False, "reasons": ["step-1 failed: ERP answered 503"]}
    case.save(update_fields=["status", "verification"])
    page = client_for(analyst).get(case_url(case.pk)).content.decode()
    result = page.split('id="case-result"', 1)[1].split("</section>", 1)[0]
    assert "The goal is not reached." in result
    assert "<li>step-1 failed: ERP answered 503</li>" in result


# Cancel ---------------------------------------------------------------------------------------


def _execution_partial(user: Any, case_id: int) -> str:
    url = reverse("execution:case-execution", args=[case_id])
    response = htmx_get(client_for(user), url, "case-execution")
    assert response.status_code == 200
    return response.content.decode()


def test_the_cancel_form_shows_for_the_submitter_and_officers_only(
    analyst: Any, officer: Any, auditor: Any
) -> None:
    case = planned_invoice_case(analyst)
    approve_plan(case, officer)
    assert 'data-form="cancel"' in _execution_partial(analyst, case.pk)
    assert 'data-form="cancel"' in _execution_partial(officer, case.pk)
    assert 'data-form="cancel"' not in _execution_partial(auditor, case.pk)
    codes = re.findall(r'<option value="([\w-]+)"', _execution_partial(analyst, case.pk))
    assert "no-longer-needed" in codes and "other" in codes and "incorrect" not in codes


@pytest.mark.scenario("O7", "R6")
def test_cancelling_from_the_page_needs_a_reason_code_and_then_cancels(
    analyst: Any, officer: Any
) -> None:
    case = planned_invoice_case(analyst)
    approve_plan(case, officer)
    client = client_for(analyst)
    url = reverse("execution:case-cancel", args=[case.pk])
    refused = client.post(url, {"reason_code": "", "reason": "keep this text"})
    assert refused.status_code == 422
    body = refused.content.decode()
    assert 'id="cancel-reason-code-error"' in body and "keep this text" in body
    # Cancelling sits in the case's Execution card, not under a "Work items" title.
    assert '<h2 id="case-execution-title">Execution</h2>' in body
    bare = client.post(url, {"reason_code": "other", "reason": ""})
    assert bare.status_code == 422
    assert 'id="cancel-reason-error"' in bare.content.decode()
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING
    done = client.post(url, {"reason_code": "no-longer-needed", "reason": "paid elsewhere"})
    assert done.status_code == 302 and done["Location"] == case_url(case.pk)
    case.refresh_from_db()
    assert case.status == CaseStatus.CANCELLED
    page = client.get(case_url(case.pk)).content.decode()
    assert "The case is cancelled" in page and 'id="case-result"' in page
    assert 'data-form="cancel"' not in _execution_partial(analyst, case.pk)
    assert client.post(url, {"reason_code": "other", "reason": "again"}).status_code == 409


def test_an_auditor_may_not_cancel_and_another_analyst_finds_no_case(
    analyst: Any, officer: Any, auditor: Any
) -> None:
    case = planned_invoice_case(analyst)
    url = reverse("execution:case-cancel", args=[case.pk])
    assert client_for(auditor).post(url, {"reason_code": "other", "reason": "x"}).status_code == 403
    other = personas.analyst("ben")
    assert client_for(other).post(url, {"reason_code": "other", "reason": "x"}).status_code == 404
    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL


# Work items ----------------------------------------------------------------------------------


def test_the_work_item_list_and_nav_count_show_the_groups_open_items(
    analyst: Any, officer: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    ben = client_for(personas.analyst("ben"))
    page = ben.get(reverse("execution:work-item-list")).content.decode()
    assert f'<tr data-work-item="{item.pk}">' in page
    assert '<span class="nav-count" data-count="work-items">1</span>' in page
    for user in (analyst, officer):
        other = client_for(user).get(reverse("execution:work-item-list")).content.decode()
        assert 'data-empty="work-items"' in other
        assert 'data-count="work-items"' not in other
    partial = _execution_partial(officer, item.case_id)
    assert f'data-work-item="{item.pk}" data-status="open"' in partial


def test_a_work_item_page_is_404_for_other_groups_and_the_submitter(
    analyst: Any, officer: Any, auditor: Any, admin_user: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    url = reverse("execution:work-item", args=[item.pk])
    complete = reverse("execution:work-item-complete", args=[item.pk])
    for user in (analyst, officer, auditor, admin_user):
        assert client_for(user).get(url).status_code == 404
        assert client_for(user).post(complete, {"output": "{}"}).status_code == 404


def test_bad_json_gets_an_error_next_to_the_field_and_keeps_the_text(
    analyst: Any, officer: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    ben = client_for(personas.analyst("ben"))
    page = ben.get(reverse("execution:work-item", args=[item.pk])).content.decode()
    assert "<code>supplier_id</code>" in page and "InvoiceFields" in page
    url = reverse("execution:work-item-complete", args=[item.pk])
    typed = '{"invoice_id": "INV-1042", oops}'
    response = ben.post(url, {"output": typed})
    assert response.status_code == 422
    body = response.content.decode()
    assert 'id="output-error"' in body and "not valid JSON" in body
    assert "{&quot;invoice_id&quot;: &quot;INV-1042&quot;, oops}</textarea>" in body
    unfit = ben.post(url, {"output": '{"invoice_id": "INV-1042"}'})
    assert unfit.status_code == 422 and "supplier_id" in unfit.content.decode()
    assert WorkItem.objects.get(pk=item.pk).status == WorkItem.Status.OPEN


def test_completing_the_form_finishes_the_step(analyst: Any, officer: Any) -> None:
    import json

    item = waiting_work_item(analyst, officer)
    ben = client_for(personas.analyst("ben"))
    url = reverse("execution:work-item-complete", args=[item.pk])
    response = ben.post(url, {"output": json.dumps(INVOICE_FIELDS)})
    assert response.status_code == 302 and response["Location"] == reverse(
        "execution:work-item-list"
    )
    assert PlanNode.objects.get(pk=item.node_id).status == NodeStatus.SUCCEEDED
    page = ben.get(reverse("execution:work-item", args=[item.pk])).content.decode()
    assert "This work item is completed by ben" in page
    assert 'data-form="complete"' not in page
    assert ben.post(url, {"output": json.dumps(INVOICE_FIELDS)}).status_code == 409


def test_a_step_without_an_output_schema_takes_plain_text(analyst: Any, officer: Any) -> None:
    item = waiting_work_item(analyst, officer)
    PlanNode.objects.filter(pk=item.node_id).update(expected_output="")
    ben = client_for(personas.analyst("ben"))
    page = ben.get(reverse("execution:work-item", args=[item.pk])).content.decode()
    assert "write your output as plain text" in page and "Output (plain text)" in page
    assert "JSON" not in page.split('id="output-title"', 1)[1].split("</form>", 1)[0]
    url = reverse("execution:work-item-complete", args=[item.pk])
    blank = ben.post(url, {"output": "  "})
    assert blank.status_code == 422 and 'id="output-error"' in blank.content.decode()
    typed = "Called the customer: they confirm both transfers.\nNo further contact."
    assert ben.post(url, {"output": typed}).status_code == 302
    item.refresh_from_db()
    assert item.output == {"text": typed}
    assert PlanNode.objects.get(pk=item.node_id).status == NodeStatus.SUCCEEDED


def test_the_work_item_list_costs_the_same_queries_for_one_item_and_for_many(
    analyst: Any, officer: Any
) -> None:
    waiting_work_item(analyst, officer)
    ben = client_for(personas.analyst("ben"))
    url = reverse("execution:work-item-list")
    ben.get(url)
    with CaptureQueriesContext(connection) as one:
        ben.get(url)
    for _ in range(3):
        waiting_work_item(analyst, officer)
    with CaptureQueriesContext(connection) as four:
        page = ben.get(url).content.decode()
    assert page.count("<tr data-work-item=") == 4
    assert len(four.captured_queries) == len(one.captured_queries)


# The stop switch ------------------------------------------------------------------------------


def test_only_admins_open_and_turn_the_stop_switch(
    analyst: Any, officer: Any, auditor: Any, admin_user: Any
) -> None:
    page = reverse("execution:execution-control")
    turn = reverse("execution:execution-control-set")
    for user in (analyst, officer, auditor):
        assert client_for(user).get(page).status_code == 403
        assert client_for(user).post(turn, {"action": "stop", "reason": "x"}).status_code == 403
    assert not execution.is_stopped()
    admin = client_for(admin_user)
    assert admin.get(page).status_code == 200
    no_reason = admin.post(turn, {"action": "stop", "reason": ""})
    assert (
        no_reason.status_code == 422 and 'id="control-reason-error"' in no_reason.content.decode()
    )
    assert not execution.is_stopped()
    assert admin.post(turn, {"action": "stop", "reason": "ERP maintenance"}).status_code == 302
    assert execution.is_stopped()
    shown = admin.get(page).content.decode()
    assert 'data-action="resume"' in shown and "ERP maintenance" in shown
    assert admin.post(turn, {"action": "resume", "reason": ""}).status_code == 302
    assert not execution.is_stopped()


def test_everyone_sees_the_banner_while_execution_is_stopped(
    analyst: Any, officer: Any, auditor: Any, admin_user: Any
) -> None:
    case = make_case(analyst)
    banner = 'data-banner="execution-stopped"'
    assert banner not in client_for(analyst).get(case_url(case.pk)).content.decode()
    execution.set_stopped(stopped=True, user=admin_user, reason="maintenance")
    for user, url in (
        (analyst, case_url(case.pk)),
        (officer, reverse("oversight:inbox")),
        (auditor, reverse("home")),
        (admin_user, reverse("home")),
    ):
        assert banner in client_for(user).get(url).content.decode(), user


def test_an_open_case_pages_refresh_takes_the_banner_away_after_resume(
    analyst: Any, admin_user: Any
) -> None:
    case = make_case(analyst)
    make_plan(case)
    client = client_for(analyst)
    execution.set_stopped(stopped=True, user=admin_user, reason="maintenance")
    live = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "case-live"}
    stopped = client.get(case_url(case.pk), **live).content.decode()
    assert 'id="stopped-banner" hx-swap-oob="true"' in stopped
    assert 'data-banner="execution-stopped"' in stopped
    execution.set_stopped(stopped=False, user=admin_user, reason="")
    resumed = client.get(case_url(case.pk), **live).content.decode()
    assert 'id="stopped-banner" hx-swap-oob="true"' in resumed
    assert 'data-banner="execution-stopped"' not in resumed


def test_the_stopped_control_page_says_execution_is_stopped_once(admin_user: Any) -> None:
    admin = client_for(admin_user)
    admin.post(reverse("execution:execution-control-set"), {"action": "stop", "reason": "ERP"})
    page = admin.get(reverse("execution:execution-control")).content.decode()
    assert page.count("Execution is stopped") == 1, page


# Trust in the admin ---------------------------------------------------------------------------


def test_the_admin_lists_trust_scores_read_only_with_the_current_trust(admin_user: Any) -> None:
    from planning.catalogue import sync_packs

    sync_packs()
    agent = Agent.objects.get(slug="payments-clerk")
    TrustScore.objects.create(
        agent=agent, capability="payments.hold", successes=8, failures=2, updated_at=timezone.now()
    )
    expected = f"{execution.effective_trust(agent, ['payments.hold']):.3f}"
    client = client_for(admin_user)
    page = client.get(reverse("admin:execution_trustscore_changelist")).content.decode()
    assert "payments.hold" in page and expected in page
    assert client.get(reverse("admin:execution_trustscore_add")).status_code == 403


def test_the_admin_shows_trust_outcomes_as_decayed_counts_not_stored_weights(
    admin_user: Any,
) -> None:
    import time

    from execution.trust import weight
    from planning.catalogue import sync_packs

    sync_packs()
    agent = Agent.objects.get(slug="payments-clerk")
    now = weight(time.time())  # one outcome now, as the workers store it
    TrustScore.objects.create(
        agent=agent,
        capability="payments.hold",
        successes=3 * now,
        failures=now,
        updated_at=timezone.now(),
    )
    page = client_for(admin_user).get(reverse("admin:execution_trustscore_changelist"))
    html = page.content.decode()
    assert re.search(r'field-recent_successes">3\.0<', html), html
    assert re.search(r'field-recent_failures">1\.0<', html)
    assert f"{3 * now}" not in html and f"{3 * now:.1f}" not in html
    score = TrustScore.objects.get(agent=agent)
    change = client_for(admin_user).get(
        reverse("admin:execution_trustscore_change", args=[score.pk])
    )
    assert change.status_code == 200 and "3.0" in change.content.decode()


def test_the_admin_index_lists_the_trust_scores(admin_user: Any) -> None:
    page = client_for(admin_user).get(reverse("admin:index")).content.decode()
    assert reverse("admin:execution_trustscore_changelist") in page


def test_the_admins_agent_list_shows_the_learned_trust_beside_the_starting_trust(
    admin_user: Any,
) -> None:
    sync_packs()
    execution.record_outcome("fraud-analyst", "failed", now=timezone.now())
    client = client_for(admin_user)
    page = client.get(reverse("admin:planning_agent_changelist")).content.decode()
    row = re.search(r"<tr>.*?fraud-analyst.*?</tr>", page, re.S)
    assert row is not None, page
    assert re.search(r'field-starting_trust">0\.60<', row.group(0))
    assert re.search(r'field-learned_trust">0\.545<', row.group(0)), row.group(0)
    agent = Agent.objects.get(slug="fraud-analyst")
    change = client.get(reverse("admin:planning_agent_change", args=[agent.pk])).content.decode()
    assert "Learned trust" in change and "0.545" in change
