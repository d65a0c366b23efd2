"""Work items by their deadlines: a reminder half-way, escalation to the supervisors at the
deadline (who may do the step from then on), each step once even with two schedulers, every step
audited; and a person's result for an attempt that no longer holds its step is refused with the
refusal kept in the trail."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts import roles
from accounts import tokens as api_tokens
from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from execution import actions as execution
from execution.models import LeafAttempt, WorkItem
from execution.work_items import sweep_work_items
from oversight.models import Notification
from planning.models import Case, CaseStatus, NodeStatus, PlanNode
from tests import personas
from tests.execution.work_items import INVOICE_FIELDS, waiting_work_item
from tests.lock_order import race_behind_the_case_row, sweep_while_the_chain_head_is_held

pytestmark = pytest.mark.django_db

NOTHING = {"reminded": 0, "escalated": 0}


def _events(item: WorkItem, action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain=case_chain(item.case_id), action=action))


def _api(user: Any) -> Client:
    return Client(headers={"Authorization": f"Bearer {api_tokens.issue_api_token(user)}"})


def _complete(user: Any, item: WorkItem) -> Any:
    return _api(user).post(
        f"/api/work-items/{item.pk}/complete",
        {"output": INVOICE_FIELDS},
        content_type="application/json",
    )


def _page(user: Any, url: str) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(url)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


# Deadlines -----------------------------------------------------------------------------------


def test_a_new_work_item_is_due_in_the_policys_gate_hours_and_reminded_half_way(
    analyst: Any, officer: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    assert item.deadline - item.created_at == timedelta(hours=24)
    assert item.remind_at == item.created_at + timedelta(hours=12)
    assert item.escalation_group is not None
    assert item.escalation_group.name == roles.SUPERVISOR
    assert not item.is_overdue


def test_an_untouched_work_item_is_reminded_then_escalated_to_the_supervisors_once(
    analyst: Any, officer: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    ben = personas.analyst("ben")
    sue = personas.make_user("sue", roles.SUPERVISOR)
    opened = item.created_at
    assert sweep_work_items(opened + timedelta(hours=11)) == NOTHING
    assert sweep_work_items(opened + timedelta(hours=12)) == {"reminded": 1, "escalated": 0}
    assert Notification.objects.filter(user=ben, kind="work_item.reminder").count() == 1
    # Never the submitter, and not the supervisors yet.
    assert not Notification.objects.filter(user=analyst, kind="work_item.reminder").exists()
    assert not Notification.objects.filter(user=sue).exists()
    assert sweep_work_items(opened + timedelta(hours=20)) == NOTHING
    # Before escalation the supervisor neither sees nor may do the step.
    assert _api(sue).get(f"/api/work-items/{item.pk}").status_code == 404
    assert _complete(sue, item).status_code == 404

    assert sweep_work_items(opened + timedelta(hours=24)) == {"reminded": 0, "escalated": 1}
    escalated = Notification.objects.get(user=sue, kind="work_item.escalated")
    assert escalated.url == reverse("execution:work-item", args=[item.pk])
    assert "extract-fields" in escalated.message
    assert not Notification.objects.filter(user=ben, kind="work_item.escalated").exists()
    # Later sweeps, or a second scheduler, do nothing again.
    assert sweep_work_items(opened + timedelta(hours=80)) == NOTHING

    item.refresh_from_db()
    assert item.status == WorkItem.Status.OPEN  # never completed by time
    assert item.reminded_at == opened + timedelta(hours=12)
    assert item.escalated_at == opened + timedelta(hours=24)
    assert item.deadline == opened + timedelta(hours=24)  # the promise is kept on record
    (reminded,) = _events(item, "execution.work_item.reminded")
    (escalation,) = _events(item, "execution.work_item.escalated")
    assert reminded.data["work_item"] == item.pk and reminded.data["group"] == roles.ANALYST
    assert escalation.data["escalation_group"] == roles.SUPERVISOR
    assert escalation.data["deadline"] == item.deadline.isoformat()
    assert verify_chain(case_chain(item.case_id)) == []

    # Escalated, the supervisor may do it (the analysts still may too).
    done = _complete(sue, item)
    assert done.status_code == 200, done.content
    assert done.json()["completed_by"] == "sue"
    assert PlanNode.objects.get(pk=item.node_id).status == NodeStatus.SUCCEEDED


def test_a_reminder_and_an_escalation_both_due_happen_in_one_late_sweep(
    analyst: Any, officer: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    assert sweep_work_items(item.created_at + timedelta(days=3)) == {
        "reminded": 1,
        "escalated": 1,
    }
    assert len(_events(item, "execution.work_item.reminded")) == 1
    assert len(_events(item, "execution.work_item.escalated")) == 1


def test_a_completed_or_cancelled_work_item_is_never_reminded_or_escalated(
    analyst: Any, officer: Any
) -> None:
    done = waiting_work_item(analyst, officer)
    execution.complete_work_item(
        item_id=done.pk, user=personas.analyst("ben"), output=INVOICE_FIELDS
    )
    cancelled = waiting_work_item(analyst, officer)
    execution.cancel_case(
        case_id=cancelled.case_id, user=analyst, reason_code="other", reason="not needed"
    )
    assert sweep_work_items(timezone.now() + timedelta(days=3)) == NOTHING
    assert not AuditEvent.objects.filter(action__startswith="execution.work_item.rem").exists()
    assert not AuditEvent.objects.filter(action="execution.work_item.escalated").exists()


def test_an_item_whose_attempt_lost_its_step_is_not_swept(analyst: Any, officer: Any) -> None:
    item = waiting_work_item(analyst, officer)
    PlanNode.objects.filter(pk=item.node_id).update(attempts=item.attempt + 1)
    assert sweep_work_items(item.created_at + timedelta(days=3)) == NOTHING


@pytest.mark.scenario("S7")
@pytest.mark.parametrize("status", [CaseStatus.CANCELLED, CaseStatus.FAILED])
def test_an_item_left_open_on_a_case_that_no_longer_runs_is_not_swept(
    analyst: Any, officer: Any, status: str
) -> None:
    # What a cancel between a human step's claim and its work item used to leave behind.
    item = waiting_work_item(analyst, officer)
    Case.objects.filter(pk=item.case_id).update(status=status)
    assert sweep_work_items(item.created_at + timedelta(days=3)) == NOTHING
    assert (
        not Notification.objects.filter(kind__startswith="work_item.")
        .exclude(kind="work_item.opened")
        .exists()
    )


def test_the_supervisor_is_not_told_of_or_given_a_case_they_submitted(officer: Any) -> None:
    boss = personas.make_user("boss", roles.SUPERVISOR)
    boss.groups.add(*personas.analyst("amy").groups.all())
    item = waiting_work_item(boss, officer)
    sweep_work_items(item.created_at + timedelta(hours=24))
    assert not Notification.objects.filter(user=boss, kind__startswith="work_item.").exists()
    assert _complete(boss, item).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_two_schedulers_sweeping_at_once_remind_and_escalate_each_item_once() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (CI runs it)")
    analyst, officer = personas.analyst(), personas.officer()
    personas.make_user("sue", roles.SUPERVISOR)
    items = [waiting_work_item(analyst, officer) for _ in range(3)]
    opened = max(item.created_at for item in items)
    barrier = threading.Barrier(2)
    results: list[dict[str, int]] = []

    def sweep(hours: int) -> None:
        try:
            barrier.wait()
            results.append(sweep_work_items(opened + timedelta(hours=hours)))
        finally:
            connection.close()

    for hours in (12, 24):
        threads = [threading.Thread(target=sweep, args=(hours,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(results) == 4
    for action in ("reminded", "escalated"):
        assert sum(r[action] for r in results) == 3
        for item in items:
            assert len(_events(item, f"execution.work_item.{action}")) == 1
    assert Notification.objects.filter(kind="work_item.escalated").count() == 3  # sue, once each
    assert set(WorkItem.objects.values_list("status", flat=True)) == {"open"}


@pytest.mark.django_db(transaction=True)
def test_a_sweep_never_holds_an_item_while_it_waits_for_the_cases_audit_chain() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (CI runs it)")
    item = waiting_work_item(personas.analyst(), personas.officer())
    # As a failing step that ends its case does: the case's chain head first, then its items.
    results = sweep_while_the_chain_head_is_held(
        item.case_id,
        "execution.leaf.attempt_failed",
        lambda: sweep_work_items(item.created_at + timedelta(hours=12)),
        lambda: WorkItem.objects.filter(pk=item.pk).update(status=WorkItem.Status.CANCELLED),
    )
    assert results == [NOTHING]  # the item was cancelled by the time the sweep got to it
    assert not _events(item, "execution.work_item.reminded")
    assert verify_chain(case_chain(item.case_id)) == []


@pytest.mark.scenario("S9")
@pytest.mark.django_db(transaction=True)
def test_a_person_completing_a_work_item_while_the_case_is_cancelled_never_deadlocks() -> None:
    """The completion takes its item and its step while the cancel holds the case and then asks
    for the step: on the old order (item, step, then the case) PostgreSQL broke the deadlock.
    Now the completion waits for the case first, holding nothing, and is refused cleanly."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL (CI runs it)")
    analyst, officer = personas.analyst(), personas.officer()
    item = waiting_work_item(analyst, officer)
    ben = personas.analyst("ben")
    completed, cancelled = race_behind_the_case_row(
        item.case_id,
        lambda: execution.complete_work_item(item_id=item.pk, user=ben, output=INVOICE_FIELDS),
        lambda: execution.cancel_case(
            case_id=item.case_id, user=officer, reason_code="duplicate", reason="twice"
        ),
    )
    assert not isinstance(cancelled, BaseException), cancelled
    assert isinstance(completed, execution.WorkItemConflict), completed
    item.refresh_from_db()
    assert item.status == WorkItem.Status.CANCELLED
    assert PlanNode.objects.get(pk=item.node_id).status == NodeStatus.CANCELLED
    assert verify_chain(case_chain(item.case_id)) == []


