"""LLM budgets per case and per day, reserved before each call (L5).

Planning runs through the real actions and the real `openai` client against the fake server;
planning's helper threads reach the ledger on connections of their own, so those tests commit
(`transaction=True`). The llm agent and the goal judge call from the test's own thread.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from audit.chain import case_chain, verify_chain
from audit.models import AuditEvent
from execution.goal_judge import ask_judge
from planning.actions import Outcome, materialise_plan, submit_case
from planning.budgets import LedgerBudgets, LedgerGuard, guard_for
from planning.core.llm.budget import (
    BudgetLimits,
    BudgetUsage,
    CallEstimate,
    LlmBudgetExhausted,
    check_call,
    format_usd,
    prompt_bound,
)
from planning.core.llm.pricing import PriceTable
from planning.models import (
    Case,
    CaseStatus,
    DecompositionCacheEntry,
    LlmCall,
    LlmReservation,
    LlmUsage,
    NodeStatus,
    PlanVersion,
)
from tests import personas
from tests.cases import planned_invoice_case
from tests.execution.test_execution import run_ready
from tests.execution.test_llm_runner import FINDINGS, approved_case, calls, notes_pack, review
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply
from tests.planning.llm_scripts import fraud_plan_responder
from web.env import ConfigError, env_decimal

__all__ = ["notes_pack"]  # the llm agent's fixture, used below

PRICES = PriceTable.parse("gpt-4o-mini=1000/1000")  # $0.001 a token: costs are easy to read


def _estimate(**overrides: Any) -> CallEstimate:
    fields: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "purpose": "nested_plan",
        "prompt_tokens": 1000,
        "completion_tokens": 500,
        "expires_in_s": 60,
    }
    fields.update(overrides)
    return CallEstimate(**fields)


# The check itself (no database) -----------------------------------------------------------------


def test_a_call_within_every_limit_passes_and_returns_its_worst_cost() -> None:
    limits = BudgetLimits(calls=10, tokens=10_000, cost_usd=Decimal("5"))
    cost = check_call("case", limits, BudgetUsage(), BudgetUsage(), _estimate(), PRICES)
    assert cost == 1_500 * 1_000_000  # 1,500 tokens at $0.001, in billionths


def test_the_daily_cost_budget_names_its_limit_the_usage_and_what_the_call_could_cost() -> None:
    limits = BudgetLimits(cost_usd=Decimal("5.00"))
    used = BudgetUsage(cost_nano=4_980_000_000)
    with pytest.raises(LlmBudgetExhausted) as caught:
        check_call(
            "day",
            limits,
            used,
            BudgetUsage(),
            _estimate(prompt_tokens=20, completion_tokens=10),
            PRICES,
        )
    assert str(caught.value) == (
        "The daily LLM cost budget $5.00 is reached: $4.98 used, and this call could cost "
        "$0.03 (CASEHUB_LLM_DAY_MAX_COST_USD)."
    )
    assert (caught.value.scope, caught.value.budget) == ("day", "llm_day_cost")


def test_calls_in_flight_count_against_the_call_and_token_budgets() -> None:
    in_flight = BudgetUsage(calls=2, tokens=3_000)
    with pytest.raises(
        LlmBudgetExhausted, match="call budget of 3 calls is reached: 1 made, 2 in flight"
    ):
        check_call(
            "case", BudgetLimits(calls=3), BudgetUsage(calls=1), in_flight, _estimate(), PRICES
        )
    with pytest.raises(LlmBudgetExhausted, match="this call may use up to 1,500"):
        check_call(
            "case", BudgetLimits(tokens=4_000), BudgetUsage(), in_flight, _estimate(), PRICES
        )


def test_an_unpriced_model_is_refused_only_where_a_money_budget_applies() -> None:
    unpriced = _estimate(model="local-llama")
    assert (
        check_call("case", BudgetLimits(calls=5), BudgetUsage(), BudgetUsage(), unpriced, PRICES)
        is None
    )
    with pytest.raises(
        LlmBudgetExhausted, match="'local-llama' has no price in CASEHUB_LLM_PRICES"
    ):
        check_call(
            "case",
            BudgetLimits(cost_usd=Decimal(1)),
            BudgetUsage(),
            BudgetUsage(),
            unpriced,
            PRICES,
        )


def test_the_prompt_bound_is_never_below_the_requests_utf8_bytes() -> None:
    body = {"messages": [{"role": "user", "content": "é" * 100}], "max_tokens": 16}
    assert prompt_bound(body) >= 200
    assert format_usd(Decimal("0.000150")) == "$0.00015"
    assert format_usd(Decimal("1234.5")) == "$1,234.50"


def test_budget_settings_are_validated() -> None:
    assert env_decimal("X", environ={"X": "2.50"}) == Decimal("2.50")
    assert env_decimal("X", environ={}) == 0
    for bad in ("-1", "NaN", "Infinity", "five"):
        with pytest.raises(ConfigError, match="X"):
            env_decimal("X", environ={"X": bad})
    with pytest.raises(ValueError):
        BudgetLimits(calls=-1)


def _import_settings(**env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "SECRET_KEY": "x", **env}
    return subprocess.run(
        [sys.executable, "-c", "import casehub.settings"],
        env=environ,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_a_money_budget_for_an_unpriced_default_model_stops_the_server_at_startup() -> None:
    refused = _import_settings(
        CASEHUB_LLM_CASE_MAX_COST_USD="1", CASEHUB_LLM_PRICES="", CASEHUB_LLM_MODEL="local"
    )
    assert refused.returncode != 0
    assert (
        "CASEHUB_LLM_CASE_MAX_COST_USD is set but CASEHUB_LLM_PRICES has no price" in refused.stderr
    )
    negative = _import_settings(CASEHUB_LLM_DAY_MAX_CALLS="-3")
    assert "CASEHUB_LLM_DAY_MAX_CALLS must be at least 0" in negative.stderr
    fine = _import_settings(CASEHUB_LLM_DAY_MAX_COST_USD="2.5", CASEHUB_LLM_PRICES="*=1/2")
    assert fine.returncode == 0, fine.stderr


# Planning (L5) -------------------------------------------------------------------------------


@pytest.fixture
def llm(settings: Any, fake_openai: FakeOpenAIServer) -> FakeOpenAIServer:
    settings.OPENAI_BASE_URL = fake_openai.base_url
    settings.OPENAI_API_KEY = "test-key"
    settings.CASEHUB_LLM_MAX_RETRIES = 0
    settings.CASEHUB_LLM_PRICE_TABLE = PRICES
    fake_openai.responder = fraud_plan_responder
    return fake_openai


def _llm_case(goal: str = "investigate-fraud") -> Case:
    from django.contrib.auth import get_user_model

    submitter = get_user_model().objects.filter(username="ana").first() or personas.analyst()
    return submit_case(
        submitter=submitter,
        title="Investigate",
        goal=goal,
        description="",
        inputs={},
        domain="",
        strategy="llm",
        max_depth=2,
    )


def _ledger(**lookup: Any) -> LlmUsage:
    return LlmUsage.objects.get(**lookup)


def _assert_counters_match_the_recorded_calls(row: LlmUsage, calls: Any) -> None:
    """The ledger equals the sum of the recorded calls; nothing is left reserved."""
    calls = list(calls)
    assert row.calls == len(calls)
    assert row.tokens == sum(c.prompt_tokens + c.completion_tokens for c in calls)
    cost = sum(PRICES.cost(c.model, c.prompt_tokens, c.completion_tokens) or 0 for c in calls)
    assert row.cost_nano_usd == int(Decimal(cost) * 1_000_000_000)
    assert not LlmReservation.objects.exists()


def _refusals(case: Case) -> list[AuditEvent]:
    return list(
        AuditEvent.objects.filter(
            chain=case_chain(case.pk), action="oversight.llm_budget.refused"
        ).order_by("seq")
    )


def _assert_failed_cleanly(case: Case, *words: str) -> str:
    case.refresh_from_db()
    assert case.status == CaseStatus.PLAN_FAILED
    for word in words:
        assert word in case.error
    assert not PlanVersion.objects.filter(case=case).exists()
    (refused,) = _refusals(case)
    assert refused.data["message"] == case.error
    assert verify_chain(case_chain(case.pk)) == []
    return case.error


@pytest.mark.scenario("L5")
@pytest.mark.django_db(transaction=True)
def test_the_per_case_call_budget_stops_planning_mid_run_and_the_counters_match(
    llm: FakeOpenAIServer, settings: Any
) -> None:
    settings.CASEHUB_LLM_CASE_MAX_CALLS = 1  # the root answer asks for one subtask: 2 calls
    case = _llm_case()
    assert materialise_plan(case.pk).outcome == Outcome.FAILED
    error = _assert_failed_cleanly(case, "per-case LLM call budget of 1 call", "1 made")
    assert error.endswith("(CASEHUB_LLM_CASE_MAX_CALLS).")
    assert len(llm.requests) == 1  # the refused call was never sent
    _assert_counters_match_the_recorded_calls(_ledger(case=case), LlmCall.objects.filter(case=case))
    assert _ledger(day=timezone.localdate()).calls == 1
    assert LlmCall.objects.filter(case=case).count() == 1


def _long_answers(request: Any) -> FakeReply:
    # answers that use most of their max_tokens: a used call then weighs more than the
    # difference between the root request's reservation and its subtask's
    return FakeReply(content=fraud_plan_responder(request), completion_tokens=2000)


def _measure(settings: Any) -> tuple[int, int, int, int]:
    """Plan one case with room to spare; return the two calls' reserved and used tokens."""
    estimates: list[CallEstimate] = []
    original = LedgerGuard.reserve

    def spy(self: LedgerGuard, estimate: CallEstimate) -> Any:
        estimates.append(estimate)
        return original(self, estimate)

    settings.CASEHUB_LLM_CASE_MAX_TOKENS = 10_000_000
    LedgerGuard.reserve = spy  # type: ignore[method-assign]
    try:
        case = _llm_case()
        assert materialise_plan(case.pk).outcome == Outcome.MATERIALISED
    finally:
        LedgerGuard.reserve = original  # type: ignore[method-assign]
    first, second = sorted(LlmCall.objects.filter(case=case), key=lambda c: c.pk)
    DecompositionCacheEntry.objects.all().delete()  # the next case asks the model again
    LlmUsage.objects.all().delete()
    return (
        estimates[0].tokens,
        first.prompt_tokens + first.completion_tokens,
        estimates[1].tokens,
        second.prompt_tokens + second.completion_tokens,
    )


