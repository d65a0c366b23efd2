"""The LLM goal judge on a real Celery worker: the last step leaves the case `verifying`, the
`oversight.judge_goal` task asks the fake OpenAI server with the case row unlocked, and the case
ends once, however often the reconciler (run here like beat) sends the task again."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction

from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from planning.models import Case, CaseStatus, LlmCall
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply, RecordedRequest
from tests.integration.execution import Harness, approve_plan, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JUDGE = "judge-model"
REACHED = {"reached": True, "reasons": ["both steps acted once"]}


def test_the_goal_judge_runs_on_a_worker_with_the_case_unlocked_and_ends_the_case_once(
    transactional_db: None,
    settings: Any,
    tmp_path: Any,
    fake_openai: FakeOpenAIServer,
    analyst: Any,
    officer: Any,
) -> None:
    harness = Harness(settings, tmp_path / "effects")
    for name, value in fake_openai.env().items():
        setattr(settings, name, value)
    settings.CASEHUB_GOAL_JUDGE_MODEL = JUDGE
    case = harness.case(analyst, [{"key": "pay"}, {"key": "note", "depends_on": ["pay"]}])
    seen: dict[str, Any] = {}

    def answer(request: RecordedRequest) -> Any:
        # The fake server's thread, on its own connection, while the worker waits for the answer.
        try:
            seen["status"] = Case.objects.get(pk=case.pk).status
            if connection.vendor == "postgresql":
                try:
                    with transaction.atomic():
                        Case.objects.select_for_update(nowait=True).get(pk=case.pk)
                    seen["row"] = "unlocked"
                except DatabaseError:
                    seen["row"] = "locked"
        finally:
            connections.close_all()
        # Slow enough that the reconciler (every second) may send the task again meanwhile.
        return FakeReply(content=json.dumps(REACHED), extra_latency_s=4.0)

    fake_openai.responder = answer
    worker = harness.worker(
        CASEHUB_GOAL_JUDGE_MODEL=JUDGE, CASEHUB_LLM_MAX_RETRIES=0, **fake_openai.env()
    )
    try:
        approve_plan(case, officer)
        wait_until(
            "the judged case to end",
            lambda: Case.objects.get(pk=case.pk).status in {"completed", "failed"},
            timeout=90,
            workers=(worker,),
        )
    finally:
        worker.stop()
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert case.verification["checks"][-1] == f"the goal judge ({JUDGE}): both steps acted once"
    assert len(fake_openai.requests) == 1
    assert seen["status"] == CaseStatus.VERIFYING
    if connection.vendor == "postgresql":
        assert seen["row"] == "unlocked"
    actions = list(
        AuditEvent.objects.filter(chain=case_chain(case.pk))
        .order_by("seq")
        .values_list("action", flat=True)
    )
    assert actions.count("planning.case.verifying") == 1
    assert actions.count("execution.goal.judge_started") == 1
    assert actions.count("execution.goal.judged") == 1
    assert actions.count("planning.case.completed") == 1
    assert actions.index("planning.case.verifying") < actions.index("execution.goal.judged")
    assert LlmCall.objects.filter(case=case, purpose="goal_judge").count() == 1
    assert verify_chain(case_chain(case.pk)) == []