def test_the_beat_sweeps_work_items_with_the_gates() -> None:
    from django.conf import settings

    from execution import tasks

    entry = settings.CELERY_BEAT_SCHEDULE["work-item-sweep"]
    assert entry["task"] == tasks.sweep_work_items.name == "oversight.sweep_work_items"
    assert entry["schedule"] == float(settings.CASEHUB_GATE_SWEEP_INTERVAL_S)


def test_the_beat_task_body_sweeps(analyst: Any, officer: Any) -> None:
    from execution import tasks

    item = waiting_work_item(analyst, officer)
    WorkItem.objects.filter(pk=item.pk).update(
        remind_at=timezone.now() - timedelta(minutes=1),
        deadline=timezone.now() - timedelta(seconds=1),
    )
    assert tasks.sweep_work_items() == {"reminded": 1, "escalated": 1}


# Pages and the API ---------------------------------------------------------------------------


def test_the_list_and_form_show_the_deadline_and_an_overdue_escalated_item(
    analyst: Any, officer: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    ben = personas.analyst("ben")
    sue = personas.make_user("sue", roles.SUPERVISOR)
    listing = _page(ben, reverse("execution:work-item-list"))
    assert 'data-deadline="due"' in listing and f'data-escalated="{item.pk}"' not in listing
    assert item.deadline.strftime("%Y-%m-%d %H:%M") in listing
    assert 'data-empty="work-items"' in _page(sue, reverse("execution:work-item-list"))

    execution_url = reverse("execution:case-execution", args=[item.case_id])
    assert f'data-overdue="{item.pk}"' not in _page(officer, execution_url)
    WorkItem.objects.filter(pk=item.pk).update(deadline=timezone.now() - timedelta(minutes=1))
    sweep_work_items()
    # The case's own execution panel says so too.
    panel = _page(officer, execution_url)
    assert f'<span class="error" data-overdue="{item.pk}">overdue, escalated</span>' in panel
    for user in (ben, sue):
        listing = _page(user, reverse("execution:work-item-list"))
        assert f'<tr data-work-item="{item.pk}">' in listing
        assert 'data-deadline="overdue"' in listing
        assert f"escalated to {roles.SUPERVISOR}" in listing
        form = _page(user, reverse("execution:work-item", args=[item.pk]))
        assert 'data-deadline="overdue"' in form and f'data-escalated="{item.pk}"' in form
        assert 'data-form="complete"' in form
    client = Client()
    client.force_login(sue)
    response = client.post(
        reverse("execution:work-item-complete", args=[item.pk]),
        {"output": json.dumps(INVOICE_FIELDS)},
    )
    assert response.status_code == 302
    assert WorkItem.objects.get(pk=item.pk).completed_by == sue


def test_the_api_carries_the_deadline_reminder_and_escalation(analyst: Any, officer: Any) -> None:
    item = waiting_work_item(analyst, officer)
    ben = _api(personas.analyst("ben"))
    before = ben.get(f"/api/work-items/{item.pk}").json()
    assert before["overdue"] is False
    assert before["reminded_at"] is None and before["escalated_at"] is None
    assert before["escalation_group"] is None
    sweep_work_items(item.created_at + timedelta(hours=25))
    (listed,) = ben.get("/api/work-items", {"status": "open"}).json()["items"]
    assert listed["overdue"] is True
    assert listed["reminded_at"] is not None and listed["escalated_at"] is not None
    assert listed["escalation_group"] == roles.SUPERVISOR
    supervised = _api(personas.make_user("sue", roles.SUPERVISOR)).get("/api/work-items")
    assert [i["id"] for i in supervised.json()["items"]] == [item.pk]


# A stale result -------------------------------------------------------------------------------


def test_a_stale_work_item_result_is_refused_and_the_refusal_stays_in_the_trail(
    analyst: Any, officer: Any
) -> None:
    item = waiting_work_item(analyst, officer)
    # The step moved on to a later attempt (recovered and claimed again) while the item was open.
    PlanNode.objects.filter(pk=item.node_id).update(attempts=item.attempt + 1)
    response = _complete(personas.analyst("ben"), item)
    assert response.status_code == 409, response.content
    (refused,) = _events(item, "execution.leaf.result_refused")
    assert refused.data["attempt"] == item.attempt and refused.data["holder"] == item.attempt + 1
    (closed,) = _events(item, "execution.work_item.refused")
    assert closed.actor_label == "ben" and closed.data["work_item"] == item.pk
    attempt = LeafAttempt.objects.get(node_id=item.node_id, number=item.attempt)
    assert attempt.outcome == LeafAttempt.Outcome.STALE
    assert not _events(item, "execution.work_item.completed")
    # Not completed; closed, as no attempt waits for it any more.
    item.refresh_from_db()
    assert item.status == WorkItem.Status.CANCELLED and item.completed_by is None
    assert item.output is None
    node = PlanNode.objects.get(pk=item.node_id)
    assert node.status == NodeStatus.RUNNING and node.output is None
    assert verify_chain(case_chain(item.case_id)) == []
    # Tried again, it is simply not open any more.
    assert _complete(personas.analyst("cy"), item).status_code == 409
    assert len(_events(item, "execution.leaf.result_refused")) == 1


@pytest.mark.scenario("S7")
def test_a_lease_renewal_after_the_work_item_opened_gives_the_waiting_step_no_lease(
    analyst: Any, officer: Any
) -> None:
    """The worker's lease renewer may tick once more after the step was handed to a person: the
    step must stay without a lease, or the reconciler would take it back and open a second item."""
    item = waiting_work_item(analyst, officer)
    node = PlanNode.objects.get(pk=item.node_id)
    assert node.status == NodeStatus.RUNNING and node.lease_until is None

    assert execution.renew_lease(node.pk, node.attempts) is False

    node.refresh_from_db()
    assert node.lease_until is None
    assert WorkItem.objects.filter(node=node).count() == 1
