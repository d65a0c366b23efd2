"""Planning recovery: a lost message or a dead worker never leaves a case in `planning` forever."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from oversight.models import Notification
from planning import dispatch
from planning.actions import Outcome, materialise_plan, reconcile_planning, submit_case
from planning.models import Case, CaseStatus, PlanVersion
from tests import personas

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    messages: list[tuple[str, int]] = []
    monkeypatch.setattr(dispatch, "_send", lambda name, *args: messages.append((name, *args)))
    return messages


def _submit() -> Case:
    return submit_case(
        submitter=personas.analyst(),
        title="Verify INV-1042",
        goal="Verify invoice INV-1042",
        domain="invoice",
        strategy="static",
        inputs={"invoice_id": "INV-1042"},
    )


def _age(case: Case, seconds: int) -> None:
    Case.objects.filter(pk=case.pk).update(updated_at=timezone.now() - timedelta(seconds=seconds))


def _actions(case: Case) -> list[str]:
    return list(
        AuditEvent.objects.filter(chain=case_chain(case.pk))
        .order_by("seq")
        .values_list("action", flat=True)
    )


def test_a_case_whose_message_was_lost_is_sent_again_and_then_planned(
    sent: list[tuple[str, int]], django_capture_on_commit_callbacks: Any
) -> None:
    case = _submit()
    _age(case, 120)
    with django_capture_on_commit_callbacks(execute=True):
        assert reconcile_planning() == [case.pk]
    assert sent == [(dispatch.PLAN_CASE, case.pk)]
    assert _actions(case)[-1] == "planning.plan.requeued"
    assert materialise_plan(case.pk).outcome == Outcome.MATERIALISED
    assert verify_chain(case_chain(case.pk)) == []


def test_a_freshly_submitted_case_is_left_to_its_own_message(sent: list[tuple[str, int]]) -> None:
    _submit()
    assert reconcile_planning() == []


def test_a_case_held_by_a_live_planning_run_is_not_planned_twice() -> None:
    case = _submit()
    Case.objects.filter(pk=case.pk).update(
        planning_lease_until=timezone.now() + timedelta(minutes=5), planning_attempts=1
    )
    _age(case, 3600)
    assert reconcile_planning() == []
    result = materialise_plan(case.pk)
    assert result.outcome == Outcome.SKIPPED
    assert "another planning run" in result.reason
    assert not PlanVersion.objects.exists()


def test_a_case_whose_worker_died_is_planned_again_after_its_lease(
    sent: list[tuple[str, int]], django_capture_on_commit_callbacks: Any
) -> None:
    case = _submit()
    Case.objects.filter(pk=case.pk).update(
        planning_lease_until=timezone.now() - timedelta(seconds=1), planning_attempts=1
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert reconcile_planning() == [case.pk]
    assert sent == [(dispatch.PLAN_CASE, case.pk)]
    assert materialise_plan(case.pk).outcome == Outcome.MATERIALISED
    case.refresh_from_db()
    assert case.planning_attempts == 2
    assert case.planning_lease_until is None
    assert _actions(case).count("planning.plan.started") == 1


@override_settings(CASEHUB_PLANNING_MAX_ATTEMPTS=3)
def test_a_case_that_keeps_losing_its_worker_fails_with_a_clear_reason(
    sent: list[tuple[str, int]],
) -> None:
    case = _submit()
    Case.objects.filter(pk=case.pk).update(
        planning_lease_until=timezone.now() - timedelta(seconds=1), planning_attempts=3
    )
    assert reconcile_planning() == []
    case.refresh_from_db()
    assert case.status == CaseStatus.PLAN_FAILED
    assert "3 attempts" in case.error
    assert sent == []
    assert _actions(case)[-1] == "planning.plan.failed"
    assert Notification.objects.filter(case=case, kind="case.plan_failed").count() == 1


def test_a_planned_case_is_never_reconciled(sent: list[tuple[str, int]]) -> None:
    case = _submit()
    materialise_plan(case.pk)
    _age(case, 3600)
    assert reconcile_planning() == []
    assert materialise_plan(case.pk).outcome == Outcome.SKIPPED
    assert PlanVersion.objects.filter(case=case).count() == 1


class _StoreBroke(RuntimeError):
    pass


def _break_store(monkeypatch: pytest.MonkeyPatch) -> None:
    import planning.actions

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise _StoreBroke("the plan could not be stored")

    monkeypatch.setattr(planning.actions, "store_version", broken)


def test_a_run_that_fails_to_store_its_plan_gives_its_lease_back_for_the_next_reconcile(
    sent: list[tuple[str, int]],
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    case = _submit()
    with monkeypatch.context() as patch:
        _break_store(patch)
        with pytest.raises(_StoreBroke):
            materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.status == CaseStatus.PLANNING
    assert case.planning_lease_until is not None
    assert case.planning_lease_until <= timezone.now()
    assert not PlanVersion.objects.filter(case=case).exists()
    event = AuditEvent.objects.filter(chain=case_chain(case.pk)).order_by("-seq").first()
    assert event is not None and event.action == "planning.plan.interrupted"
    assert event.data == {"case": case.pk, "attempt": 1, "error": "_StoreBroke"}
    # The very next pass sends it again: nobody waits out CASEHUB_PLANNING_LEASE_S.
    with django_capture_on_commit_callbacks(execute=True):
        assert reconcile_planning() == [case.pk]
    assert sent == [(dispatch.PLAN_CASE, case.pk)]
    assert materialise_plan(case.pk).outcome == Outcome.MATERIALISED
    case.refresh_from_db()
    assert case.status == CaseStatus.AWAITING_APPROVAL
    assert case.planning_attempts == 2
    assert verify_chain(case_chain(case.pk)) == []


@override_settings(CASEHUB_PLANNING_MAX_ATTEMPTS=2)
def test_a_case_whose_plan_never_stores_fails_with_a_reason_after_its_attempts(
    sent: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    case = _submit()
    _break_store(monkeypatch)
    for _ in range(2):
        with pytest.raises(_StoreBroke):
            materialise_plan(case.pk)
        reconcile_planning()
    case.refresh_from_db()
    assert case.status == CaseStatus.PLAN_FAILED
    assert "2 attempts" in case.error and "failed" in case.error
    assert _actions(case).count("planning.plan.interrupted") == 2
    assert _actions(case)[-1] == "planning.plan.failed"
    assert verify_chain(case_chain(case.pk)) == []


def test_a_failed_run_never_releases_the_lease_a_later_run_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import planning.actions

    case = _submit()
    later = timezone.now() + timedelta(minutes=10)

    def taken_over_then_broken(*args: Any, **kwargs: Any) -> Any:
        # While this run stored its plan, its lease ran out and a second run took the case.
        Case.objects.filter(pk=case.pk).update(planning_attempts=2, planning_lease_until=later)
        raise _StoreBroke("the plan could not be stored")

    monkeypatch.setattr(planning.actions, "_store_plan", taken_over_then_broken)
    with pytest.raises(_StoreBroke):
        materialise_plan(case.pk)
    case.refresh_from_db()
    assert case.planning_lease_until == later
    assert "planning.plan.interrupted" not in _actions(case)