@pytest.mark.scenario("L5")
@pytest.mark.django_db(transaction=True)
def test_the_per_case_token_budget_stops_planning_before_the_call_that_could_pass_it(
    llm: FakeOpenAIServer, settings: Any
) -> None:
    llm.responder = _long_answers
    reserve_1, used_1, reserve_2, _ = _measure(settings)
    limit = used_1 + reserve_2 - 1  # room for the first call's worst case, not for the second's
    assert reserve_1 <= limit
    settings.CASEHUB_LLM_CASE_MAX_TOKENS = limit
    sent = len(llm.requests)
    case = _llm_case()
    assert materialise_plan(case.pk).outcome == Outcome.FAILED
    _assert_failed_cleanly(
        case, f"per-case LLM token budget of {limit:,} tokens", f"{used_1:,} used", f"{reserve_2:,}"
    )
    assert len(llm.requests) == sent + 1
    _assert_counters_match_the_recorded_calls(_ledger(case=case), LlmCall.objects.filter(case=case))


@pytest.mark.scenario("L5")
@pytest.mark.django_db(transaction=True)
def test_the_per_case_cost_budget_stops_planning_with_the_dollars_named(
    llm: FakeOpenAIServer, settings: Any
) -> None:
    llm.responder = _long_answers
    reserve_1, used_1, reserve_2, _ = _measure(settings)
    assert reserve_1 <= used_1 + reserve_2 - 1
    settings.CASEHUB_LLM_CASE_MAX_TOKENS = 0
    # $0.001 a token: the same room in dollars as the token test's
    limit = Decimal(used_1 + reserve_2 - 1) / 1000
    settings.CASEHUB_LLM_CASE_MAX_COST_USD = limit
    case = _llm_case()
    assert materialise_plan(case.pk).outcome == Outcome.FAILED
    _assert_failed_cleanly(
        case,
        f"per-case LLM cost budget {format_usd(limit)} is reached",
        f"{format_usd(Decimal(used_1) / 1000)} used",
        f"this call could cost {format_usd(Decimal(reserve_2) / 1000)}",
    )
    row = _ledger(case=case)
    _assert_counters_match_the_recorded_calls(row, LlmCall.objects.filter(case=case))
    assert row.cost_nano_usd == used_1 * 1_000_000


