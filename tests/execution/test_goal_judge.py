"""The LLM goal judge: asked, where configured, whether a case whose steps all ended reached its
goal; a verdict it cannot give fails the case with the reason; every call is in the trail (L9).

The judge is never asked in the transaction that ends the last step: the case is `verifying` and
the `oversight.judge_goal` task asks the model with no transaction open, then ends the case under
its row lock. The reconciler sends the task again for a case stuck `verifying`; two deliveries end
the case once; an answer that comes after a cancel is dropped, audited.

Cases of the scripted execution pack (tests/fakes/execution_pack.py, no goal rules of its own) run
in this process like a worker runs them, and the judge task's body runs here too; the fake OpenAI
server plays the judge.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.apps import apps
from django.db import connection, connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts.tokens import issue_api_token
from audit.models import AuditEvent
from execution import actions as execution
from execution import dispatch, judging, tasks
from execution.goal_judge import (
    OUTPUT_MIN_CHARS,
    PURPOSE,
    SCHEMA_NAME,
    ask_judge,
    bounded,
    judge_messages,
)
from oversight.models import Gate, GateKind, GateStatus, ReasonCode
from planning.actions import materialise_plan, submit_case
from planning.catalogue import sync_packs
from planning.models import Case, CaseStatus, LlmCall, PlanNode
from tests.execution.test_execution import approve, leaves, run_ready
from tests.fakes.execution_pack import SLUG
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply, RecordedRequest

pytestmark = pytest.mark.django_db

JUDGE = "judge-model"
REACHED = {"reached": True, "reasons": ["both steps acted once", "nothing is left open"]}


@pytest.fixture
def judged(
    settings: Any, fake_openai: FakeOpenAIServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> FakeOpenAIServer:
    """The scripted pack registered, the fake server as the provider, the judge switched on."""
    monkeypatch.setenv("CASEHUB_TEST_EFFECTS_DIR", str(tmp_path / "effects"))
    settings.CASEHUB_EXTRA_PACKS = ["tests.fakes.execution_pack.PACK"]
    for name, value in fake_openai.env().items():
        setattr(settings, name, value)
    settings.CASEHUB_LLM_MAX_RETRIES = 0
    settings.CASEHUB_GOAL_JUDGE_MODEL = JUDGE
    sync_packs()
    return fake_openai


def run_steps(analyst: Any, officer: Any, script: list[dict[str, Any]] | None = None) -> Case:
    """Submit, plan, approve and run a scripted case's steps to their end; return it refreshed."""
    script = script or [{"key": "pay"}, {"key": "note", "depends_on": ["pay"]}]
    case = submit_case(
        submitter=analyst,
        title="Scripted execution",
        goal="Settle the invoices <b>once</b>",
        domain=SLUG,
        strategy="static",
        inputs={"leaves": script},
    )
    materialise_plan(case.pk)
    case.refresh_from_db()
    approve(Gate.objects.get(case=case, kind=GateKind.PLAN, status=GateStatus.PENDING), officer)
    run_ready(case)
    case.refresh_from_db()
    return case


def run_case(analyst: Any, officer: Any, script: list[dict[str, Any]] | None = None) -> Case:
    """Run a scripted case's steps, then the judge task's body like a worker; return the case."""
    case = run_steps(analyst, officer, script)
    assert case.status == CaseStatus.VERIFYING, case.verification
    tasks.judge_goal(case.pk)
    case.refresh_from_db()
    return case


def judged_events(case: Case) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain=f"case:{case.pk}", action="execution.goal.judged"))


def test_without_a_judge_model_no_judge_is_asked_and_the_case_ends_with_its_last_step(
    judged: FakeOpenAIServer, settings: Any, analyst: Any, officer: Any
) -> None:
    settings.CASEHUB_GOAL_JUDGE_MODEL = ""
    case = run_steps(analyst, officer)
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert not AuditEvent.objects.filter(chain=f"case:{case.pk}", action__contains="verif").exists()
    assert judged.requests == []
    assert judged_events(case) == []


