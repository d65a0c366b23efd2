"""The OpenAI client module, through the real `openai` SDK against the fake server."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import BaseModel

from planning.core.errors import LlmPlanningError
from planning.core.llm.client import LlmClient
from planning.core.llm.records import LlmCallRecord, LlmNotConfigured, LlmSettings
from planning.core.llm.schemas import AgentPlanResponse, NestedPlanResponse
from planning.core.llm.structured_output import extract_json, strict_json_schema
from tests.fakes import fixtures
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply
from tests.planning.core.llm_helpers import answer, leaf, make_client

fake_openai = fixtures.fake_openai


class Verdict(BaseModel):
    verdict: str
    score: int
    note: str | None = None


MESSAGES = [{"role": "system", "content": "judge"}, {"role": "user", "content": "the case"}]
VERDICT_SCHEMA = strict_json_schema(Verdict)


def test_settings_hide_the_key_and_know_whether_a_provider_is_configured() -> None:
    settings = LlmSettings(
        api_key="sk-1", model="llama3", timeout_s=12.5, max_retries=1, max_concurrency=64
    )
    assert settings.is_configured
    assert "sk-1" not in repr(settings)
    local = LlmSettings(
        base_url="http://127.0.0.1:11434/v1",
        model="llama3",
        timeout_s=5,
        max_retries=0,
        max_concurrency=1,
    )
    assert local.is_configured  # a local server needs no key


@pytest.mark.parametrize(
    ("field", "value"),
    [("timeout_s", 0), ("max_retries", 11), ("max_concurrency", 0), ("model", " ")],
)
def test_settings_out_of_range_are_refused(field: str, value: object) -> None:
    values: dict[str, Any] = {
        "model": "m",
        "timeout_s": 1.0,
        "max_retries": 0,
        "max_concurrency": 8,
        field: value,
    }
    with pytest.raises(ValueError, match=field):
        LlmSettings(**values)


def test_no_provider_raises_an_error_that_sends_the_reader_to_the_operator() -> None:
    settings = LlmSettings(model="m", timeout_s=1.0, max_retries=0, max_concurrency=1)
    assert not settings.is_configured
    with pytest.raises(LlmNotConfigured) as excinfo:
        LlmClient(settings)
    message = str(excinfo.value)
    assert message == (
        "LLM planning needs an LLM provider, and this server has none configured. "
        "Ask the operator of this server to configure an LLM provider."
    )
    # An analyst reads it on the case: no environment variable (those are in the docs).
    assert not re.search(r"\b[A-Z]+_[A-Z_]+\b", message)
    assert isinstance(excinfo.value, LlmPlanningError)


def test_strict_schema_requires_every_property_and_forbids_extras() -> None:
    schema = strict_json_schema(Verdict)
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["verdict", "score", "note"]
    assert {"type": "null"} in schema["properties"]["note"]["anyOf"]
    assert "default" not in json.dumps(schema)


def test_strict_schema_of_nested_steps_uses_any_of_and_closed_objects() -> None:
    schema = strict_json_schema(NestedPlanResponse)
    text = json.dumps(schema)
    assert "oneOf" not in text
    for definition in schema["$defs"].values():
        assert definition["additionalProperties"] is False
        assert set(definition["required"]) == set(definition["properties"])


def test_last_level_schema_knows_nothing_of_subtasks() -> None:
    assert "subtask" not in json.dumps(strict_json_schema(AgentPlanResponse)).lower()


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        '```json\n{"a": 1}\n```',
        '```\n{"a": 1}\n```',
        'Here is the plan:\n```json\n{"a": 1}\n```\nGood luck.',
    ],
)
def test_json_in_a_code_fence_is_tolerated(text: str) -> None:
    assert extract_json(text) == {"a": 1}


def test_unparseable_text_raises_with_the_position() -> None:
    with pytest.raises(ValueError, match="line 1 column"):
        extract_json('{"a": ')


def test_complete_json_sends_strict_structured_output_and_returns_usage(
    fake_openai: FakeOpenAIServer,
) -> None:
    records: list[LlmCallRecord] = []
    fake_openai.enqueue(
        FakeReply(
            content='{"verdict": "ok", "score": 3, "note": null}',
            prompt_tokens=11,
            completion_tokens=7,
        )
    )
    client = make_client(fake_openai, records)
    result = client.complete_json(
        MESSAGES,
        Verdict.model_validate,
        schema_name="verdict",
        json_schema=strict_json_schema(Verdict),
        call_id="llm:1",
    )

    assert result.parsed == Verdict(verdict="ok", score=3)
    assert result.validation_error is None
    assert (result.prompt_tokens, result.completion_tokens, result.total_tokens) == (11, 7, 18)
    assert result.latency_s > 0
    assert result.call_id == "llm:1"
    (request,) = fake_openai.requests
    assert request.body["model"] == "fake-model"
    assert request.body["messages"] == MESSAGES
    assert request.response_format["type"] == "json_schema"
    assert request.response_format["json_schema"]["name"] == "verdict"
    assert request.response_format["json_schema"]["strict"] is True
    assert request.json_schema == strict_json_schema(Verdict)
    assert request.headers.get("authorization") == "Bearer test-key"

    (record,) = records
    assert record.call_id == "llm:1"
    assert record.model == "fake-model"
    assert [dict(m) for m in record.messages] == MESSAGES
    assert record.response_text == '{"verdict": "ok", "score": 3, "note": null}'
    assert (record.prompt_tokens, record.completion_tokens) == (11, 7)
    assert record.error is None
    assert record.request_hash == result.request_hash
    assert len(record.prompt_hash) == 64 and len(record.response_hash) == 64


def test_an_invalid_answer_is_returned_with_its_validation_error_and_recorded(
    fake_openai: FakeOpenAIServer,
) -> None:
    records: list[LlmCallRecord] = []
    fake_openai.enqueue('{"verdict": "ok"}')
    result = make_client(fake_openai, records).complete_json(
        MESSAGES, Verdict.model_validate, schema_name="verdict", json_schema=VERDICT_SCHEMA
    )
    assert result.parsed is None
    assert result.validation_error is not None
    assert "score" in result.validation_error
    assert records[0].error == result.validation_error


def test_request_hash_changes_with_model_messages_and_schema(
    fake_openai: FakeOpenAIServer,
) -> None:
    client = make_client(fake_openai)
    other_model = make_client(fake_openai, model="other")
    schema = strict_json_schema(Verdict)
    base = client.request_hash(MESSAGES, "verdict", schema)
    assert base == client.request_hash([dict(m) for m in MESSAGES], "verdict", dict(schema))
    assert base != other_model.request_hash(MESSAGES, "verdict", schema)
    assert base != client.request_hash(MESSAGES[:1], "verdict", schema)
    assert base != client.request_hash(MESSAGES, "verdict", strict_json_schema(AgentPlanResponse))


def test_http_errors_raise_llm_planning_error_and_are_recorded(
    fake_openai: FakeOpenAIServer,
) -> None:
    records: list[LlmCallRecord] = []
    fake_openai.enqueue(FakeReply(status=400, error_message="model not found"))
    with pytest.raises(LlmPlanningError, match="HTTP 400"):
        make_client(fake_openai, records).complete_json(
            MESSAGES, Verdict.model_validate, schema_name="v", json_schema=VERDICT_SCHEMA
        )
    assert records[0].error is not None
    assert "model not found" in records[0].error


def test_transient_server_errors_are_retried_a_bounded_number_of_times(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(FakeReply(status=503), FakeReply(status=503), FakeReply(status=503))
    client = make_client(fake_openai, max_retries=1)
    with pytest.raises(LlmPlanningError, match="HTTP 503"):
        client.complete_json(
            MESSAGES, Verdict.model_validate, schema_name="v", json_schema=VERDICT_SCHEMA
        )
    assert len(fake_openai.requests) == 2  # one try plus one retry, then give up


def test_a_retry_after_a_transient_error_can_succeed(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(FakeReply(status=503), '{"verdict": "ok", "score": 1, "note": "x"}')
    client = make_client(fake_openai, max_retries=1)
    result = client.complete_json(
        MESSAGES, Verdict.model_validate, schema_name="v", json_schema=VERDICT_SCHEMA
    )
    assert result.parsed is not None and result.parsed.note == "x"


def test_a_slow_server_hits_the_explicit_timeout(fake_openai: FakeOpenAIServer) -> None:
    records: list[LlmCallRecord] = []
    fake_openai.enqueue(FakeReply(content="{}", extra_latency_s=2.0))
    client = make_client(fake_openai, records, timeout_s=0.3)
    with pytest.raises(LlmPlanningError, match="timed out"):
        client.complete_json(
            MESSAGES, Verdict.model_validate, schema_name="v", json_schema=VERDICT_SCHEMA
        )
    assert records[0].error is not None and "timed out" in records[0].error
    assert records[0].latency_s < 1.5


def test_fake_server_without_a_scripted_reply_fails_loudly(fake_openai: FakeOpenAIServer) -> None:
    with pytest.raises(LlmPlanningError, match="no scripted reply"):
        make_client(fake_openai).complete_json(
            MESSAGES, Verdict.model_validate, schema_name="v", json_schema=VERDICT_SCHEMA
        )


def test_fake_server_lists_its_model(fake_openai: FakeOpenAIServer) -> None:
    import urllib.request

    with urllib.request.urlopen(fake_openai.base_url + "/models", timeout=5) as response:
        body = json.loads(response.read())
    assert body["data"][0]["id"] == "fake-model"


def test_the_validator_sees_the_decoded_json_and_its_error_is_returned(
    fake_openai: FakeOpenAIServer,
) -> None:
    def validate(data: Any) -> list[Any]:
        if not isinstance(data, list):
            raise ValueError("expected a list")
        return data

    fake_openai.enqueue(json.dumps([leaf("a")]), '{"steps": []}')
    client = make_client(fake_openai)
    ok = client.complete_json(MESSAGES, validate, schema_name="s", json_schema=VERDICT_SCHEMA)
    assert ok.parsed == [leaf("a")]
    bad = client.complete_json(MESSAGES, validate, schema_name="s", json_schema=VERDICT_SCHEMA)
    assert (bad.parsed, bad.validation_error) == (None, "expected a list")
    assert answer(leaf("a"))  # helper sanity: renders the wrapped form


def test_the_connection_pool_keeps_a_connection_for_every_concurrent_call(
    fake_openai: FakeOpenAIServer,
) -> None:
    client = make_client(fake_openai, max_concurrency=96)
    pool = client.transport._openai._client._transport._pool  # the SDK's httpx connection pool
    assert pool._max_connections == pool._max_keepalive_connections == 96


def test_the_client_closes_its_connections_as_a_context_manager(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue('{"verdict": "ok", "score": 1, "note": null}')
    with make_client(fake_openai) as client:
        assert (
            client.complete_json(
                MESSAGES, Verdict.model_validate, schema_name="v", json_schema=VERDICT_SCHEMA
            ).parsed
            is not None
        )
    with pytest.raises(LlmPlanningError):
        client.complete_json(
            MESSAGES, Verdict.model_validate, schema_name="v", json_schema=VERDICT_SCHEMA
        )