@pytest.mark.scenario("L5")
@pytest.mark.django_db(transaction=True)
def test_the_daily_call_budget_is_shared_by_two_cases(llm: FakeOpenAIServer, settings: Any) -> None:
    settings.CASEHUB_LLM_DAY_MAX_CALLS = 3
    first = _llm_case()
    assert materialise_plan(first.pk).outcome == Outcome.MATERIALISED
    second = _llm_case("investigate-fraud-again")  # another goal: no answer from the cache
    assert materialise_plan(second.pk).outcome == Outcome.FAILED
    _assert_failed_cleanly(second, "daily LLM call budget of 3 calls", "3 made")
    assert len(llm.requests) == 3
    _assert_counters_match_the_recorded_calls(
        _ledger(day=timezone.localdate()), LlmCall.objects.all()
    )
    assert (_ledger(case=first).calls, _ledger(case=second).calls) == (2, 1)
    today = LedgerBudgets().day_status()
    assert (today.used.calls, today.calls_left) == (3, 0)


@pytest.mark.scenario("L5")
@pytest.mark.django_db(transaction=True)
def test_an_unpriced_model_under_a_money_budget_is_refused_before_any_request(
    llm: FakeOpenAIServer, settings: Any
) -> None:
    settings.CASEHUB_LLM_PRICE_TABLE = PriceTable.parse("another-model=1/1")
    settings.CASEHUB_LLM_DAY_MAX_COST_USD = Decimal("10")
    case = _llm_case()
    assert materialise_plan(case.pk).outcome == Outcome.FAILED
    _assert_failed_cleanly(case, "'gpt-4o-mini' has no price", "daily LLM cost budget $10.00")
    assert llm.requests == []


