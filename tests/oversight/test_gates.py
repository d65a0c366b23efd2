"""Gates through the actions and the API: opening, separation of duties, binding, quorum,
e-signatures, rejection, deadlines (RELIABILITY R1 to R7, O1, O3, O5 to O8)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.core import mail
from django.db import connection
from django.test import Client
from django.utils import timezone

from accounts import roles
from accounts import tokens as api_tokens
from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from oversight.actions import deadlines, gates
from oversight.actions.gates import DecisionInput
from oversight.models import Gate, GateDecision, GateKind, GateStatus, Notification
from planning.models import Case, CaseStatus, NodeStatus, PlanNode
from tests import personas
from tests.cases import planned_invoice_case

pytestmark = pytest.mark.django_db

APPROVE = DecisionInput(decision="approve")


def _invoice_case(submitter: Any | None = None) -> Case:
    return planned_invoice_case(submitter or personas.analyst())


def _gate(case: Case, kind: str = GateKind.PLAN, key: str | None = None) -> Gate:
    gates_ = Gate.objects.filter(case=case, kind=kind, version=case.current_version)
    if key is not None:
        gates_ = gates_.filter(node__key=key)
    return gates_.get()


def _events(case: Case, action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain=case_chain(case.pk), action=action))


def _api(user: Any) -> Client:
    return Client(headers={"Authorization": f"Bearer {api_tokens.issue_api_token(user)}"})


# Opening -------------------------------------------------------------------------------------


def test_a_materialised_invoice_plan_opens_a_plan_gate_and_a_signed_step_gate_for_the_hold() -> (
    None
):
    case = _invoice_case()
    plan_gate = _gate(case)
    assert plan_gate.status == GateStatus.PENDING
    assert plan_gate.content_hash == case.current_version.content_hash
    assert not plan_gate.needs_signature
    hold = _gate(case, GateKind.STEP)
    assert hold.node.key == "place-hold"
    assert hold.needs_signature
    assert "financial tool place_payment_hold" in hold.reason
    assert hold.content_hash == hold.node.content_hash
    assert PlanNode.objects.get(pk=hold.node.pk).status == NodeStatus.AWAITING_APPROVAL
    # Read-only steps run without a gate of their own.
    assert Gate.objects.filter(case=case).count() == 2
    assert len(_events(case, "oversight.gate.opened")) == 2


def test_a_gate_that_opens_notifies_the_officers_but_never_the_submitter() -> None:
    officer = personas.officer()
    officer.email = "olivia@example.test"
    officer.save()
    analyst = personas.analyst()
    analyst.groups.add(Group.objects.get(name=roles.OFFICER))
    with_callbacks = _invoice_case(analyst)
    notices = Notification.objects.filter(case=with_callbacks, kind="gate.opened")
    assert set(notices.values_list("user__username", flat=True)) == {"olivia"}


def test_gate_e_mail_goes_out_once_the_transaction_commits(
    django_capture_on_commit_callbacks: Any,
) -> None:
    officer = personas.officer()
    officer.email = "olivia@example.test"
    officer.save()
    with django_capture_on_commit_callbacks(execute=True):
        case = _invoice_case()
    assert [m.to for m in mail.outbox] == [["olivia@example.test"]]
    assert f"Case #{case.pk}" in mail.outbox[0].subject


# Separation of duties ------------------------------------------------------------------------


@pytest.mark.scenario("O1")
@pytest.mark.scenario("R1")
def test_a_user_with_analyst_and_officer_roles_cannot_approve_their_own_case() -> None:
    both = personas.analyst("bo")
    both.groups.add(Group.objects.get(name=roles.OFFICER))
    case = _invoice_case(both)
    gate = _gate(case)
    response = _api(both).post(
        f"/api/gates/{gate.pk}/decision", {"decision": "approve"}, content_type="application/json"
    )
    assert response.status_code == 403
    assert "submitted" in response.json()["message"]
    assert not GateDecision.objects.exists()
    gate.refresh_from_db()
    assert gate.status == GateStatus.PENDING
    denials = _events(case, "oversight.gate.decision_denied")
    assert [e.actor_label for e in denials] == ["bo"]


@pytest.mark.scenario("O10")
@pytest.mark.scenario("R1")
def test_an_admin_cannot_decide_a_gate_even_holding_the_officer_role() -> None:
    case = _invoice_case()
    admin = personas.admin()
    admin.groups.add(Group.objects.get(name=roles.OFFICER))
    with pytest.raises(gates.DecisionDenied, match="admins"):
        gates.decide_gate(gate_id=_gate(case).pk, user=admin, decision=APPROVE)
    assert not GateDecision.objects.exists()
    assert len(_events(case, "oversight.gate.decision_denied")) == 1


def test_analysts_and_auditors_cannot_decide_gates() -> None:
    case = _invoice_case()
    for user in (personas.analyst("al"), personas.auditor()):
        with pytest.raises(gates.DecisionDenied):
            gates.decide_gate(gate_id=_gate(case).pk, user=user, decision=APPROVE)
    assert not GateDecision.objects.exists()


@pytest.mark.scenario("W4")
def test_another_analysts_gate_is_404_through_the_api() -> None:
    case = _invoice_case()
    other = personas.analyst("al")
    client = _api(other)
    gate = _gate(case)
    assert client.get(f"/api/gates/{gate.pk}").status_code == 404
    response = client.post(
        f"/api/gates/{gate.pk}/decision", {"decision": "approve"}, content_type="application/json"
    )
    assert response.status_code == 404
    assert client.get("/api/gates").json()["items"] == []


def test_officers_list_the_gates_of_their_groups_and_not_of_their_own_cases() -> None:
    officer = personas.officer()
    officer.groups.add(Group.objects.get(name=roles.ANALYST))
    theirs = _invoice_case(officer)  # an officer who is also an analyst submits one
    other = _invoice_case()
    items = _api(officer).get("/api/gates?status=pending").json()["items"]
    assert {item["case"] for item in items} == {other.pk}
    assert theirs.pk not in {item["case"] for item in items}
    kinds = sorted(item["kind"] for item in items)
    assert kinds == ["plan", "step"]
    plan = next(item for item in items if item["kind"] == "plan")
    assert plan["approver_group"] == roles.OFFICER
    assert plan["quorum"] == 1 and plan["approvals"] == 0 and plan["node"] is None


# Deciding ------------------------------------------------------------------------------------


def test_approving_the_plan_gate_approves_the_case_and_tells_the_submitter() -> None:
    case = _invoice_case()
    officer = personas.officer()
    response = _api(officer).post(
        f"/api/gates/{_gate(case).pk}/decision",
        {"decision": "approve", "version": 1, "content_hash": case.current_version.content_hash},
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "approved"
    assert body["decisions"][0]["by"] == "olivia"
    assert body["decisions"][0]["signature"] is None
    case.refresh_from_db()
    assert case.status == CaseStatus.EXECUTING  # approved, and its first steps are ready
    assert Notification.objects.filter(user=case.submitter, kind="case.approved").exists()
    assert [e.action for e in AuditEvent.objects.filter(chain=case_chain(case.pk))][-4:] == [
        "oversight.gate.decided",
        "planning.case.approved",
        "planning.case.executing",
        "execution.leaves.ready",
    ]
    assert verify_chain(case_chain(case.pk)) == []


@pytest.mark.scenario("O3")
def test_a_repeated_decision_is_409_and_changes_nothing() -> None:
    case = _invoice_case()
    officer = personas.officer()
    client = _api(officer)
    url = f"/api/gates/{_gate(case).pk}/decision"
    assert (
        client.post(url, {"decision": "approve"}, content_type="application/json").status_code
        == 200
    )
    again = client.post(url, {"decision": "approve"}, content_type="application/json")
    assert again.status_code == 409
    assert GateDecision.objects.count() == 1


@pytest.mark.scenario("O3")
@pytest.mark.django_db(transaction=True)
def test_two_officers_racing_on_one_gate_end_with_exactly_one_decision() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (CI runs it)")
    case = _invoice_case()
    gate = _gate(case)
    officers = [personas.officer(), personas.second_officer()]
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def decide(user: Any, decision: str) -> None:
        try:
            barrier.wait()
            gates.decide_gate(
                gate_id=gate.pk,
                user=user,
                decision=DecisionInput(decision=decision, reason_code="incorrect"),
            )
            outcomes.append("decided")
        except gates.GateConflict:
            outcomes.append("conflict")
        finally:
            connection.close()

    threads = [
        threading.Thread(target=decide, args=(officers[0], "approve")),
        threading.Thread(target=decide, args=(officers[1], "reject")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["conflict", "decided"]
    assert GateDecision.objects.filter(gate=gate).count() == 1
    assert len(_events(case, "oversight.gate.decided")) == 1


def _cancel(case: Case, officer: Any) -> Any:
    from execution.cases import cancel_case

    return cancel_case(
        case_id=case.pk, user=officer, reason_code="duplicate", reason="submitted twice"
    )


def _edit(case: Case, officer: Any) -> Any:
    from oversight.actions.edits import edit_plan

    return edit_plan(
        case_id=case.pk,
        user=officer,
        node_key="check-totals",
        changes={"task": "Check the invoice totals twice"},
        reason_code="incomplete",
        reason="one check is not enough",
    )


@pytest.mark.scenario("S9")
@pytest.mark.parametrize("other", [_cancel, _edit], ids=["cancel", "edit"])
@pytest.mark.django_db(transaction=True)
def test_a_gate_decision_racing_a_cancel_or_an_edit_never_deadlocks(other: Any) -> None:
    """The decision takes its gate's row while the other path holds the case's row and then
    asks for the gate's (the order of a cancel or an edit): on the old order (gate, then case)
    PostgreSQL broke the deadlock and one of them failed. Now the decision waits for the case
    first, holding nothing: the other path ends and the decision is refused cleanly (409)."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (CI runs it)")
    from tests.lock_order import race_behind_the_case_row

    case = _invoice_case()
    gate = _gate(case)
    officer, second = personas.officer(), personas.second_officer()
    decided, done = race_behind_the_case_row(
        case.pk,
        lambda: gates.decide_gate(gate_id=gate.pk, user=second, decision=APPROVE),
        lambda: other(case, officer),
    )
    assert not isinstance(done, BaseException), done
    assert isinstance(decided, gates.GateConflict), decided
    gate.refresh_from_db()
    assert gate.status == GateStatus.VOID
    assert not GateDecision.objects.filter(gate=gate).exists()
    assert verify_chain(case_chain(case.pk)) == []


