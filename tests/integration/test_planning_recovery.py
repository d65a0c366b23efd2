"""A case whose planning message never reached the broker is planned by a real worker once the
reconciler sends it again."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from planning import dispatch
from planning.actions import reconcile_planning, submit_case
from planning.models import Case, CaseStatus
from tests import personas

pytestmark = pytest.mark.integration


@pytest.mark.scenario("E4")
def test_a_case_submitted_while_the_broker_was_unreachable_is_planned_later(
    worker_process: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broker_down(name: str, *args: object) -> None:
        raise ConnectionError("broker unreachable")

    with monkeypatch.context() as patch:
        patch.setattr(dispatch, "_send", broker_down)
        case = submit_case(
            submitter=personas.analyst(),
            title="Verify INV-1042",
            goal="Verify invoice INV-1042",
            domain="invoice",
            strategy="static",
            inputs={"invoice_id": "INV-1042"},
        )
    # The submission committed although the message was lost.
    assert Case.objects.get(pk=case.pk).status == CaseStatus.PLANNING
    time.sleep(1)
    assert Case.objects.get(pk=case.pk).status == CaseStatus.PLANNING
    Case.objects.filter(pk=case.pk).update(updated_at=timezone.now() - timedelta(minutes=5))
    assert reconcile_planning() == [case.pk]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        case.refresh_from_db()
        if case.status != CaseStatus.PLANNING:
            break
        time.sleep(0.2)
    assert case.status == CaseStatus.AWAITING_APPROVAL, case.error
    assert case.planning_attempts == 1