@pytest.mark.django_db(transaction=True)
def test_unpriced_calls_are_counted_as_unpriced_not_as_free(
    llm: FakeOpenAIServer, settings: Any
) -> None:
    settings.CASEHUB_LLM_PRICE_TABLE = PriceTable()
    settings.CASEHUB_LLM_CASE_MAX_CALLS = 10
    case = _llm_case()
    assert materialise_plan(case.pk).outcome == Outcome.MATERIALISED
    row = _ledger(case=case)
    assert (row.calls, row.unpriced_calls, row.cost_nano_usd) == (2, 2, 0)


@pytest.mark.django_db(transaction=True)
def test_a_failed_call_counts_as_a_call_without_tokens_and_leaves_nothing_reserved(
    llm: FakeOpenAIServer, settings: Any
) -> None:
    llm.responder = lambda request: FakeReply(status=500, should_retry=False)
    settings.CASEHUB_LLM_CASE_MAX_CALLS = 5
    case = _llm_case()
    assert materialise_plan(case.pk).outcome == Outcome.FAILED
    row = _ledger(case=case)
    assert (row.calls, row.tokens) == (1, 0)
    _assert_counters_match_the_recorded_calls(row, LlmCall.objects.filter(case=case))
    assert _refusals(case) == []


def test_no_budget_no_guard_and_nothing_counted(settings: Any) -> None:
    assert guard_for(1, "planning") is None
    settings.CASEHUB_LLM_DAY_MAX_TOKENS = 5
    assert isinstance(guard_for(1, "planning"), LedgerGuard)


# The ledger under concurrency -------------------------------------------------------------------


def _guard(case: Case, **limits: Any) -> LedgerGuard:
    return LedgerGuard(
        case.pk, "planning", case=BudgetLimits(**limits), day=BudgetLimits(), price_table=PRICES
    )