@pytest.mark.scenario("O5")
@pytest.mark.scenario("R3")
def test_a_decision_on_what_the_officer_no_longer_sees_is_409_stale() -> None:
    case = _invoice_case()
    gate = _gate(case)
    officer = personas.officer()
    for stale in (
        DecisionInput(decision="approve", version=2),
        DecisionInput(decision="approve", content_hash="0" * 64),
    ):
        with pytest.raises(gates.GateConflict):
            gates.decide_gate(gate_id=gate.pk, user=officer, decision=stale)
    assert not GateDecision.objects.exists()


@pytest.mark.scenario("O7")
@pytest.mark.parametrize(
    ("reason_code", "message"),
    [("", "reason code is required"), ("nonsense", "unknown reason code")],
)
def test_a_rejection_needs_a_reason_code_from_the_list(reason_code: str, message: str) -> None:
    case = _invoice_case()
    response = _api(personas.officer()).post(
        f"/api/gates/{_gate(case).pk}/decision",
        {"decision": "reject", "reason_code": reason_code, "reason": "no"},
        content_type="application/json",
    )
    assert response.status_code == 422
    assert message in response.json()["fields"]["reason_code"][0]
    assert not GateDecision.objects.exists()
    assert not _events(case, "oversight.gate.decided")


@pytest.mark.scenario("O7", "R6")
def test_a_rejection_with_the_reason_code_other_needs_its_text_in_the_api_and_the_form() -> None:
    from django.urls import reverse

    case = _invoice_case()
    gate = _gate(case)
    officer = personas.officer()
    response = _api(officer).post(
        f"/api/gates/{gate.pk}/decision",
        {"decision": "reject", "reason_code": "other", "reason": "   "},
        content_type="application/json",
    )
    assert response.status_code == 422
    assert list(response.json()["fields"]) == ["reason"]
    assert "needs the reason in words" in response.json()["fields"]["reason"][0]
    client = Client()
    client.force_login(officer)
    form = {"decision": "reject", "reason_code": "other", "reason": ""}
    page = client.post(reverse("oversight:gate-decide", args=[gate.pk]), form)
    assert page.status_code == 422
    body = page.content.decode()
    assert 'id="reject-reason-error"' in body and "needs the reason in words" in body
    assert not GateDecision.objects.exists()
    assert not _events(case, "oversight.gate.decided")
    done = client.post(
        reverse("oversight:gate-decide", args=[gate.pk]), {**form, "reason": "wrong supplier"}
    )
    assert done.status_code == 302
    assert GateDecision.objects.get().reason == "wrong supplier"