@pytest.mark.scenario("L9")
def test_a_reached_verdict_completes_the_case_with_the_judges_reasons_and_is_audited(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue(FakeReply(content=json.dumps(REACHED), prompt_tokens=321, completion_tokens=12))
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.COMPLETED, case.verification
    assert case.verification["reasons"] == []
    assert case.verification["checks"][-3:] == [
        f"the goal judge ({JUDGE}) says the goal is reached",
        f"the goal judge ({JUDGE}): both steps acted once",
        f"the goal judge ({JUDGE}): nothing is left open",
    ]
    (request,) = judged.requests
    assert request.body["model"] == JUDGE
    assert request.response_format["json_schema"]["name"] == SCHEMA_NAME
    assert set(request.json_schema["properties"]) == {"reached", "reasons"}
    prompt = request.user_prompt
    assert "Settle the invoices <b>once</b>" in prompt and "untrusted" in prompt
    data = json.loads(prompt[prompt.index("{") :])
    assert [step["key"] for step in data["steps"]] == ["note", "pay"]
    assert data["steps"][1]["output"] == {"label": "pay", "effects": 1, "invocations": 1}
    assert data["case"]["inputs"]["leaves"][0]["key"] == "pay"
    call = LlmCall.objects.get(case=case, purpose=PURPOSE)
    assert (call.model, call.prompt_tokens, call.completion_tokens) == (JUDGE, 321, 12)
    assert call.error == ""
    (event,) = judged_events(case)
    assert event.data["reached"] is True and event.data["reasons"] == REACHED["reasons"]
    assert event.data["parameters"]["model"] == JUDGE
    assert event.data["parameters"]["schema"] == SCHEMA_NAME
    (made,) = event.data["calls"]
    assert made["prompt_hash"] == call.prompt_hash
    assert made["response_hash"] == call.response_hash
    assert (made["prompt_tokens"], made["completion_tokens"]) == (321, 12)
    assert made["latency_ms"] == call.latency_ms
    recorded = AuditEvent.objects.get(action="planning.llm.called", data__llm_call=call.pk)
    assert recorded.data["purpose"] == PURPOSE
    ended = AuditEvent.objects.get(chain=f"case:{case.pk}", action="planning.case.completed")
    assert ended.seq > event.seq  # the verdict is in the trail before the case's end


def test_a_not_reached_verdict_fails_the_case_with_the_judges_reasons(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue({"reached": False, "reasons": ["the note does not say which invoice"]})
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.FAILED
    assert case.verification["passed"] is False
    assert case.verification["reasons"] == [
        f"the goal judge ({JUDGE}) says the goal is not reached",
        f"the goal judge ({JUDGE}): the note does not say which invoice",
    ]
    (event,) = judged_events(case)
    assert event.data["reached"] is False and event.data["error"] is None


def test_a_malformed_verdict_fails_the_case_instead_of_completing_it(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue('{"reached": "probably", "reasons": []}')
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.FAILED
    (reason,) = case.verification["reasons"]
    assert reason.startswith(f"the goal judge ({JUDGE}) could not decide: its answer does not fit")
    assert "reached" in reason
    call = LlmCall.objects.get(case=case, purpose=PURPOSE)
    assert call.response == '{"reached": "probably", "reasons": []}' and call.error
    (event,) = judged_events(case)
    assert event.data["reached"] is None and "does not fit" in event.data["error"]


def test_unparseable_text_fails_the_case(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue("The goal looks reached to me.")
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.FAILED
    assert "could not decide" in case.verification["reasons"][0]


def test_a_server_error_fails_the_case_and_the_failed_call_is_recorded(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue(FakeReply(status=500, error_message="the judge is down"))
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.FAILED
    (reason,) = case.verification["reasons"]
    assert reason.startswith(f"the goal judge ({JUDGE}) could not decide: LLM call to model")
    call = LlmCall.objects.get(case=case, purpose=PURPOSE)
    assert call.error and call.response == ""
    (event,) = judged_events(case)
    assert event.data["error"] and len(event.data["calls"]) == 1


def test_a_judge_without_a_provider_fails_the_case(
    judged: FakeOpenAIServer, settings: Any, analyst: Any, officer: Any
) -> None:
    settings.OPENAI_BASE_URL = ""
    settings.OPENAI_API_KEY = ""
    case = run_case(analyst, officer)
    assert case.status == CaseStatus.FAILED
    assert "could not decide" in case.verification["reasons"][0]
    assert "needs an LLM provider" in case.verification["reasons"][0]
    assert judged.requests == []
    (event,) = judged_events(case)
    assert event.data["calls"] == [] and event.data["error"]


def test_a_case_whose_steps_failed_is_not_judged(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    case = run_steps(analyst, officer, [{"key": "broken", "tool": "fail"}])
    assert case.status == CaseStatus.FAILED
    assert judged.requests == []
    assert not any("goal judge" in reason for reason in case.verification["reasons"])


def test_outputs_are_cut_to_a_bounded_size_and_marked(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue(REACHED)
    case = run_case(analyst, officer)
    nodes = list(leaves(case).values())
    huge = {"text": "x" * 100_000}
    nodes[0].output = huge
    case.description = "y" * 50_000
    (_, user) = judge_messages(case, nodes)
    assert len(user["content"]) < 40_000
    data = json.loads(user["content"][user["content"].index("{") :])
    cut = next(step["output"] for step in data["steps"] if step["key"] == nodes[0].key)
    assert cut["truncated"] is True and cut["chars"] > 100_000
    assert data["case"]["description"]["truncated"] is True
    assert bounded({"a": 1}, OUTPUT_MIN_CHARS) == {"a": 1}


def test_the_case_page_shows_the_judges_reasons_escaped(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    judged.enqueue({"reached": False, "reasons": ['<img src=x onerror="alert(1)"> is no report']})
    case = run_case(analyst, officer)
    client = Client()
    client.force_login(analyst)
    page = client.get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    result = page[page.index('id="case-result"') :]
    assert f"the goal judge ({JUDGE}) says the goal is not reached" in result
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt; is no report" in result
    assert '<img src=x onerror="alert(1)">' not in page


# Verifying: the judge outside the ending transaction ------------------------------------------


def _sent_judges(callbacks: list[Callable[[], Any]]) -> list[int]:
    """The case ids whose judge task the captured on-commit callbacks send."""
    return [
        cb.args[0]
        for cb in callbacks
        if isinstance(cb, partial) and cb.func is dispatch.send_goal_judge
    ]


def _actions(case: Case) -> list[str]:
    return list(
        AuditEvent.objects.filter(chain=f"case:{case.pk}")
        .order_by("seq")
        .values_list("action", flat=True)
    )


def test_the_last_step_leaves_the_case_verifying_and_sends_the_judge_on_commit(
    judged: FakeOpenAIServer, analyst: Any, officer: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        case = run_steps(analyst, officer)
    assert case.status == CaseStatus.VERIFYING
    assert case.finished_at is None and case.is_live
    assert "passed" not in case.verification  # nothing decided yet
    assert case.verification["judge"] == JUDGE
    assert case.verification["checks"] == ["all 2 steps ended as planned"]
    assert judged.requests == []  # the model was not asked in the ending transaction
    assert judged_events(case) == []
    assert _sent_judges(callbacks) == [case.pk]
    event = AuditEvent.objects.get(chain=f"case:{case.pk}", action="planning.case.verifying")
    assert event.data["before"] == {"status": "executing"}
    assert event.data["after"] == {"status": "verifying"} and event.data["judge"] == JUDGE


def test_the_case_page_shows_a_verifying_case_as_waiting_for_the_judge(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    case = run_steps(analyst, officer)
    client = Client()
    client.force_login(analyst)
    page = client.get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    live = page[page.index('id="case-live"') :]
    assert 'data-status="verifying"' in live
    assert '<span class="status-badge" data-status="verifying">Verifying</span>' in live
    assert "hx-trigger=" in page[page.index('<div id="case-live"') :][:400]  # it keeps polling
    note = live[live.index('data-note="verifying"') :]
    assert f"The goal judge ({JUDGE}) is deciding whether the goal is reached" in note
    assert 'id="case-result"' not in page  # no verdict yet
    listed = client.get(reverse("planning:case-list"), {"status": "verifying"}).content.decode()
    assert f'href="{reverse("planning:case-detail", args=[case.pk])}"' in listed
    assert '<option value="verifying" selected' in listed
    api = Client(headers={"Authorization": f"Bearer {issue_api_token(analyst)}"})
    body = api.get("/api/cases", {"status": "verifying"}).json()
    (item,) = body["items"] if isinstance(body, dict) else body
    assert (item["id"], item["status"]) == (case.pk, "verifying")
    schema = api.get("/api/openapi.json").json()["components"]["schemas"]
    assert "verifying" in schema["CaseStatus"]["enum"]


def test_the_reconciler_sends_the_judge_again_for_a_case_stuck_verifying(
    judged: FakeOpenAIServer,
    settings: Any,
    analyst: Any,
    officer: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.CASEHUB_LEAF_REDISPATCH_AFTER_S = 30
    case = run_steps(analyst, officer)  # its message is lost: nothing runs the task
    now = timezone.now()
    with django_capture_on_commit_callbacks() as callbacks:
        assert execution.reconcile_execution(now=now).judges_resent == ()
    assert _sent_judges(callbacks) == []
    later = now + timedelta(seconds=31)
    with django_capture_on_commit_callbacks() as callbacks:
        assert execution.reconcile_execution(now=later).judges_resent == (case.pk,)
    assert _sent_judges(callbacks) == [case.pk]
    resent = AuditEvent.objects.get(chain=f"case:{case.pk}", action="execution.goal.judge_resent")
    assert resent.data["why"] == "no delivery took it" and resent.data["deliveries"] == 0
    # A delivery takes the case and its worker dies before the answer: its lease holds it...
    taken = judging.take_goal_judge(case.pk, now=later)
    assert taken is not None and taken.judge_lease_until is not None
    lease_until = taken.judge_lease_until
    with django_capture_on_commit_callbacks() as callbacks:
        assert (
            execution.reconcile_execution(now=lease_until - timedelta(seconds=1)).judges_resent
            == ()
        )
    # ...until it expires; then the judge is sent again and the next delivery ends the case.
    with django_capture_on_commit_callbacks() as callbacks:
        reconciled = execution.reconcile_execution(now=lease_until + timedelta(seconds=1))
    assert reconciled.judges_resent == (case.pk,) and _sent_judges(callbacks) == [case.pk]
    judged.enqueue(REACHED)
    assert tasks.judge_goal(case.pk) == CaseStatus.COMPLETED
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED and len(judged.requests) == 1
    assert _actions(case).count("execution.goal.judge_resent") == 2
    assert _actions(case).count("execution.goal.judge_started") == 2
    assert _actions(case).count("planning.case.completed") == 1
    assert execution.reconcile_execution(now=lease_until + timedelta(hours=1)).judges_resent == ()


def test_a_judge_whose_deliveries_keep_dying_fails_the_case(
    judged: FakeOpenAIServer, settings: Any, analyst: Any, officer: Any
) -> None:
    settings.CASEHUB_LEAF_MAX_DELIVERIES = 2
    case = run_steps(analyst, officer)
    now = timezone.now()
    for _ in range(2):
        taken = judging.take_goal_judge(case.pk, now=now)
        assert taken is not None and taken.judge_lease_until is not None
        now = taken.judge_lease_until + timedelta(seconds=1)
        reconciled = execution.reconcile_execution(now=now)
    assert reconciled.finished == (case.pk,) and reconciled.judges_resent == ()
    case.refresh_from_db()
    assert case.status == CaseStatus.FAILED
    (reason,) = case.verification["reasons"]
    assert reason == (
        f"the goal judge ({JUDGE}) could not decide: no answer after 2 deliveries (their "
        "workers were lost or ran out of time)"
    )
    assert case.verification["checks"] == ["all 2 steps ended as planned"]
    assert judged.requests == []


def test_two_deliveries_of_the_judge_end_the_case_once(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    case = run_steps(analyst, officer)
    # The second delivery arrives while the first holds the lease: it does nothing.
    first = judging.take_goal_judge(case.pk)
    assert first is not None
    assert tasks.judge_goal(case.pk) == "nothing to judge"
    assert judged.requests == []
    judged.enqueue(REACHED)
    nodes = list(PlanNode.objects.filter(version_id=case.current_version_id, kind="leaf"))
    assert judging.end_judged_case(case.pk, ask_judge(first, nodes)) == CaseStatus.COMPLETED
    # A delivery after the end (the message delivered twice) does nothing either.
    assert tasks.judge_goal(case.pk) == "nothing to judge"
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED and len(judged.requests) == 1
    assert _actions(case).count("planning.case.completed") == 1
    assert len(judged_events(case)) == 1


def test_a_delivery_past_a_lost_lease_that_answers_second_is_dropped_audited(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    case = run_steps(analyst, officer)
    slow = judging.take_goal_judge(case.pk)
    assert slow is not None and slow.judge_lease_until is not None
    # The first delivery outlived its lease: a second one takes the case and answers first.
    fast = judging.take_goal_judge(case.pk, now=slow.judge_lease_until + timedelta(seconds=1))
    assert fast is not None
    nodes = list(PlanNode.objects.filter(version_id=case.current_version_id, kind="leaf"))
    judged.enqueue(REACHED, {"reached": False, "reasons": ["too late to matter"]})
    assert judging.end_judged_case(case.pk, ask_judge(fast, nodes)) == CaseStatus.COMPLETED
    assert judging.end_judged_case(case.pk, ask_judge(slow, nodes)) == CaseStatus.COMPLETED
    case.refresh_from_db()
    assert case.status == CaseStatus.COMPLETED and case.verification["passed"] is True
    assert _actions(case).count("planning.case.completed") == 1
    assert len(judged_events(case)) == 2  # both calls are in the trail (L9)
    assert LlmCall.objects.filter(case=case, purpose=PURPOSE).count() == 2
    dropped = AuditEvent.objects.get(
        chain=f"case:{case.pk}", action="execution.goal.verdict_dropped"
    )
    assert dropped.data["why"] == "the case is completed" and dropped.data["reached"] is False


def test_a_case_cancelled_while_verifying_stays_cancelled_and_is_never_judged(
    judged: FakeOpenAIServer, analyst: Any, officer: Any
) -> None:
    case = run_steps(analyst, officer)
    execution.cancel_case(case_id=case.pk, user=analyst, reason_code="other", reason="enough")
    assert tasks.judge_goal(case.pk) == "nothing to judge"
    case.refresh_from_db()
    assert case.status == CaseStatus.CANCELLED and judged.requests == []
    assert "passed" not in case.verification
    cancelled = AuditEvent.objects.get(chain=f"case:{case.pk}", action="planning.case.cancelled")
    assert cancelled.data["before"] == {"status": "verifying"}
    client = Client()
    client.force_login(analyst)
    page = client.get(reverse("planning:case-detail", args=[case.pk])).content.decode()
    result = page[page.index('id="case-result"') :]
    assert (
        f"The case was cancelled by {cancelled.actor_label}</strong> before goal-level "
        "verification ran" in result
    )


@pytest.fixture
def seeded(transactional_db: None) -> None:
    """The reason codes and policy a migration seeds (an earlier transactional test's flush
    removed them)."""
    if not ReasonCode.objects.exists():
        module = importlib.import_module("oversight.migrations.0003_gates_policy_notifications")
        module.seed(apps, None)


@pytest.mark.django_db(transaction=True)
def test_the_judge_is_asked_with_no_transaction_open_and_a_cancel_meanwhile_drops_its_answer(
    seeded: None, judged: FakeOpenAIServer, settings: Any, analyst: Any, officer: Any
) -> None:
    # Each step commits: the database is what other connections (and the fake server) see.
    settings.CASEHUB_LLM_TIMEOUT_S = 10  # a judge run under the case's lock would time out here
    case = run_steps(analyst, officer)
    assert case.status == CaseStatus.VERIFYING
    worker = connection  # this thread's connection: the one the task body uses
    seen: dict[str, Any] = {}

    def cancel_while_asked(request: RecordedRequest) -> Any:
        # The fake server's thread, with its own database connection: a person cancels the case
        # while the judge thinks. Under the case's row lock this would wait for the answer.
        try:
            seen["in_atomic_block"] = worker.in_atomic_block
            execution.cancel_case(
                case_id=case.pk, user=analyst, reason_code="other", reason="not needed"
            )
            seen["cancelled"] = Case.objects.get(pk=case.pk).status
        finally:
            connections.close_all()
        return REACHED

    judged.responder = cancel_while_asked
    assert threading.current_thread() is threading.main_thread()
    assert tasks.judge_goal(case.pk) == CaseStatus.CANCELLED
    assert seen == {"in_atomic_block": False, "cancelled": CaseStatus.CANCELLED}
    case.refresh_from_db()
    assert case.status == CaseStatus.CANCELLED and "passed" not in case.verification
    actions = _actions(case)
    assert actions.index("execution.goal.judge_started") < actions.index("planning.case.cancelled")
    assert actions.index("planning.case.cancelled") < actions.index("execution.goal.judged")
    assert actions[-1] == "execution.goal.verdict_dropped"
    assert "planning.case.completed" not in actions
    dropped = AuditEvent.objects.get(
        chain=f"case:{case.pk}", action="execution.goal.verdict_dropped"
    )
    assert dropped.data == {
        "case": case.pk,
        "model": JUDGE,
        "reached": True,
        "why": "the case is cancelled",
    }
    assert LlmCall.objects.filter(case=case, purpose=PURPOSE).count() == 1  # still recorded (L9)


def test_the_stop_switch_holds_the_judge_back_and_resume_lets_it_decide(
    judged: FakeOpenAIServer,
    settings: Any,
    analyst: Any,
    officer: Any,
    admin_user: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.CASEHUB_LEAF_REDISPATCH_AFTER_S = 30
    case = run_steps(analyst, officer)
    execution.set_stopped(stopped=True, user=admin_user, reason="incident")
    assert tasks.judge_goal(case.pk) == "nothing to judge"
    later = timezone.now() + timedelta(seconds=31)
    with django_capture_on_commit_callbacks() as callbacks:
        assert execution.reconcile_execution(now=later).judges_resent == ()
    assert _sent_judges(callbacks) == []
    case.refresh_from_db()
    assert case.status == CaseStatus.VERIFYING and judged.requests == []
    assert "execution.goal.judge_started" not in _actions(case)
    execution.set_stopped(stopped=False, user=admin_user)
    with django_capture_on_commit_callbacks() as callbacks:
        assert execution.reconcile_execution(now=later).judges_resent == (case.pk,)
    assert _sent_judges(callbacks) == [case.pk]
    judged.enqueue(REACHED)
    assert tasks.judge_goal(case.pk) == CaseStatus.COMPLETED
    assert len(judged.requests) == 1
