"""The officers' pages: the review inbox, a gate's page and its decisions, a case's gates,
notifications and the home pages' counts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts import roles
from accounts.models import AccessDenial, SigningState
from accounts.tokens import issue_api_token
from audit.chain import case_chain
from audit.models import AuditEvent
from oversight.models import Gate, GateDecision, GateKind, GateRisk, GateStatus, Notification
from planning.models import Case, CaseStatus, NodeStatus, PlanNode, PlanVersion
from tests import personas
from tests.cases import planned_invoice_case
from tests.execution.test_execution import run_ready
from tests.planning.factories import make_case, make_plan

pytestmark = pytest.mark.django_db


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def invoice_case(analyst: Any) -> Case:
    """Submit and plan the static INV-1042 invoice case: a plan gate and a payment hold gate."""
    return planned_invoice_case(analyst)


def plan_gate(case: Case) -> Gate:
    return Gate.objects.get(case=case, version=case.current_version, kind=GateKind.PLAN)


def hold_gate(case: Case) -> Gate:
    return Gate.objects.get(case=case, kind=GateKind.STEP, node__key="place-hold")


def step_gates(
    version: PlanVersion, nodes: list[PlanNode], *, risk: str = GateRisk.LOW, **fields: Any
) -> list[Gate]:
    """Open a step gate on each node directly (bulk_create: fast, for read-side tests)."""
    now = timezone.now()
    group = Group.objects.get(name=roles.OFFICER)
    return Gate.objects.bulk_create(
        [
            Gate(
                case=version.case,
                version=version,
                node=node,
                kind=GateKind.STEP,
                reason=f"step {node.key} writes",
                reasons=[{"classifier": "risk", "detail": "write step", "level": risk}],
                risk=risk,
                approver_group=group,
                content_hash=node.content_hash,
                opened_at=now,
                remind_at=now + timedelta(hours=12),
                deadline=now + timedelta(hours=24 + n),
                **fields,
            )
            for n, node in enumerate(nodes)
        ],
        batch_size=500,
    )


def planned(analyst: Any, leaves: int, **case_fields: Any) -> tuple[Case, PlanVersion]:
    case = make_case(analyst, **case_fields)
    version = make_plan(case, leaves=leaves)
    return case, version


def leaves_of(version: PlanVersion) -> list[PlanNode]:
    return list(PlanNode.objects.filter(version=version, kind="leaf").order_by("position"))


def approve(client: Client, gate: Gate, **extra: Any) -> Any:
    gate.refresh_from_db()
    data = {
        "decision": "approve",
        "version": str(gate.version.number),
        "content_hash": gate.content_hash,
        "detail_opened": "1",
        **extra,
    }
    return client.post(reverse("oversight:gate-decide", args=[gate.pk]), data)


def inbox_gate_ids(client: Client, **params: str) -> list[int]:
    response = client.get(reverse("oversight:inbox"), params)
    assert response.status_code == 200
    return [gate.pk for gate in (row["gate"] for row in response.context["rows"])]


# The inbox ---------------------------------------------------------------------------------


def test_inbox_lists_the_gates_of_the_officers_group_and_not_of_decided_or_old_versions(
    analyst: Any, officer: Any, second_officer: Any
) -> None:
    case = invoice_case(analyst)
    ids = {plan_gate(case).pk, hold_gate(case).pk}
    assert set(inbox_gate_ids(client_for(officer))) == ids
    assert set(inbox_gate_ids(client_for(second_officer))) == ids
    # Once the first officer approved the plan gate it is closed for everybody.
    assert approve(client_for(officer), plan_gate(case)).status_code == 302
    assert set(inbox_gate_ids(client_for(second_officer))) == {hold_gate(case).pk}
    # A gate of a version that is no longer current is in no inbox.
    other, version = planned(analyst, 2)
    step_gates(version, leaves_of(version))
    PlanVersion.objects.filter(pk=version.pk).update(number=1)
    newer = PlanVersion.objects.create(case=other, number=2, strategy="static", content_hash="1")
    Case.objects.filter(pk=other.pk).update(current_version=newer)
    assert set(inbox_gate_ids(client_for(second_officer))) == {hold_gate(case).pk}


def test_escalated_gates_reach_the_escalation_group_only_after_escalation(analyst: Any) -> None:
    supervisor = personas.make_user("sue", roles.SUPERVISOR)
    _case, version = planned(analyst, 1)
    (gate,) = step_gates(
        version, leaves_of(version), escalation_group=Group.objects.get(name=roles.SUPERVISOR)
    )
    assert inbox_gate_ids(client_for(supervisor)) == []
    Gate.objects.filter(pk=gate.pk).update(escalated_at=timezone.now())
    assert inbox_gate_ids(client_for(supervisor)) == [gate.pk]


@pytest.mark.scenario("O1")
def test_a_user_who_is_analyst_and_officer_never_sees_nor_approves_their_own_case() -> None:
    both = personas.make_user("bea", roles.ANALYST)
    both.groups.add(Group.objects.get(name=roles.OFFICER))
    case = invoice_case(both)
    other = invoice_case(personas.analyst())
    client = client_for(both)
    assert set(inbox_gate_ids(client)) == {plan_gate(other).pk, hold_gate(other).pk}
    gate = plan_gate(case)
    page = client.get(reverse("oversight:gate-detail", args=[gate.pk])).content.decode()
    assert 'id="approve-form"' not in page
    assert "nobody decides a gate of a case they submitted" in page
    response = approve(client, gate)
    assert response.status_code == 403
    assert "Nobody decides a gate of a case they submitted." in response.content.decode()
    assert not GateDecision.objects.filter(gate__case=case).exists()
    gate.refresh_from_db()
    assert gate.status == GateStatus.PENDING
    denied = AuditEvent.objects.filter(
        chain=case_chain(case.pk), action="oversight.gate.decision_denied"
    )
    assert denied.count() == 1 and denied.get().actor_user_id == both.pk


def test_the_editor_of_a_version_does_not_see_its_gates(analyst: Any, officer: Any) -> None:
    _case, version = planned(analyst, 2)
    step_gates(version, leaves_of(version))
    PlanVersion.objects.filter(pk=version.pk).update(edited_by=officer)
    assert inbox_gate_ids(client_for(officer)) == []


def test_admins_auditors_analysts_and_outsiders_have_an_empty_inbox(
    analyst: Any, auditor: Any, admin_user: Any, outsider: Any
) -> None:
    invoice_case(analyst)
    for user in (analyst, auditor, admin_user, outsider):
        response = client_for(user).get(reverse("oversight:inbox"))
        assert response.context["rows"] == []
        assert 'data-nav="inbox"' not in response.content.decode()


def test_inbox_filters_by_case_domain_kind_and_risk_and_sorts_by_deadline(
    analyst: Any, officer: Any
) -> None:
    invoice, version = planned(analyst, 3)
    low, medium, high = step_gates(version, leaves_of(version))
    Gate.objects.filter(pk=medium.pk).update(risk=GateRisk.MEDIUM)
    Gate.objects.filter(pk=high.pk).update(risk=GateRisk.HIGH)
    _fraud, fraud_version = planned(analyst, 1, domain="fraud")
    (fraud_gate,) = step_gates(fraud_version, leaves_of(fraud_version))
    Gate.objects.filter(pk=fraud_gate.pk).update(deadline=timezone.now() + timedelta(hours=1))
    client = client_for(officer)
    assert inbox_gate_ids(client) == [fraud_gate.pk, low.pk, medium.pk, high.pk]
    assert inbox_gate_ids(client, sort="-deadline") == [high.pk, medium.pk, low.pk, fraud_gate.pk]
    assert inbox_gate_ids(client, case=str(invoice.pk)) == [low.pk, medium.pk, high.pk]
    assert inbox_gate_ids(client, domain="fraud") == [fraud_gate.pk]
    assert inbox_gate_ids(client, risk="high") == [high.pk]
    assert inbox_gate_ids(client, kind="plan") == []
    assert inbox_gate_ids(client, kind="step", risk="nonsense") == [
        fraud_gate.pk,
        low.pk,
        medium.pk,
        high.pk,
    ]
    # The filters stay in the URL of the next page and in the form.
    page = client.get(reverse("oversight:inbox"), {"risk": "high"}).content.decode()
    assert '<option value="high" selected>' in page


def test_inbox_answers_htmx_with_its_table_only(analyst: Any, officer: Any) -> None:
    _, version = planned(analyst, 2)
    step_gates(version, leaves_of(version))
    response = client_for(officer).get(
        reverse("oversight:inbox"),
        {"risk": "low"},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="inbox-table",
    )
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="inbox-table">') and "<html" not in body
    assert body.count('data-gate="') == 2


@pytest.mark.parametrize("count", [10, 200])
def test_inbox_page_costs_the_same_number_of_queries_for_10_and_200_gates(
    count: int, analyst: Any, officer: Any, django_assert_num_queries: Any
) -> None:
    _, version = planned(analyst, count)
    step_gates(version, leaves_of(version))
    client = client_for(officer)
    client.get(reverse("oversight:inbox"))  # warm the session
    # Session, user, permissions (2), the role with the nav counts (one query), the page count,
    # the page of gates, then its cases, versions and nodes by id: the same for any number.
    with django_assert_num_queries(10):
        response = client.get(reverse("oversight:inbox"))
    assert len(response.context["rows"]) == min(count, 25)
    # The badge stops counting at 99; the page itself counts every gate.
    badge = "99+" if count > 99 else str(count)
    assert f'data-count="inbox">{badge}<' in response.content.decode()
    assert f"{count} gates wait for your decision" in response.content.decode()


def test_navigation_and_home_counts_stop_at_99(analyst: Any, officer: Any) -> None:
    _, version = planned(analyst, 120)
    step_gates(version, leaves_of(version))
    client = client_for(officer)
    home = client.get(reverse("home")).content.decode()
    assert 'data-count="inbox">99+<' in home
    assert '<strong data-count="pending">99+</strong> gates wait for your decision' in home
    assert client.get(reverse("home")).context["inbox_count"] == 100
    inbox = client.get(reverse("oversight:inbox")).content.decode()
    assert "120 gates wait for your decision" in inbox
    # One gate fewer than the cap is shown as it is.
    waiting = Gate.objects.filter(version=version, status=GateStatus.PENDING)
    Gate.objects.filter(pk__in=list(waiting.values_list("pk", flat=True)[:21])).update(
        status=GateStatus.VOID
    )
    assert 'data-count="inbox">99<' in client.get(reverse("home")).content.decode()


def test_navigation_counts_waiting_gates_and_unread_notifications(
    analyst: Any, officer: Any
) -> None:
    invoice_case(analyst)
    page = client_for(officer).get(reverse("home")).content.decode()
    assert 'data-count="inbox">2<' in page
    # Both gates opened at once: one notice for the officer's group.
    unread = Notification.objects.filter(user=officer, read_at__isnull=True).count()
    assert unread == 1
    assert f'data-count="notifications">{unread}<' in page


def test_bulk_approval_of_two_low_risk_step_gates_writes_two_decisions(
    analyst: Any, officer: Any
) -> None:
    case, version = planned(analyst, 3)
    first, second, third = step_gates(version, leaves_of(version))
    response = client_for(officer).post(
        reverse("oversight:inbox-approve"), {"gate": [first.pk, second.pk], "next": "/inbox/"}
    )
    assert response.status_code == 302 and response["Location"] == "/inbox/"
    decisions = GateDecision.objects.filter(gate__case=case)
    assert sorted(decisions.values_list("gate_id", flat=True)) == [first.pk, second.pk]
    assert set(decisions.values_list("decider_id", flat=True)) == {officer.pk}
    statuses = dict(Gate.objects.filter(case=case).values_list("pk", "status"))
    assert statuses == {first.pk: "approved", second.pk: "approved", third.pk: "pending"}
    decided = AuditEvent.objects.filter(chain=case_chain(case.pk), action="oversight.gate.decided")
    assert decided.count() == 2


def test_bulk_approval_refuses_a_high_risk_gate_and_approves_nothing(
    analyst: Any, officer: Any
) -> None:
    _case, version = planned(analyst, 2)
    low, high = step_gates(version, leaves_of(version))
    Gate.objects.filter(pk=high.pk).update(risk=GateRisk.HIGH)
    client = client_for(officer)
    response = client.post(reverse("oversight:inbox-approve"), {"gate": [low.pk, high.pk]})
    assert response.status_code == 302
    assert not GateDecision.objects.exists()
    page = client.get(response["Location"]).content.decode()
    assert "Nothing was approved" in page and "approve it on its own page" in page


# A gate's page -----------------------------------------------------------------------------


def test_the_gate_page_says_why_it_is_gated_and_what_the_plan_would_do(
    analyst: Any, officer: Any
) -> None:
    case = invoice_case(analyst)
    gate = hold_gate(case)
    response = client_for(officer).get(reverse("oversight:gate-detail", args=[gate.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    why = page.split('data-section="why-gated"', 1)[1].split("</section>", 1)[0]
    assert gate.reason and gate.reason in why
    for finding in gate.reasons:
        assert finding["detail"] in why
    effects = page.split('data-section="plan-effects"', 1)[1].split("</section>", 1)[0]
    assert "place_payment_hold on INV-1042 — financial" in effects
    assert "the output of audit-report, once it has run" in effects
    # The read-only checks are not consequences.
    assert "check_totals" not in effects
    # The step's detail: parent goal, siblings, rationale, provenance; the report not run yet.
    detail = page.split('id="step-detail"', 1)[1].split("</details>", 1)[0]
    assert "the payment clerk acts on the report" in detail
    report = detail.split('data-upstream="audit-report"', 1)[1].split("</div>", 1)[0]
    assert 'data-ran="false"' in report and "not run yet" in report
    assert "audit-report" in detail and "static" in detail
    # The DAG highlights the gated node.
    dot = response.context["dot"]
    assert 'class="highlight"' in dot and dot.count('class="highlight"') == 1
    node_line = next(line for line in dot.splitlines() if 'class="highlight"' in line)
    assert f'"node-{gate.node_id}"' in node_line
    # Signature and the R9 controls.
    assert 'type="password"' in page and "approval of step place-hold" in page
    assert 'name="content_hash" value="' + gate.content_hash in page
    assert "oversight/gate.js" in page and "<script>" not in page
    edit = reverse("oversight:plan-edit", args=[case.pk, gate.node_id])
    assert f'href="{edit}" data-action="edit"' in page
    assert client_for(officer).get(edit).status_code == 200


def test_approving_the_plan_gate_through_the_page_approves_the_case(
    analyst: Any, officer: Any
) -> None:
    case = invoice_case(analyst)
    gate = plan_gate(case)
    client = client_for(officer)
    response = approve(client, gate)
    assert response.status_code == 302
    assert response["Location"] == reverse("oversight:gate-detail", args=[gate.pk])
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING  # approved, and its first steps are ready
    page = client.get(response["Location"]).content.decode()
    assert "Your approval is recorded; the gate is approved." in page
    decisions = page.split('data-section="decisions"', 1)[1]
    assert officer.get_username() in decisions and "Approve" in decisions


def test_an_approval_without_the_opened_detail_is_refused(analyst: Any, officer: Any) -> None:
    gate = plan_gate(invoice_case(analyst))
    response = approve(client_for(officer), gate, detail_opened="")
    assert response.status_code == 422
    assert "Open and read the step detail before approving" in response.content.decode()
    assert not GateDecision.objects.exists()
    # Without JavaScript the hidden flag stays empty and the detail's checkbox carries it.
    response = approve(client_for(officer), gate, detail_opened=["", "1"])
    assert response.status_code == 302
    assert GateDecision.objects.filter(gate=gate, decider=officer).count() == 1


def test_a_rejection_needs_a_reason_code_and_then_rejects_the_case(
    analyst: Any, officer: Any
) -> None:
    case = invoice_case(analyst)
    gate = plan_gate(case)
    client = client_for(officer)
    url = reverse("oversight:gate-decide", args=[gate.pk])
    data = {"decision": "reject", "version": "1", "content_hash": gate.content_hash}
    response = client.post(url, {**data, "reason": "totals look off"})
    assert response.status_code == 422
    assert "a reason code is required to reject" in response.content.decode()
    assert "totals look off" in response.content.decode()  # the form comes back filled in
    response = client.post(url, {**data, "reason_code": "too-risky", "reason": "no"})
    assert response.status_code == 302
    case.refresh_from_db()
    assert case.status == CaseStatus.REJECTED
    page = client.get(reverse("oversight:gate-detail", args=[gate.pk])).content.decode()
    decisions = page.split('data-section="decisions"', 1)[1].split("</section>", 1)[0]
    assert "Reason: Too risky to run as planned" in decisions and ">too-risky<" not in decisions
    assert 'id="approve-form"' not in page
    # No step of a rejected plan still waits for an approval: none will come.
    leaves = PlanNode.objects.filter(version=gate.version, kind=PlanNode.Kind.LEAF)
    assert set(leaves.values_list("status", flat=True)) == {NodeStatus.CANCELLED}
    case_page = client.get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    assert 'data-status="awaiting_approval"' not in case_page
    assert f"The case was rejected by {officer.username}</strong>" in case_page
    assert "Why: Too risky to run as planned — no" in case_page


def test_a_stale_decision_is_refused_with_409(analyst: Any, officer: Any) -> None:
    gate = plan_gate(invoice_case(analyst))
    response = approve(client_for(officer), gate, content_hash="0" * 64)
    assert response.status_code == 409
    assert "Your decision was not recorded" in response.content.decode()
    response = approve(client_for(officer), gate, version="7")
    assert response.status_code == 409
    assert not GateDecision.objects.exists()


@pytest.mark.scenario("O8")
def test_the_signature_step_asks_for_the_password_and_shows_the_signature(
    analyst: Any, officer: Any
) -> None:
    officer.first_name, officer.last_name = "Olivia", "Ortega"
    officer.save()
    case = invoice_case(analyst)
    gate = hold_gate(case)
    assert gate.needs_signature
    client = client_for(officer)
    response = approve(client, gate)
    assert response.status_code == 403
    assert "enter your password" in response.content.decode()
    response = approve(client, gate, password="wrong")
    assert response.status_code == 403
    assert "wrong password" in response.content.decode()
    assert SigningState.objects.get(user=officer).failures == 1
    assert not GateDecision.objects.exists()
    response = approve(client, gate, password=personas.PASSWORD)
    assert response.status_code == 302
    decision = GateDecision.objects.get(gate=gate)
    assert decision.is_signed
    page = client.get(reverse("oversight:gate-detail", args=[gate.pk])).content.decode()
    signature = page.split("data-signature>", 1)[1].split("</dl>", 1)[0]
    assert "Olivia Ortega" in signature
    assert decision.time.strftime("%Y-%m-%d %H:%M:%S") in signature
    assert "approval of step place-hold (place_payment_hold) in plan version 1" in signature
    assert gate.content_hash in signature


GATE_PAGE_QUERIES = 13


def _hold_page(client: Client, gate: Gate) -> tuple[str, str]:
    """Return the hold gate's page and its step detail."""
    page = client.get(reverse("oversight:gate-detail", args=[gate.pk])).content.decode()
    return page, page.split('id="step-detail"', 1)[1].split("</details>", 1)[0]