def test_the_reason_codes_are_listed_with_what_they_apply_to() -> None:
    codes = _api(personas.officer()).get("/api/reason-codes").json()
    by_code = {c["code"]: c for c in codes}
    assert {
        "incorrect",
        "incomplete",
        "too-risky",
        "wrong-agent",
        "duplicate",
        "policy",
        "other",
    } <= set(by_code)
    assert set(by_code["other"]["applies_to"]) == {"reject", "edit", "cancel", "rerun", "policy"}


def test_rejecting_the_plan_gate_rejects_the_case_and_voids_its_other_gates() -> None:
    case = _invoice_case()
    gates.decide_gate(
        gate_id=_gate(case).pk,
        user=personas.officer(),
        decision=DecisionInput(decision="reject", reason_code="too-risky", reason="no hold"),
    )
    case.refresh_from_db()
    assert case.status == CaseStatus.REJECTED
    assert _gate(case, GateKind.STEP).status == GateStatus.VOID
    decision = GateDecision.objects.get()
    assert (decision.reason_code, decision.reason) == ("too-risky", "no hold")
    assert Notification.objects.filter(user=case.submitter, kind="case.rejected").exists()


def test_rejecting_a_step_with_failure_policy_escalate_opens_an_escalation_gate() -> None:
    case = _invoice_case()
    hold = _gate(case, GateKind.STEP)
    assert hold.node.failure_policy == "escalate"
    gates.decide_gate(
        gate_id=hold.pk,
        user=personas.officer(),
        decision=DecisionInput(decision="reject", reason_code="incorrect"),
    )
    escalation = Gate.objects.get(case=case, kind=GateKind.ESCALATION)
    assert escalation.node_id == hold.node_id
    assert escalation.approver_group.name == roles.SUPERVISOR
    assert "rejected (incorrect)" in escalation.reason


