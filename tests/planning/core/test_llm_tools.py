"""Function calling through the client module: the real `openai` SDK against the fake server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from planning.core.llm.client import LlmClient
from planning.core.llm.records import LlmCallFailed, LlmCallRecord, ToolDefinition
from planning.core.llm.structured_output import strict_json_schema
from tests.fakes import fixtures
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply
from tests.planning.core.llm_helpers import make_client

fake_openai = fixtures.fake_openai


class Finding(BaseModel):
    summary: str
    risk: int


class AccountQuery(BaseModel):
    account_id: str


LOOKUP = ToolDefinition(
    name="pull_transactions",
    description="Summarise an account's transactions",
    parameters=AccountQuery.model_json_schema(),
)
MESSAGES = [
    {"role": "system", "content": "You review accounts."},
    {"role": "user", "content": "Review ACC-300."},
]
FINDING_SCHEMA = strict_json_schema(Finding)


def ask(client: LlmClient, messages: list[dict[str, Any]] | None = None, **options: Any) -> Any:
    values: dict[str, Any] = {
        "tools": [LOOKUP],
        "schema_name": "finding",
        "json_schema": FINDING_SCHEMA,
    }
    values.update(options)
    return client.complete_with_tools(messages or MESSAGES, Finding.model_validate, **values)


def test_the_model_asks_for_a_tool_and_gets_back_its_name_arguments_and_id(
    fake_openai: FakeOpenAIServer,
) -> None:
    records: list[LlmCallRecord] = []
    fake_openai.enqueue(
        FakeReply(tool_calls=[{"id": "c1", "name": "pull_transactions", "arguments": {"a": 1}}])
    )
    result = ask(make_client(fake_openai, records))
    assert [(c.id, c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        ("c1", "pull_transactions", {"a": 1})
    ]
    assert result.parsed is None and result.validation_error is None
    assert result.finish_reason == "tool_calls"
    request = fake_openai.requests[0]
    assert request.tools == ["pull_transactions"]
    assert request.tool_choice == "auto"
    assert request.body["tools"][0]["function"]["parameters"] == AccountQuery.model_json_schema()
    assert request.response_format["type"] == "json_schema"
    assert request.max_tokens == 2048
    # the record's response is the tool calls the model asked for, so its hash covers them
    assert json.loads(records[0].response_text)["tool_calls"][0]["name"] == "pull_transactions"
    assert records[0].prompt_tokens > 0 and records[0].error is None


def test_the_tool_results_go_back_and_the_final_answer_is_validated(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        FakeReply(tool_calls=[{"id": "c1", "name": "pull_transactions", "arguments": "{}"}]),
        '{"summary": "two outliers", "risk": 3}',
    )
    client = make_client(fake_openai)
    first = ask(client)
    conversation = [
        *MESSAGES,
        first.assistant_message(),
        {"role": "tool", "tool_call_id": "c1", "content": '{"count": 5}'},
    ]
    final = ask(client, conversation)
    assert final.tool_calls == ()
    assert final.parsed == Finding(summary="two outliers", risk=3)
    sent = fake_openai.requests[1].messages
    assert sent[2]["tool_calls"][0]["function"] == {"name": "pull_transactions", "arguments": "{}"}
    assert sent[3] == {"role": "tool", "tool_call_id": "c1", "content": '{"count": 5}'}


def test_a_final_answer_that_does_not_fit_is_returned_with_its_validation_error(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue('{"summary": "x", "risk": "high"}')
    result = ask(make_client(fake_openai))
    assert result.parsed is None
    assert result.validation_error is not None and "risk" in result.validation_error


def test_without_a_schema_any_json_object_is_asked_for_and_without_tools_none_are_sent(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue('{"anything": [1, 2]}')
    result = make_client(fake_openai).complete_with_tools(
        MESSAGES, dict, tools=[], schema_name="answer", json_schema=None
    )
    assert result.parsed == {"anything": [1, 2]}
    request = fake_openai.requests[0]
    assert request.response_format == {"type": "json_object"}
    assert "tools" not in request.body and "tool_choice" not in request.body


def test_a_truncated_answer_yields_neither_tool_calls_nor_a_final_answer(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        FakeReply(
            tool_calls=[{"name": "pull_transactions", "arguments": '{"account'}],
            finish_reason="length",
        )
    )
    result = ask(make_client(fake_openai), max_tokens=64)
    assert result.truncated and result.tool_calls == () and result.parsed is None
    assert result.validation_error is not None and "cut off at the limit of 64" in (
        result.validation_error
    )
    assert fake_openai.requests[0].max_tokens == 64


@pytest.mark.scenario("L8")
def test_slow_429_500_and_reset_answers_are_retried_within_bounds_then_succeed_once(
    fake_openai: FakeOpenAIServer,
) -> None:
    records: list[LlmCallRecord] = []
    fake_openai.enqueue(
        FakeReply(content="{}", extra_latency_s=1.5),  # past the timeout
        FakeReply(reset=True),
        FakeReply(status=429, retry_after_s=0.01),
        FakeReply(status=500, retry_after_s=0.01),
        '{"summary": "ok", "risk": 1}',
    )
    result = ask(make_client(fake_openai, records, timeout_s=0.5, max_retries=4))
    assert result.parsed == Finding(summary="ok", risk=1)
    assert [r.status for r in fake_openai.requests] == [200, 0, 429, 500, 200]
    assert len(records) == 1 and records[0].error is None  # one call, retried inside the SDK


@pytest.mark.scenario("L8")
def test_a_server_that_stays_down_fails_transient_after_the_bounded_retries(
    fake_openai: FakeOpenAIServer,
) -> None:
    records: list[LlmCallRecord] = []
    fake_openai.responder = lambda request: FakeReply(status=503, retry_after_s=0.01)
    with pytest.raises(LlmCallFailed, match="HTTP 503") as excinfo:
        ask(make_client(fake_openai, records, max_retries=2))
    assert excinfo.value.transient
    assert len(fake_openai.requests) == 3  # one try and two retries
    assert records[0].error is not None and "HTTP 503" in records[0].error


def test_a_refused_request_is_not_retried_and_not_transient(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(FakeReply(status=400, error_message="tools are not supported"))
    with pytest.raises(LlmCallFailed, match="not retried") as excinfo:
        ask(make_client(fake_openai, max_retries=3))
    assert not excinfo.value.transient
    assert len(fake_openai.requests) == 1