def _run_to_the_hold(case: Case, officer: Any) -> None:
    """Approve the plan and run every step up to the payment hold, as a worker would."""
    approve(client_for(officer), plan_gate(case))
    run_ready(case)
    assert leaves_of(case.current_version)[-2].key == "audit-report"


def test_the_hold_gate_shows_the_audit_reports_recommendation_once_it_ran_and_after_signing(
    analyst: Any, officer: Any, second_officer: Any
) -> None:
    case = invoice_case(analyst)
    gate = hold_gate(case)
    client = client_for(second_officer)
    _page, detail = _hold_page(client, gate)
    assert "<dt>recommendation</dt>" not in detail and "not run yet" in detail
    _run_to_the_hold(case, officer)
    report = PlanNode.objects.get(version=case.current_version, key="audit-report")
    assert report.output["recommendation"] == "hold"
    page, detail = _hold_page(client, gate)
    # The step detail: the report as it is, not "has not run".
    shown = detail.split('data-upstream="audit-report"', 1)[1].split("</dl>", 1)[0]
    assert 'data-ran="true"' in shown
    assert "<dt>recommendation</dt><dd>hold</dd>" in shown
    assert report.output["findings"][0] in shown
    assert "not run yet" not in shown and "once it has run" not in page
    # The hold itself has not run: its own output says so.
    own = detail.split('data-output="place-hold">', 1)[1].split("</dd>", 1)[0]
    assert "not run yet" in own
    # The effects list and the signature's meaning name it too.
    effects = page.split('data-section="plan-effects"', 1)[1].split("</section>", 1)[0]
    assert "the output of audit-report: invoice id: INV-1042" in effects
    assert "recommendation: hold" in effects
    meaning = page.split('class="signature-note small">', 1)[1].split("</p>", 1)[0]
    assert "acting on the output of audit-report (" in meaning
    assert "recommendation: hold" in meaning
    # Signed: the signature records what it acted on, and the page still shows the report.
    assert approve(client, gate, password=personas.PASSWORD).status_code == 302
    decision = GateDecision.objects.get(gate=gate)
    assert "recommendation: hold" in decision.signature_meaning
    page, detail = _hold_page(client, gate)
    signature = page.split("data-signature>", 1)[1].split("</dl>", 1)[0]
    assert "recommendation: hold" in signature
    assert "<dt>recommendation</dt><dd>hold</dd>" in detail