def test_quorum_two_needs_two_distinct_officers() -> None:
    case = _invoice_case()
    gate = _gate(case)
    Gate.objects.filter(pk=gate.pk).update(quorum=2)
    first, second = personas.officer(), personas.second_officer()
    after_one = gates.decide_gate(gate_id=gate.pk, user=first, decision=APPROVE)
    assert (after_one.status, after_one.approvals) == (GateStatus.PENDING, 1)
    with pytest.raises(gates.GateConflict, match="already decided"):
        gates.decide_gate(gate_id=gate.pk, user=first, decision=APPROVE)
    after_two = gates.decide_gate(gate_id=gate.pk, user=second, decision=APPROVE)
    assert (after_two.status, after_two.approvals) == (GateStatus.APPROVED, 2)
    assert after_two.approval_expires_at is not None


# E-signatures --------------------------------------------------------------------------------


@pytest.mark.scenario("O8")
@pytest.mark.scenario("R7")
def test_a_financial_step_approval_is_a_signature_that_needs_the_password() -> None:
    case = _invoice_case()
    hold = _gate(case, GateKind.STEP)
    officer = personas.officer()
    officer.first_name, officer.last_name = "Olivia", "Okafor"
    officer.save()
    with pytest.raises(gates.SignatureRefused, match="password"):
        gates.decide_gate(gate_id=hold.pk, user=officer, decision=APPROVE)
    with pytest.raises(gates.SignatureRefused, match="wrong password"):
        gates.decide_gate(
            gate_id=hold.pk, user=officer, decision=DecisionInput(decision="approve", password="x")
        )
    assert len(_events(case, "oversight.signature.failed")) == 1
    signed = gates.decide_gate(
        gate_id=hold.pk,
        user=officer,
        decision=DecisionInput(decision="approve", password=personas.PASSWORD),
    )
    assert signed.status == GateStatus.APPROVED
    decision = GateDecision.objects.get(gate=hold)
    assert decision.full_name == "Olivia Okafor"
    assert decision.signature_hash == hold.node.content_hash
    assert decision.signature_meaning.startswith("approval of step place-hold (place_payment_hold)")
    event = _events(case, "oversight.gate.decided")[-1]
    assert event.data["signature"] == {
        "meaning": decision.signature_meaning,
        "hash": decision.signature_hash,
    }