@pytest.mark.django_db(transaction=True)
def test_concurrent_reservations_from_threads_never_pass_the_limit(
    llm: FakeOpenAIServer, settings: Any
) -> None:
    settings.CASEHUB_LLM_CASE_MAX_CALLS = 5
    settings.CASEHUB_LLM_CASE_MAX_TOKENS = 100_000
    case = _llm_case()
    guard = guard_for(case.pk, "planning")
    assert guard is not None
    start = threading.Barrier(12)
    taken: list[object] = []
    refused: list[LlmBudgetExhausted] = []
    lock = threading.Lock()

    def reserve() -> None:
        start.wait()
        try:
            ticket = guard.reserve(_estimate())
        except LlmBudgetExhausted as exc:
            with lock:
                refused.append(exc)
        else:
            with lock:
                taken.append(ticket)

    threads = [threading.Thread(target=reserve) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert (len(taken), len(refused)) == (5, 7)
    assert LlmReservation.objects.filter(case=case).count() == 5
    assert all("0 made, 5 in flight" in str(exc) for exc in refused)
    for ticket in taken[:2]:
        guard.settle(ticket, prompt_tokens=100, completion_tokens=50)
    guard.release(taken[2])
    row = _ledger(case=case)
    assert (row.calls, row.tokens, row.cost_nano_usd) == (2, 300, 300 * 1_000_000)
    status = LedgerBudgets().case_status(case.pk)
    assert (status.used.calls, status.in_flight.calls, status.calls_left) == (2, 2, 1)


@pytest.mark.django_db(transaction=True)
def test_a_reservation_left_by_a_dead_process_counts_until_it_expires(
    llm: FakeOpenAIServer,
) -> None:
    case = _llm_case()
    guard = _guard(case, calls=1)
    guard.reserve(_estimate())  # never settled: its process "died"
    with pytest.raises(LlmBudgetExhausted, match="1 in flight"):
        guard.reserve(_estimate())
    LlmReservation.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    guard.reserve(_estimate())
    assert LlmReservation.objects.count() == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks across connections")
@pytest.mark.django_db(transaction=True)
def test_a_reservation_waits_for_another_connections_lock_on_the_days_row(
    llm: FakeOpenAIServer,
) -> None:
    from django.db import connections, transaction

    case = _llm_case()
    guard = _guard(case, calls=1)
    today = timezone.localdate()
    LlmUsage.objects.get_or_create(day=today, case=None)
    outcome: list[str] = []
    waiting = threading.Event()

    def other() -> None:
        waiting.wait(timeout=10)
        try:
            guard.reserve(_estimate())
            outcome.append("reserved")
        except LlmBudgetExhausted:
            outcome.append("refused")
        finally:
            connections.close_all()

    thread = threading.Thread(target=other)
    with transaction.atomic():
        LlmUsage.objects.select_for_update().get(day=today, case=None)
        thread.start()
        waiting.set()
        thread.join(timeout=1)
        assert thread.is_alive()  # blocked on the row lock
        # meanwhile this transaction takes the budget's one call
        LlmReservation.objects.create(
            case=case,
            day=today,
            model="m",
            purpose="p",
            tokens=1,
            expires_at=timezone.now() + timedelta(minutes=5),
        )
    thread.join(timeout=30)
    assert outcome == ["refused"]


_RESERVER = """
import os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "casehub.settings")
django.setup()
from planning.budgets import guard_for
from planning.core.llm.budget import CallEstimate, LlmBudgetExhausted
guard = guard_for(int(sys.argv[1]), "planning")
estimate = CallEstimate(
    model="gpt-4o-mini", purpose="p", prompt_tokens=10, completion_tokens=10, expires_in_s=60
)
sys.stdin.readline()  # both processes start reserving together
taken = 0
for _ in range(50):
    try:
        guard.reserve(estimate)
        taken += 1
    except LlmBudgetExhausted:
        pass
print(taken)
"""


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="processes share a PostgreSQL test DB"
)
@pytest.mark.django_db(transaction=True)
def test_two_worker_processes_reserving_at_once_never_pass_the_limit(llm: FakeOpenAIServer) -> None:
    case = _llm_case()
    db = connection.settings_dict
    url = (
        f"postgres://{db['USER']}:{db['PASSWORD'] or ''}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 5432}/{db['NAME']}"
    )
    env = {**os.environ, "SECRET_KEY": "x", "DATABASE_URL": url, "CASEHUB_LLM_CASE_MAX_CALLS": "30"}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _RESERVER, str(case.pk)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    outputs = [worker.communicate(timeout=120) for worker in workers]
    assert all(worker.returncode == 0 for worker in workers), outputs
    assert sum(int(out) for out, _ in outputs) == 30
    assert LlmReservation.objects.filter(case=case).count() == 30
    assert len(_refusals(case)) == 70