def test_a_signature_meaning_shown_before_the_report_ran_is_not_signed_after_it_ran(
    analyst: Any, officer: Any, second_officer: Any
) -> None:
    case = invoice_case(analyst)
    gate = hold_gate(case)
    client = client_for(second_officer)
    page, _detail = _hold_page(client, gate)
    shown = page.split('name="meaning" value="', 1)[1].split('"', 1)[0]
    assert "the output of audit-report, not run yet" in shown
    _run_to_the_hold(case, officer)
    response = approve(client, gate, password=personas.PASSWORD, meaning=shown)
    assert response.status_code == 409
    assert "what the step acts on changed after the page was shown" in response.content.decode()
    assert not GateDecision.objects.filter(gate=gate).exists()
    # The page it answers with shows the report: signing what it shows is accepted.
    fresh = response.content.decode().split('name="meaning" value="', 1)[1].split('"', 1)[0]
    assert "recommendation: hold" in fresh
    assert approve(client, gate, password=personas.PASSWORD, meaning=fresh).status_code == 302


def test_through_the_api_a_signature_binds_the_meaning_read_and_refuses_a_stale_one(
    analyst: Any, officer: Any, second_officer: Any
) -> None:
    case = invoice_case(analyst)
    gate = hold_gate(case)
    api = Client(headers={"Authorization": f"Bearer {issue_api_token(second_officer)}"})
    read = api.get(f"/api/gates/{gate.pk}").json()
    shown = read["signature_meaning"]
    assert "the output of audit-report, not run yet" in shown
    assert api.get(f"/api/gates/{plan_gate(case).pk}").json()["signature_meaning"] is None
    _run_to_the_hold(case, officer)
    body = {"decision": "approve", "password": personas.PASSWORD, "meaning": shown}
    url = f"/api/gates/{gate.pk}/decision"
    response = api.post(url, body, content_type="application/json")
    assert response.status_code == 409
    assert "what the step acts on changed" in response.json()["message"]
    assert not GateDecision.objects.filter(gate=gate).exists()
    fresh = api.get(f"/api/gates/{gate.pk}").json()["signature_meaning"]
    assert "recommendation: hold" in fresh
    response = api.post(url, {**body, "meaning": fresh}, content_type="application/json")
    assert response.status_code == 200, response.content
    signed = response.json()
    assert signed["signature_meaning"] is None  # decided: nothing left to sign
    assert "recommendation: hold" in signed["decisions"][0]["signature"]["meaning"]