@pytest.mark.scenario("O8")
@pytest.mark.scenario("R7")
def test_five_wrong_signature_passwords_lock_signing_with_a_security_event() -> None:
    case = _invoice_case()
    hold = _gate(case, GateKind.STEP)
    officer = personas.officer()
    wrong = DecisionInput(decision="approve", password="wrong")
    for _ in range(5):
        with pytest.raises(gates.SignatureRefused):
            gates.decide_gate(gate_id=hold.pk, user=officer, decision=wrong)
    right = DecisionInput(decision="approve", password=personas.PASSWORD)
    with pytest.raises(gates.SignatureRefused, match="locked"):
        gates.decide_gate(gate_id=hold.pk, user=officer, decision=right)
    assert AuditEvent.objects.filter(action="security.signing.locked").count() == 1
    assert not GateDecision.objects.exists()
    response = _api(officer).post(
        f"/api/gates/{hold.pk}/decision",
        {"decision": "approve", "password": personas.PASSWORD},
        content_type="application/json",
    )
    assert response.status_code == 403


# Deadlines -----------------------------------------------------------------------------------


@pytest.mark.scenario("O6")
@pytest.mark.scenario("R5")
def test_an_unattended_gate_is_reminded_escalated_and_held_never_approved() -> None:
    case = _invoice_case()
    supervisor = personas.make_user("sue", roles.SUPERVISOR)
    gate = _gate(case)
    opened = gate.opened_at
    assert deadlines.sweep_gates(opened + timedelta(hours=1)) == {
        "reminded": 0,
        "escalated": 0,
        "held": 0,
    }
    assert deadlines.sweep_gates(opened + timedelta(hours=13))["reminded"] == 2
    assert deadlines.sweep_gates(opened + timedelta(hours=25))["escalated"] == 2
    assert Notification.objects.filter(user=supervisor, kind="gate.escalated").exists()
    assert deadlines.sweep_gates(opened + timedelta(hours=50))["held"] == 2
    # Two schedulers, or a repeated run: nothing happens twice.
    assert deadlines.sweep_gates(opened + timedelta(hours=80)) == {
        "reminded": 0,
        "escalated": 0,
        "held": 0,
    }
    gate.refresh_from_db()
    assert gate.status == GateStatus.EXPIRED
    assert gate.approvals == 0
    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL
    for action in ("reminded", "escalated", "held"):
        assert len(_events(case, f"oversight.gate.{action}")) == 2
    # Held, it still waits for a person: the supervisor may decide it now.
    decided = gates.decide_gate(gate_id=gate.pk, user=supervisor, decision=APPROVE)
    assert decided.status == GateStatus.APPROVED