# Execution -------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.scenario("L5")
def test_an_llm_agent_stopped_by_the_case_budget_fails_its_leaf_as_a_policy_denial(
    notes_pack: FakeOpenAIServer, analyst: Any, officer: Any, settings: Any
) -> None:
    settings.CASEHUB_LLM_CASE_MAX_CALLS = 1
    settings.CASEHUB_LLM_PRICE_TABLE = PRICES
    notes_pack.enqueue(calls(("lookup_notes", {"account_id": "ACC-300"})), FINDINGS)
    case = approved_case(analyst, officer, expected_output="Findings")
    run_ready(case)
    node = review(case)
    assert (node.status, node.error_class) == (NodeStatus.FAILED, "policy_denial")
    assert node.error.startswith("stopped by an LLM budget: The per-case LLM call budget of 1 call")
    assert len(notes_pack.requests) == 1
    (refused,) = _refusals(case)
    assert refused.data["purpose"] == "execution"
    _assert_counters_match_the_recorded_calls(_ledger(case=case), LlmCall.objects.filter(case=case))


@pytest.mark.django_db
def test_the_goal_judge_without_budget_does_not_judge_and_says_why(
    settings: Any, fake_openai: FakeOpenAIServer, analyst: Any
) -> None:
    settings.OPENAI_BASE_URL = fake_openai.base_url
    settings.CASEHUB_LLM_PRICE_TABLE = PRICES
    settings.CASEHUB_LLM_CASE_MAX_CALLS = 2
    case = submit_case(
        submitter=analyst,
        title="t",
        goal="Verify invoice INV-1042",
        description="",
        inputs={"invoice_id": "INV-1042"},
        domain="invoice",
        strategy="static",
    )
    LlmUsage.objects.create(case=case, calls=2)
    answer = ask_judge(case, [], model="gpt-4o-mini")
    assert answer.error is not None and answer.error.startswith("not judged: The per-case")
    assert answer.records == () and fake_openai.requests == []
    assert not answer.judgement.reached
    assert "could not decide: not judged" in answer.judgement.problems[0]
    assert _refusals(case)[0].data["purpose"] == "goal_judge"


@pytest.fixture(autouse=True)
def _no_leftover_budgets(settings: Any) -> Iterator[None]:
    for scope in ("CASE", "DAY"):
        setattr(settings, f"CASEHUB_LLM_{scope}_MAX_CALLS", 0)
        setattr(settings, f"CASEHUB_LLM_{scope}_MAX_TOKENS", 0)
        setattr(settings, f"CASEHUB_LLM_{scope}_MAX_COST_USD", Decimal(0))
    yield


# The admins' panel -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_admins_see_todays_usage_against_the_budgets_on_the_execution_control_page(
    admin_user: Any, settings: Any, django_assert_max_num_queries: Any
) -> None:
    from django.test import Client
    from django.urls import reverse

    client = Client()
    client.force_login(admin_user)
    page = reverse("execution:execution-control")
    assert "No LLM budget is set" in client.get(page).content.decode()
    settings.CASEHUB_LLM_DAY_MAX_CALLS = 100
    settings.CASEHUB_LLM_CASE_MAX_COST_USD = Decimal("0.50")
    LlmUsage.objects.create(
        day=timezone.localdate(), calls=40, tokens=12_345, cost_nano_usd=1_500_000, unpriced_calls=3
    )
    with django_assert_max_num_queries(12):
        body = client.get(page).content.decode()
    calls_row = body.split('data-row="calls"')[1].split("</tr>")[0]
    assert [cell for cell in calls_row.split("<td>")[1:]] == [
        "40</td>", "0</td>", "100</td>", "60</td>", "none</td>",
    ]  # fmt: skip
    cost_row = body.split('data-row="cost"')[1].split("</tr>")[0]
    assert "0.0015</td>" in cost_row and "0.50</td>" in cost_row
    assert 'data-unpriced="3"' in body


@pytest.mark.django_db
def test_the_case_page_shows_the_cases_llm_use_against_its_budget(settings: Any) -> None:
    from django.test import Client
    from django.urls import reverse

    case = planned_invoice_case(personas.analyst())
    client = Client()
    client.force_login(case.submitter)
    page = reverse("execution:case-execution", args=[case.pk])
    assert b"data-llm-budget" not in client.get(page).content  # no per-case budget: nothing
    settings.CASEHUB_LLM_CASE_MAX_CALLS = 20
    settings.CASEHUB_LLM_CASE_MAX_COST_USD = Decimal("0.50")
    LlmUsage.objects.create(case=case, calls=7, tokens=4_200, cost_nano_usd=1_500_000)
    body = client.get(page).content.decode()
    line = body.split('data-llm-budget="case"')[1].split("</p>")[0]
    assert "7 of 20 calls" in " ".join(line.split())
    assert "4200 tokens" in line and "$0.0015 of $0.50" in line