def test_the_plan_gates_detail_says_how_many_steps_ran_not_that_none_did(
    analyst: Any, officer: Any, second_officer: Any
) -> None:
    case = invoice_case(analyst)
    url = reverse("oversight:gate-detail", args=[plan_gate(case).pk])
    client = client_for(second_officer)
    assert "No step of this plan has run yet." in client.get(url).content.decode()
    _run_to_the_hold(case, officer)
    page = client.get(url).content.decode()
    assert "6 of its 7 steps ran or are running" in page
    assert "No step of this plan has run" not in page


def test_an_upstream_output_is_escaped_on_the_gate_page(
    analyst: Any, officer: Any, second_officer: Any
) -> None:
    case = invoice_case(analyst)
    _run_to_the_hold(case, officer)
    hostile = '<script>alert("x")</script>'
    PlanNode.objects.filter(version=case.current_version, key="audit-report").update(
        output={"invoice_id": "INV-1042", "findings": [hostile], "recommendation": hostile}
    )
    page, _detail = _hold_page(client_for(second_officer), hold_gate(case))
    assert hostile not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


def test_the_gate_page_reads_the_same_number_of_queries_before_and_after_steps_ran(
    analyst: Any, officer: Any, second_officer: Any, django_assert_num_queries: Any
) -> None:
    case = invoice_case(analyst)
    gate = hold_gate(case)
    client = client_for(second_officer)
    url = reverse("oversight:gate-detail", args=[gate.pk])
    client.get(url)  # warm the session
    # The version's nodes are read once, with their outputs: showing them costs no query.
    with django_assert_num_queries(GATE_PAGE_QUERIES):
        assert "not run yet" in client.get(url).content.decode()
    _run_to_the_hold(case, officer)
    client.get(url)
    with django_assert_num_queries(GATE_PAGE_QUERIES):
        assert "recommendation: hold" in client.get(url).content.decode()