def test_a_sweep_before_any_deadline_changes_nothing() -> None:
    case = _invoice_case()
    assert deadlines.sweep_gates(timezone.now()) == {"reminded": 0, "escalated": 0, "held": 0}
    assert not _events(case, "oversight.gate.reminded")


@pytest.mark.scenario("O1")
def test_a_refused_bulk_approval_is_recorded_and_decides_nothing() -> None:
    both = personas.analyst("bo")
    both.groups.add(Group.objects.get(name=roles.OFFICER))
    case = _invoice_case(both)
    step = _gate(case, GateKind.STEP)
    Gate.objects.filter(pk=step.pk).update(risk="low", needs_signature=False)
    with pytest.raises(gates.DecisionDenied, match="submitted"):
        gates.bulk_approve(gate_ids=[step.pk], user=both)
    assert not GateDecision.objects.exists()
    assert len(_events(case, "oversight.gate.decision_denied")) == 1


def test_bulk_approval_takes_only_low_risk_step_gates() -> None:
    case = _invoice_case()
    officer = personas.officer()
    with pytest.raises(gates.GateConflict, match="low-risk"):
        gates.bulk_approve(gate_ids=[_gate(case, GateKind.STEP).pk], user=officer)
    with pytest.raises(gates.GateConflict, match="low-risk"):
        gates.bulk_approve(gate_ids=[_gate(case).pk], user=officer)
    assert not GateDecision.objects.exists()


@pytest.mark.scenario("O6")
@pytest.mark.django_db(transaction=True)
def test_two_schedulers_sweeping_at_once_record_each_step_once() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (CI runs it)")
    case = _invoice_case()
    opened = _gate(case).opened_at
    barrier = threading.Barrier(2)
    results: list[dict[str, int]] = []

    def sweep(hours: int) -> None:
        try:
            barrier.wait()
            results.append(deadlines.sweep_gates(opened + timedelta(hours=hours)))
        finally:
            connection.close()

    for hours in (13, 25, 50):
        threads = [threading.Thread(target=sweep, args=(hours,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for action in ("reminded", "escalated", "held"):
        assert len(_events(case, f"oversight.gate.{action}")) == 2  # the plan and the step gate
        assert sum(r[action] for r in results) == 2
    assert not GateDecision.objects.exists()
    assert set(Gate.objects.filter(case=case).values_list("status", flat=True)) == {"expired"}


@pytest.mark.django_db(transaction=True)
def test_a_sweep_never_holds_a_gate_while_it_waits_for_the_cases_audit_chain() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (CI runs it)")
    from tests.lock_order import sweep_while_the_chain_head_is_held

    case = planned_invoice_case(personas.analyst())
    gate = Gate.objects.get(case=case, kind=GateKind.PLAN)
    # As a failing step or an edit does: the case's chain head first, then its gates.
    results = sweep_while_the_chain_head_is_held(
        case.pk,
        "planning.plan.edited",
        lambda: deadlines.sweep_gates(gate.remind_at + timedelta(seconds=1)),
        lambda: Gate.objects.filter(case=case).update(status=GateStatus.VOID),
    )
    assert results == [{"reminded": 0, "escalated": 0, "held": 0}]  # void by then
    assert not AuditEvent.objects.filter(action="oversight.gate.reminded").exists()
    assert verify_chain(case_chain(case.pk)) == []
