"""What real local OpenAI-compatible servers need: bounded answers, constrained schemas, bounded
repairs, refusals shown with the server's words, and json_object output where json_schema is
refused. Through the real `openai` client against the fake server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from planning.core.errors import LlmPlanningError
from planning.core.llm.decomposition import LlmBudgets, LlmDecomposition
from planning.core.llm.prompts import MAX_EXCERPT_CHARS, MAX_PROBLEM_CHARS
from planning.core.llm.records import LlmCallRecord, LlmSettings
from planning.core.llm.schemas import (
    MAX_TASK_CHARS,
    AnswerRules,
    answer_schema,
    portability_problems,
    read_answer,
)
from planning.core.tree import Goal
from tests.fakes import fixtures
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply, RecordedRequest, Reply
from tests.planning.core.llm_helpers import (
    AGENTS,
    answer,
    by_goal,
    is_repair,
    leaf,
    make_client,
    subtask,
)

fake_openai = fixtures.fake_openai

GOAL = Goal(name="investigate-fraud", description="investigate a suspected fraud case")
STATE = {"case": {"id": "C-17"}}
OFFERED = sorted(agent.slug for agent in AGENTS)


def planner(
    server: FakeOpenAIServer,
    *,
    max_depth: int = 1,
    records: list[LlmCallRecord] | None = None,
    budgets: LlmBudgets | None = None,
    max_repairs: int = 2,
    **settings: Any,
) -> LlmDecomposition:
    return LlmDecomposition(
        make_client(server, records, **settings),
        AGENTS,
        max_depth=max_depth,
        budgets=budgets or LlmBudgets(max_fanout=6),
        max_repairs=max_repairs,
    )


def rules(*, is_last_level: bool, max_steps: int = 6) -> AnswerRules:
    return AnswerRules(
        agents=frozenset(OFFERED), max_steps=max_steps, is_last_level=is_last_level, max_depth=2
    )


# -- every request bounds its answer ----------------------------------------------------------


@pytest.mark.scenario("L1")
def test_every_request_sets_max_tokens_from_the_per_call_ceiling(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal(
        {"investigate-fraud": answer(subtask("s", "gather")), "gather": answer(leaf("1"))}
    )
    planner(fake_openai, max_depth=2, max_tokens_per_call=700).plan(GOAL, STATE)
    assert [request.max_tokens for request in fake_openai.requests] == [700, 700]


@pytest.mark.scenario("L5")
def test_max_tokens_is_what_is_left_of_the_case_budget_when_that_is_less(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        FakeReply(content=answer(subtask("s", "gather")), prompt_tokens=600, completion_tokens=50),
        FakeReply(content=answer(leaf("1")), prompt_tokens=100, completion_tokens=10),
    )
    llm = planner(
        fake_openai,
        max_depth=2,
        max_tokens_per_call=2048,
        budgets=LlmBudgets(max_tokens=1000, max_fanout=6),
    )
    llm.plan(GOAL, STATE)
    assert [request.max_tokens for request in fake_openai.requests] == [1000, 350]


def test_a_temperature_goes_with_every_request_only_when_set(
    fake_openai: FakeOpenAIServer,
) -> None:
    replies = {"investigate-fraud": answer(subtask("s", "gather")), "gather": answer(leaf("1"))}
    fake_openai.responder = by_goal(replies)
    planner(fake_openai, max_depth=2, temperature=0.0).plan(GOAL, STATE)
    assert [request.body.get("temperature") for request in fake_openai.requests] == [0.0, 0.0]
    planner(fake_openai, max_depth=2).plan(GOAL, STATE)
    assert all("temperature" not in request.body for request in fake_openai.requests[2:])
    assert len(fake_openai.requests) == 4
    with pytest.raises(ValueError, match="temperature must be between 0 and 2"):
        LlmSettings(model="m", timeout_s=1, max_retries=0, max_concurrency=1, temperature=2.5)


def test_the_per_call_ceiling_is_a_setting_with_a_range() -> None:
    with pytest.raises(ValueError, match="max_tokens_per_call"):
        LlmSettings(model="m", timeout_s=1, max_retries=0, max_concurrency=1, max_tokens_per_call=8)
    with pytest.raises(ValueError, match="response_format"):
        LlmSettings(
            model="m",
            timeout_s=1,
            max_retries=0,
            max_concurrency=1,
            response_format="text",  # type: ignore[arg-type]
        )


@pytest.mark.scenario("L1")
def test_a_truncated_answer_is_not_parsed_and_gets_one_request_for_a_shorter_answer(
    fake_openai: FakeOpenAIServer,
) -> None:
    records: list[LlmCallRecord] = []
    # a cut-off answer whose prefix happens to be valid JSON must still not be used
    cut = answer(leaf("1"), leaf("2"))
    fake_openai.enqueue(FakeReply(content=cut, finish_reason="length"), answer(leaf("3")))
    plan = planner(fake_openai, records=records, max_tokens_per_call=300).plan(GOAL, STATE)

    assert [leaf.key for leaf in plan.leaves] == ["3"]
    _, repair = fake_openai.requests
    assert is_repair(repair)
    assert "cut off at the limit of 300 tokens" in repair.last_user_prompt
    assert "shorter" in repair.last_user_prompt
    assert "at most 6 steps" in repair.last_user_prompt
    assert "not valid JSON" not in repair.last_user_prompt
    assert records[0].error is not None and "finish_reason 'length'" in records[0].error


@pytest.mark.scenario("L1")
def test_a_second_truncation_fails_planning_with_a_clear_error(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = lambda request: FakeReply(
        content='{"steps": [{"id": "1", "agent": "analyst", "task": "ever', finish_reason="length"
    )
    with pytest.raises(LlmPlanningError) as excinfo:
        planner(fake_openai, max_tokens_per_call=256).plan(GOAL, STATE)
    message = str(excinfo.value)
    assert "cut off again, after a request for a shorter answer, at the limit of 256" in message
    assert "CASEHUB_LLM_MAX_TOKENS_PER_CALL" in message
    assert "Unterminated" not in message
    assert len(fake_openai.requests) == 2  # one repair for a truncation, not max_repairs


@pytest.mark.scenario("L1")
def test_a_truncation_without_repairs_left_fails_with_the_same_clear_error(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(FakeReply(content='{"steps": [', finish_reason="length"))
    with pytest.raises(LlmPlanningError, match="was cut off at the limit of 2048 tokens"):
        planner(fake_openai, max_repairs=0).plan(GOAL, STATE)


@pytest.mark.scenario("L1")
def test_a_truncated_repair_falls_back_to_the_valid_entries_of_the_earlier_answer(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        answer(leaf("1"), leaf("2", agent="ghost")),
        FakeReply(content='{"steps": [{"id"', finish_reason="length"),
        FakeReply(content='{"steps": [{"id"', finish_reason="length"),
    )
    with pytest.raises(LlmPlanningError, match="cut off again"):
        planner(fake_openai).plan(GOAL, STATE)
    fake_openai.enqueue(
        answer(leaf("1"), leaf("2", agent="ghost")),
        FakeReply(content='{"steps": [{"id"', finish_reason="length"),
        answer(leaf("1"), leaf("2", agent="ghost")),
    )
    plan = planner(fake_openai).plan(GOAL, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["1"]
    assert "'ghost' is not one of the available agents" in plan.warnings[0]


# -- the schema constrains what grammar-based decoding can enforce --------------------------


def test_the_schema_offers_the_agents_as_an_enum_and_bounds_the_steps() -> None:
    schema = answer_schema(rules(is_last_level=False, max_steps=7))
    steps = schema["properties"]["steps"]
    assert (steps["minItems"], steps["maxItems"]) == (1, 7)
    agent_step, subtask_step = steps["items"]["anyOf"]
    assert agent_step["properties"]["agent"]["enum"] == OFFERED
    assert agent_step["properties"]["task"]["maxLength"] == MAX_TASK_CHARS
    assert agent_step["properties"]["depends_on"]["anyOf"][0]["maxItems"] == 7
    assert set(subtask_step["properties"]) == {"id", "subtask", "description", "depends_on"}
    for text in ("task", "rationale"):
        assert isinstance(agent_step["properties"][text]["maxLength"], int)
    for text in ("subtask", "description"):
        assert isinstance(subtask_step["properties"][text]["maxLength"], int)


def test_the_last_level_schema_has_no_subtask_entries() -> None:
    schema = answer_schema(rules(is_last_level=True))
    assert "subtask" not in json.dumps(schema).lower()
    assert schema["properties"]["steps"]["items"]["properties"]["agent"]["enum"] == OFFERED


@pytest.mark.parametrize("is_last_level", [True, False])
def test_the_answer_schema_stays_in_the_subset_every_local_server_accepts(
    is_last_level: bool,
) -> None:
    assert portability_problems(answer_schema(rules(is_last_level=is_last_level))) == []


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "object", "properties": {}, "required": []}, "additionalProperties"),
        (
            {"anyOf": [{"type": "object", "properties": {}, "required": []}]},
            "root must be an object",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "required": [],
                "additionalProperties": False,
            },
            "every property must be required",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"oneOf": [{"type": "string"}, {"type": "null"}]}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "'oneOf'",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/A"}},
                "required": ["a"],
                "additionalProperties": False,
                "$defs": {"A": {"type": "string"}},
            },
            "'$ref'",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string", "format": "uri"}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "'format'",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string", "pattern": "(?=x)y"}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "not anchored",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string", "pattern": "^a+$", "maxLength": 4}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "bound the length in the pattern",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "object", "patternProperties": {}}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "'patternProperties'",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": ["string", "null"]}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "type must be one of",
        ),
    ],
)
def test_the_subset_checker_names_what_a_server_would_reject(
    schema: dict[str, Any], problem: str
) -> None:
    problems = portability_problems(schema)
    assert any(problem in line for line in problems), problems


@pytest.mark.scenario("L1")
def test_the_request_carries_the_constrained_schema_of_its_level(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal(
        {"investigate-fraud": answer(subtask("s", "gather")), "gather": answer(leaf("1"))}
    )
    planner(fake_openai, max_depth=2).plan(GOAL, STATE)
    root, last = fake_openai.requests
    root_steps = root.json_schema["properties"]["steps"]
    assert root_steps["maxItems"] == 6 and len(root_steps["items"]["anyOf"]) == 2
    last_steps = last.json_schema["properties"]["steps"]
    assert last_steps["items"]["properties"]["agent"]["enum"] == OFFERED
    assert "subtask" not in json.dumps(last.json_schema)
    assert portability_problems(root.json_schema) == []


@pytest.mark.scenario("L1")
def test_a_huge_string_breaks_the_same_bound_the_schema_states() -> None:
    read = read_answer(
        {"steps": [leaf("1", task="x" * (MAX_TASK_CHARS + 1))]}, rules(is_last_level=True)
    )
    (entry,) = read.entries
    assert not entry.is_usable
    assert f"at most {MAX_TASK_CHARS} characters" in entry.describe_problems()


# -- repairs fit the context window; refusals are shown and not retried -------------------------


@pytest.mark.scenario("L1")
def test_a_repair_quotes_a_bounded_excerpt_and_bounded_problems(
    fake_openai: FakeOpenAIServer,
) -> None:
    many_bad = answer(*(leaf(str(i), agent=f"ghost-{i}", task="t" * 200) for i in range(60)))
    fake_openai.enqueue(many_bad, answer(leaf("ok")))
    planner(fake_openai, budgets=LlmBudgets(max_fanout=6)).plan(GOAL, STATE)
    _, repair = fake_openai.requests
    assert len(many_bad) > 10 * MAX_EXCERPT_CHARS
    excerpt = repair.messages[-2]
    assert excerpt["role"] == "assistant"
    assert len(excerpt["content"]) < MAX_EXCERPT_CHARS + 100
    assert "more characters left out" in excerpt["content"]
    assert len(repair.last_user_prompt) < MAX_PROBLEM_CHARS + 400
    assert "more problem line(s) left out" in repair.last_user_prompt
    assert "the answer has 60 steps; at most 6" in repair.last_user_prompt


def test_every_repair_is_built_on_the_original_request_not_on_the_earlier_repairs(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        answer(leaf("1", agent="ghost")), answer(leaf("1", agent="phantom")), answer(leaf("1"))
    )
    planner(fake_openai).plan(GOAL, STATE)
    first, second, third = fake_openai.requests
    assert len(second.messages) == len(third.messages) == len(first.messages) + 2
    assert "phantom" in third.messages[-2]["content"]
    assert "ghost" not in json.dumps(third.messages)


@pytest.mark.scenario("L8")
def test_a_400_is_shown_with_the_servers_message_and_not_retried(
    fake_openai: FakeOpenAIServer,
) -> None:
    records: list[LlmCallRecord] = []
    message = "the request exceeds the available context size (4096 tokens), try increasing it"
    fake_openai.responder = lambda request: FakeReply(status=400, error_message=message)
    with pytest.raises(LlmPlanningError) as excinfo:
        planner(fake_openai, records=records, max_retries=3).plan(GOAL, STATE)
    assert len(fake_openai.requests) == 1  # neither the transport nor a repair tries again
    text = str(excinfo.value)
    assert "the server refused the request (HTTP 400, not retried)" in text
    assert message in text
    assert "investigate-fraud" in text
    assert records[0].error is not None and message in records[0].error


# -- servers without json_schema support ----------------------------------------------------------


def test_a_server_that_refuses_json_schema_is_asked_for_json_object_with_the_schema(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.refuse_json_schema = True
    records: list[LlmCallRecord] = []
    fake_openai.responder = by_goal(
        {"investigate-fraud": answer(subtask("s", "gather")), "gather": answer(leaf("1"))}
    )
    plan = planner(fake_openai, max_depth=2, records=records).plan(GOAL, STATE)

    assert [leaf.key for leaf in plan.leaves] == ["s.1"]
    kinds = [request.response_format["type"] for request in fake_openai.requests]
    # refused once, then json_object for the retry and for every later call of the client
    assert kinds == ["json_schema", "json_object", "json_object"]
    retried = fake_openai.requests[1]
    # the schema goes where llama.cpp's servers make a grammar of it, and into the prompt
    assert retried.response_format["schema"] == fake_openai.requests[0].json_schema
    assert '"enum":["analyst","investigator","writer"]' in retried.system_prompt
    assert retried.max_tokens == 2048
    assert "JSON schema" in records[0].messages[0]["content"]


def test_a_server_that_refuses_the_schema_in_json_object_gets_plain_json_object(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.refuse_json_schema = True
    fake_openai.refuse_response_schema = True
    fake_openai.responder = lambda request: answer(leaf("1"))
    llm = planner(fake_openai)
    llm.plan(GOAL, STATE)
    llm.plan(Goal(name="other", description="another goal"), STATE)
    formats = [request.response_format for request in fake_openai.requests]
    # the second case's request starts where the first left off
    assert [f["type"] for f in formats] == ["json_schema", *["json_object"] * 3]
    assert "schema" in formats[1] and "schema" not in formats[2] and "schema" not in formats[3]
    assert '"enum"' in fake_openai.requests[3].system_prompt


def test_json_object_answers_are_validated_the_same_way(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(answer(leaf("1", agent="ghost")), answer(leaf("1")))
    plan = planner(fake_openai, response_format="json_object").plan(GOAL, STATE)
    assert [request.response_format["type"] for request in fake_openai.requests] == [
        "json_object",
        "json_object",
    ]
    assert "'ghost' is not one of the available agents" in fake_openai.requests[1].last_user_prompt
    assert [leaf.key for leaf in plan.leaves] == ["1"]


def test_a_refusal_that_is_not_about_the_schema_is_not_retried_as_json_object(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = lambda request: FakeReply(status=400, error_message="model not loaded")
    with pytest.raises(LlmPlanningError, match="model not loaded"):
        planner(fake_openai).plan(GOAL, STATE)
    assert [r.response_format["type"] for r in fake_openai.requests] == ["json_schema"]


def test_a_server_that_wants_max_completion_tokens_gets_it_from_then_on(
    fake_openai: FakeOpenAIServer,
) -> None:
    refusal = (
        "Unsupported parameter: 'max_tokens' is not supported with this model. "
        "Use 'max_completion_tokens' instead."
    )

    def respond(request: RecordedRequest) -> Reply:
        if "max_tokens" in request.body:
            return FakeReply(status=400, error_message=refusal)
        return answer(subtask("s", "gather")) if request.index == 1 else answer(leaf("1"))

    fake_openai.responder = respond
    plan = planner(fake_openai, max_depth=2, max_tokens_per_call=900).plan(GOAL, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["s.1"]
    bounds = [
        (request.body.get("max_tokens"), request.body.get("max_completion_tokens"))
        for request in fake_openai.requests
    ]
    assert bounds == [(900, None), (None, 900), (None, 900)]
