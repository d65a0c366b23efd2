"""The LLM client's budget hook: reserve before the request, settle or release after it."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from planning.core.llm.budget import CallEstimate, LlmBudgetExhausted
from planning.core.llm.client import LlmClient
from planning.core.llm.records import LlmCallFailed, LlmCallRecord
from tests.fakes import fixtures
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply
from tests.planning.core.llm_helpers import settings_for

fake_openai = fixtures.fake_openai


class RecordingGuard:
    """A guard that records what the client asks; refuses once `refuse` is set."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.events: list[tuple[str, Any]] = []

    def reserve(self, estimate: CallEstimate) -> object:
        if self.refuse:
            raise LlmBudgetExhausted(
                "no budget left", scope="case", budget="calls", limit=1, used=1, needed=1
            )
        ticket = len(self.events)
        self.events.append(("reserve", estimate))
        return ticket

    def settle(self, ticket: object, *, prompt_tokens: int, completion_tokens: int) -> None:
        self.events.append(("settle", (ticket, prompt_tokens, completion_tokens)))

    def release(self, ticket: object) -> None:
        self.events.append(("release", ticket))


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
MESSAGES = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "ünïcode " * 50}]


def _client(server: FakeOpenAIServer, guard: RecordingGuard, records: list[LlmCallRecord]) -> Any:
    return LlmClient(
        settings_for(server, max_tokens_per_call=300, max_retries=0),
        on_call=records.append,
        guard=guard,
    )


def _ask(client: LlmClient) -> Any:
    return client.complete_json(MESSAGES, lambda d: d, schema_name="answer", json_schema=SCHEMA)


def test_the_worst_case_is_reserved_before_the_request_and_settled_to_the_usage(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(FakeReply(content='{"ok": true}', prompt_tokens=120, completion_tokens=7))
    guard, records = RecordingGuard(), []
    with _client(fake_openai, guard, records) as client:
        result = _ask(client)
    assert result.parsed == {"ok": True}
    (_, estimate), (_, settled) = guard.events
    body = fake_openai.requests[0].body
    assert estimate.completion_tokens == 300 == body["max_tokens"]
    assert estimate.prompt_tokens >= len(
        json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    )
    assert estimate.expires_in_s > 0 and estimate.model == client.model
    assert settled == (0, 120, 7)
    assert len(records) == 1


def test_a_refused_call_is_never_sent_and_leaves_no_record(fake_openai: FakeOpenAIServer) -> None:
    guard, records = RecordingGuard(refuse=True), []
    with _client(fake_openai, guard, records) as client, pytest.raises(LlmBudgetExhausted):
        _ask(client)
    assert fake_openai.requests == [] and records == []


def test_a_failed_call_settles_as_a_call_without_tokens(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeReply(status=500, should_retry=False))
    guard, records = RecordingGuard(), []
    with _client(fake_openai, guard, records) as client, pytest.raises(LlmCallFailed):
        _ask(client)
    assert [kind for kind, _ in guard.events] == ["reserve", "settle"]
    assert guard.events[1][1] == (0, 0, 0)
    assert records[0].error


def test_calls_with_tools_are_guarded_too(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeReply(content='{"ok": true}', prompt_tokens=50, completion_tokens=5))
    guard, records = RecordingGuard(), []
    with _client(fake_openai, guard, records) as client:
        client.complete_with_tools(
            MESSAGES, lambda d: d, tools=[], schema_name="answer", json_schema=SCHEMA
        )
    assert [kind for kind, _ in guard.events] == ["reserve", "settle"]
    assert guard.events[1][1] == (0, 50, 5)


class Interrupted(Exception):
    """What a time limit's signal raises in the middle of a call."""


@pytest.mark.scenario("S3")
def test_a_call_interrupted_in_flight_is_reported_and_settled_for_its_prompt(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(FakeReply(content='{"ok": true}', extra_latency_s=3))
    guard, records = RecordingGuard(), []

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted("time is up")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with _client(fake_openai, guard, records) as client, pytest.raises(Interrupted):
            _ask(client)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    (_, estimate), (kind, settled) = guard.events
    assert kind == "settle"  # not released: the request went out
    assert settled == (0, estimate.prompt_tokens, 0)
    (record,) = records
    assert record.error and "interrupted" in record.error and "time is up" in record.error
    assert (record.prompt_tokens, record.completion_tokens) == (estimate.prompt_tokens, 0)
    assert record.response_text == "" and len(fake_openai.requests) == 1