@pytest.mark.scenario("W4")
def test_an_analyst_gets_404_for_another_analysts_gate(analyst: Any) -> None:
    other = personas.analyst("bob")
    gate = plan_gate(invoice_case(other))
    client = client_for(analyst)
    assert client.get(reverse("oversight:gate-detail", args=[gate.pk])).status_code == 404
    assert approve(client, gate).status_code == 404
    assert client.get(reverse("oversight:case-gates", args=[gate.case_id])).status_code == 404
    assert client.get(reverse("oversight:gate-detail", args=[gate.pk + 999])).status_code == 404
    # Recorded once for the minute (then counted and summarised: accounts.denials).
    attempts = AuditEvent.objects.filter(action="security.access.denied", actor_user=analyst)
    assert [(e.data["kind"], e.data["path"]) for e in attempts] == [
        ("not_found", reverse("oversight:gate-detail", args=[gate.pk]))
    ]
    assert AccessDenial.objects.get(user=analyst).count == 4
    assert not GateDecision.objects.exists()


def test_the_submitter_reads_their_own_gate_without_controls(analyst: Any) -> None:
    gate = hold_gate(invoice_case(analyst))
    response = client_for(analyst).get(reverse("oversight:gate-detail", args=[gate.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert 'data-section="read-only"' in page and 'id="approve-form"' not in page
    assert "place_payment_hold on INV-1042" in page


def test_the_case_page_loads_its_gates_panel(analyst: Any, officer: Any) -> None:
    case = invoice_case(analyst)
    client = client_for(officer)
    page = client.get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    url = reverse("oversight:case-gates", args=[case.pk])
    assert f'hx-get="{url}"' in page and f'href="{url}"' in page
    fragment = client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="case-gates")
    body = fragment.content.decode()
    assert body.lstrip().startswith('<section id="case-gates"') and "<html" not in body
    for gate in (plan_gate(case), hold_gate(case)):
        assert reverse("oversight:gate-detail", args=[gate.pk]) in body
    assert body.count('data-yours="true"') == 2
    full = client.get(url).content.decode()  # without JavaScript: a page of its own
    assert "<html" in full and 'id="case-gates"' in full


# Notifications and home --------------------------------------------------------------------


def test_notifications_are_listed_newest_first_and_marked_read(analyst: Any, officer: Any) -> None:
    case = invoice_case(analyst)
    Notification.objects.create(user=officer, kind="note", message="second notice", url="/")
    client = client_for(officer)
    page = client.get(reverse("oversight:notifications")).content.decode()
    assert page.index("second notice") < page.index(f"Case #{case.pk}")
    first = Notification.objects.filter(user=officer).order_by("created_at", "id").first()
    assert first is not None
    response = client.post(reverse("oversight:notification-read", args=[first.pk]), {"open": "1"})
    assert response.status_code == 302 and response["Location"] == first.url
    first.refresh_from_db()
    assert first.read_at is not None
    assert Notification.objects.filter(user=officer, read_at__isnull=True).count() == 1
    # Another user's notice is not the officer's to mark.
    theirs = Notification.objects.create(user=analyst, kind="note", message="x")
    url = reverse("oversight:notification-read", args=[theirs.pk])
    assert client.post(url).status_code == 404
    client.post(reverse("oversight:notifications-read-all"))
    assert not Notification.objects.filter(user=officer, read_at__isnull=True).exists()
    theirs.refresh_from_db()
    assert theirs.read_at is None


def test_a_gates_wait_notice_goes_read_once_every_gate_it_names_is_decided(
    analyst: Any, officer: Any, second_officer: Any
) -> None:
    case = invoice_case(analyst)

    def unread(user: Any) -> list[str]:
        rows = Notification.objects.filter(user=user, case=case, read_at__isnull=True)
        return list(rows.values_list("message", flat=True))

    waiting = f"Case #{case.pk} “{case.title}”: 2 gates wait for your decision."
    assert unread(officer) == [waiting] and unread(second_officer) == [waiting]
    notice = Notification.objects.get(user=officer, case=case)
    assert sorted(notice.gate_ids) == sorted([plan_gate(case).pk, hold_gate(case).pk])
    # One of the two decided: the hold still waits, the notice stays unread.
    assert approve(client_for(officer), plan_gate(case)).status_code == 302
    assert unread(officer) == [waiting] and unread(second_officer) == [waiting]
    # Both decided: it is no longer true, for either officer.
    run_ready(case)
    assert approve(client_for(second_officer), hold_gate(case), password=personas.PASSWORD)
    assert unread(officer) == [] and unread(second_officer) == []
    page = client_for(officer).get(reverse("home")).content.decode()
    assert "No unread notifications" in page


def test_a_gate_notice_goes_read_when_an_edit_voids_its_gates(
    analyst: Any, officer: Any, second_officer: Any
) -> None:
    case = invoice_case(analyst)
    hold = hold_gate(case)
    response = client_for(officer).post(
        reverse("oversight:plan-edit", args=[case.pk, hold.node_id]),
        {
            "agent": hold.node.agent,
            "task": "Place a payment hold when the report recommends one, today",
            "inputs": '{"report": {"$ref": "audit-report"}}',
            "depends_on": ["audit-report"],
            "reason_code": "incorrect",
            "reason": "clearer task",
            "base_version": "1",
        },
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    old = Notification.objects.filter(gate_id__in=[hold.pk, plan_gate(case).pk])
    assert old.exists() and not old.filter(read_at__isnull=True).exists()
    # The new version's gates wait: the second officer is told so, unread.
    fresh = Notification.objects.filter(user=second_officer, case=case, read_at__isnull=True)
    assert fresh.count() == 1


def test_home_pages_show_real_counts(analyst: Any, officer: Any, auditor: Any) -> None:
    invoice_case(analyst)
    make_case(analyst, status=CaseStatus.PLAN_FAILED)
    officer_home = client_for(officer).get(reverse("home")).content.decode()
    assert '<strong data-count="pending">2</strong>' in officer_home
    assert "place-hold" in officer_home and reverse("oversight:inbox") in officer_home
    analyst_home = client_for(analyst).get(reverse("home")).content.decode()
    cases = analyst_home.split('data-home="my-cases"', 1)[1].split("</ul>", 1)[0]
    assert 'data-count="awaiting_approval">1<' in cases and 'data-count="plan_failed">1<' in cases
    auditor_home = client_for(auditor).get(reverse("home")).content.decode()
    today = AuditEvent.objects.filter(time__date=timezone.localdate()).count()
    assert today > 0
    assert f'<strong data-count="events-today">{today}</strong>' in auditor_home
    assert "1 unread notification" in client_for(officer).get(reverse("home")).content.decode()


def test_an_escalation_gate_is_named_an_escalation_and_its_reason_is_said_once(
    analyst: Any, officer: Any
) -> None:
    from oversight.actions.opening import open_escalation_gate

    case = invoice_case(analyst)
    hold = hold_gate(case)
    escalation = open_escalation_gate(
        hold.version, hold.node, reason="the payment hold failed twice: a person decides"
    )
    page = client_for(officer).get(reverse("oversight:gate-detail", args=[escalation.pk]))
    html = page.content.decode()
    assert "<h1>Escalation: place-hold</h1>" in html
    assert "<title>Escalation of step place-hold" in html
    why = html.split('data-section="why-gated"', 1)[1].split("</section>", 1)[0]
    assert why.count("the payment hold failed twice") == 1, why
    step = client_for(officer).get(reverse("oversight:gate-detail", args=[hold.pk])).content
    why = step.decode().split('data-section="why-gated"', 1)[1].split("</section>", 1)[0]
    assert why.count(hold.reason) == 1, why
    gates = client_for(officer).get(reverse("oversight:case-gates", args=[case.pk]))
    listed = gates.content.decode()
    assert "Escalation of place-hold" in listed and "Step place-hold" in listed
