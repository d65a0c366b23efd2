"""LLM-planned steps that name a domain pack's own actions (the pack's leaves for the case)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from planning.core.llm.cache import InMemoryDecompositionCache
from planning.core.llm.decomposition import LlmDecomposition
from planning.core.llm.schemas import AnswerRules, answer_schema, portability_problems, read_answer
from planning.core.refs import REF_KEY
from planning.core.validation import validate_plan
from planning.packs import PACKS
from tests.fakes import fixtures
from tests.fakes.openai_server import FakeOpenAIServer, RecordedRequest
from tests.planning.core.llm_helpers import answer, by_goal, is_repair, leaf, make_client, subtask

fake_openai = fixtures.fake_openai

INVOICE = PACKS["invoice"]
STATE = INVOICE.initial_state({"invoice_id": "INV-1042"})
GOAL = INVOICE.goal("Invoice INV-1042 may have been paid twice")


def action(step_id: str, name: str, depends_on: list[str] | None = None) -> dict[str, Any]:
    # the agent written is one the request offers; the action's own replaces it
    return {**leaf(step_id, "ap-reviewer", f"run {name}", depends_on), "action": name}


def planner(
    server: FakeOpenAIServer, *, max_depth: int = 1, pack_actions: bool = True, **kwargs: Any
) -> LlmDecomposition:
    return LlmDecomposition(
        make_client(server),
        INVOICE.agents,
        max_depth=max_depth,
        actions=INVOICE.capabilities_for if pack_actions else None,
        **kwargs,
    )


def rules(actions: frozenset[str] = frozenset(), *, is_last_level: bool = True) -> AnswerRules:
    return AnswerRules(
        agents=frozenset({"ap-reviewer"}),
        max_steps=6,
        is_last_level=is_last_level,
        max_depth=2,
        actions=actions,
    )


# -- the schema and the check --------------------------------------------------------------------


@pytest.mark.parametrize("is_last_level", [True, False])
def test_the_schema_offers_the_actions_as_an_enum_right_after_the_id(is_last_level: bool) -> None:
    schema = answer_schema(
        rules(frozenset({"check-duplicate", "extract-fields"}), is_last_level=is_last_level)
    )
    items = schema["properties"]["steps"]["items"]
    agent_step = items if is_last_level else items["anyOf"][0]
    assert list(agent_step["properties"])[:3] == ["id", "action", "agent"]
    assert agent_step["required"] == list(agent_step["properties"])
    assert agent_step["properties"]["action"]["anyOf"] == [
        {"type": "string", "enum": ["check-duplicate", "extract-fields"]},
        {"type": "null"},
    ]
    assert portability_problems(schema) == []


def test_without_actions_the_schema_has_no_action_property() -> None:
    agent_step = answer_schema(rules())["properties"]["steps"]["items"]
    assert "action" not in agent_step["properties"]
    assert "available actions" not in json.dumps(agent_step)


def test_an_unknown_action_is_a_problem_quoted_for_the_repair() -> None:
    read = read_answer({"steps": [action("a", "pay-twice")]}, rules(frozenset({"check-duplicate"})))
    assert not read.is_clean
    assert "'pay-twice' is not one of the available actions (check-duplicate)" in read.report()
    assert "steps.0.action" in read.report()


def test_an_action_where_none_is_offered_is_a_problem() -> None:
    read = read_answer({"steps": [action("a", "check-duplicate")]}, rules())
    assert "none are offered: use null" in read.report()


def test_a_step_naming_an_action_is_not_held_to_the_offered_agents() -> None:
    step = {**action("a", "check-duplicate"), "agent": "payments-auditor"}
    read = read_answer({"steps": [step]}, rules(frozenset({"check-duplicate"})))
    assert read.is_clean
    without = read_answer(
        {"steps": [{**step, "action": None}]}, rules(frozenset({"check-duplicate"}))
    )
    assert "'payments-auditor' is not one of the available agents" in without.report()


# -- materialising ---------------------------------------------------------------------------------


def test_a_named_action_becomes_the_packs_leaf_with_its_tool_inputs_and_references(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal(
        {
            GOAL.name: answer(
                action("s1", "extract-fields", []),
                action("s2", "check-duplicate", []),
                leaf("s3", "ap-reviewer", "read the result", ["s2"]),
            )
        }
    )
    plan = planner(fake_openai).plan(GOAL, STATE)
    extract, duplicate, read = plan.leaves
    assert (extract.key, extract.agent, extract.tool) == (
        "extract-fields",
        "invoice-extractor",
        "extract_invoice_fields",
    )
    assert dict(extract.inputs) == {"invoice_id": "INV-1042"}
    assert duplicate.key == "check-duplicate"
    assert duplicate.tool == "check_duplicate_payment"
    assert duplicate.inputs["invoice"][REF_KEY] == "extract-fields"
    assert (duplicate.failure_policy, duplicate.expected_output) == (
        "retry",
        "DuplicateCheckResult",
    )
    assert duplicate.task == "Check payment history for a duplicate payment"  # the pack's task
    # the model said [] but its input uses extract-fields' output
    assert plan.dependencies["check-duplicate"] == frozenset({"extract-fields"})
    assert plan.dependencies[read.key] == frozenset({"check-duplicate"})
    assert read.tool is None
    assert plan.warnings == ()
    validate_plan(plan, INVOICE.catalogue())


def test_an_action_whose_input_needs_an_unplanned_action_pulls_it_in_with_a_warning(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal({GOAL.name: answer(action("s1", "audit-report"))})
    plan = planner(fake_openai).plan(GOAL, STATE)
    keys = [leaf.key for leaf in plan.leaves]
    assert keys[-1] == "audit-report"
    assert set(keys) == {
        "extract-fields",
        "lookup-supplier",
        "check-duplicate",
        "check-totals",
        "check-po",
        "audit-report",
    }
    # producers before consumers, and each consumer waits for what it uses
    assert keys.index("extract-fields") < keys.index("lookup-supplier")
    assert "extract-fields" in plan.upstream("check-po")
    assert plan.upstream("audit-report") >= set(keys[:-1])
    assert any("added 'extract-fields'" in w for w in plan.warnings)
    validate_plan(plan, INVOICE.catalogue())


def test_an_action_named_twice_runs_once_and_its_dependents_wait_for_the_first(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal(
        {
            GOAL.name: answer(
                action("s1", "extract-fields"),
                action("s2", "extract-fields"),
                leaf("s3", "ap-reviewer", "read the fields", ["s2"]),
            )
        }
    )
    plan = planner(fake_openai).plan(GOAL, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["extract-fields", "s3"]
    assert plan.dependencies["s3"] == frozenset({"extract-fields"})
    assert any("names action 'extract-fields' again" in w for w in plan.warnings)


def test_a_plain_step_does_not_take_the_key_an_action_reference_means(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal(
        {
            GOAL.name: answer(
                leaf("extract-fields", "ap-reviewer", "type the fields in by hand"),
                action("s2", "check-duplicate"),
            )
        }
    )
    plan = planner(fake_openai).plan(GOAL, STATE)
    by_key = {leaf.key: leaf for leaf in plan.leaves}
    assert by_key["extract-fields"].tool == "extract_invoice_fields"  # pulled in
    assert by_key[f"{GOAL.name}.extract-fields"].tool is None
    assert by_key["check-duplicate"].inputs["invoice"][REF_KEY] == "extract-fields"
    validate_plan(plan, INVOICE.catalogue())


def _depth_two(request: RecordedRequest) -> str:
    if "Goal: checks" in request.user_prompt:
        return answer(action("c1", "extract-fields"), action("c2", "check-totals"))
    return answer(
        action("s1", "extract-fields"),
        subtask("s2", "checks", "check the invoice", ["s1"]),
        subtask("s3", "more", "check it again", []),
    )


def test_a_subtree_uses_the_actions_upstream_of_it_and_an_independent_ones_repeat_is_merged(
    fake_openai: FakeOpenAIServer,
) -> None:
    def respond(request: RecordedRequest) -> str:
        if "Goal: more" in request.user_prompt:
            return answer(action("m1", "check-duplicate"))
        return _depth_two(request)

    fake_openai.responder = respond
    plan = planner(fake_openai, max_depth=2).plan(GOAL, STATE)
    by_key = {leaf.key: leaf for leaf in plan.leaves}
    # "checks" waits for s1: its repeat of extract-fields is dropped, check-totals uses s1's
    assert by_key["check-totals"].inputs["invoice"][REF_KEY] == "extract-fields"
    assert "extract-fields" in plan.upstream("check-totals")
    # "more" is independent: it plans its own extract-fields, the same action on the same
    # invoice as s1's, so the two are merged and its check uses s1's
    assert sorted(by_key) == ["check-duplicate", "check-totals", "extract-fields"]
    assert by_key["check-duplicate"].inputs["invoice"][REF_KEY] == "extract-fields"
    assert "extract-fields" in plan.upstream("check-duplicate")
    assert any(
        "'s3.extract-fields'" in w and "runs it once" in w and "'extract-fields'" in w
        for w in plan.warnings
    )
    validate_plan(plan, INVOICE.catalogue())


def test_a_part_made_only_of_upstream_actions_is_merged_away(
    fake_openai: FakeOpenAIServer,
) -> None:
    def respond(request: RecordedRequest) -> str:
        if "Goal: checks" in request.user_prompt:
            return answer(action("c1", "extract-fields"))
        return answer(action("s1", "extract-fields"), subtask("s2", "checks", "again", ["s1"]))

    fake_openai.responder = respond
    plan = planner(fake_openai, max_depth=2).plan(GOAL, STATE)
    # the part is planned (an empty compound is no plan), then its repeat is merged and the
    # part, left empty, goes with it
    assert [leaf.key for leaf in plan.leaves] == ["extract-fields"]
    assert [node.key for node in plan.nodes() if not node.is_leaf] == [GOAL.name]
    validate_plan(plan, INVOICE.catalogue())


def test_an_unknown_action_gets_a_repair_request_that_names_it(
    fake_openai: FakeOpenAIServer,
) -> None:
    def respond(request: RecordedRequest) -> str:
        if is_repair(request):
            return answer(action("s1", "extract-fields"))
        return answer(action("s1", "wire-money"))

    fake_openai.responder = respond
    plan = planner(fake_openai).plan(GOAL, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["extract-fields"]
    repair = fake_openai.requests[-1].last_user_prompt
    assert "'wire-money' is not one of the available actions" in repair


# -- what the request offers -----------------------------------------------------------------------


def test_the_request_lists_the_runnable_actions_with_agent_tool_and_inputs(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal({GOAL.name: answer(action("s1", "extract-fields"))})
    planner(fake_openai).plan(GOAL, STATE)
    request = fake_openai.requests[0]
    assert (
        "- check-duplicate: Check payment history for a duplicate payment (agent "
        "payments-auditor, tool check_duplicate_payment; uses the output of extract-fields)"
    ) in request.user_prompt
    assert '"action"' in request.system_prompt
    enum = request.json_schema["properties"]["steps"]["items"]["properties"]["action"]
    assert "place-hold" in enum["anyOf"][0]["enum"]


def test_actions_of_a_disabled_agent_and_those_that_need_them_are_not_offered(
    fake_openai: FakeOpenAIServer,
) -> None:
    agents = tuple(
        replace(agent, enabled=False) if agent.slug == "erp-connector" else agent
        for agent in INVOICE.agents
    )
    decomposition = LlmDecomposition(
        make_client(fake_openai), agents, actions=INVOICE.capabilities_for
    )
    # lookup-supplier and check-po are the connector's; the report uses both, the hold the report
    assert set(decomposition.actions_for(STATE)) == {
        "extract-fields",
        "check-duplicate",
        "check-totals",
        "review-hold",
    }


def test_without_a_pack_nothing_about_actions_is_sent(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = by_goal({GOAL.name: answer(leaf("s1", "ap-reviewer", "look"))})
    planner(fake_openai, pack_actions=False).plan(GOAL, STATE)
    request = fake_openai.requests[0]
    assert "action" not in request.json_schema["properties"]["steps"]["items"]["properties"]
    assert "Available actions" not in request.user_prompt
    assert '"action"' not in request.system_prompt


def test_the_cache_key_includes_the_offered_actions(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = by_goal({GOAL.name: answer(leaf("s1", "ap-reviewer", "look"))})
    cache = InMemoryDecompositionCache()
    planner(fake_openai, cache=cache).plan(GOAL, STATE)
    planner(fake_openai, cache=cache).plan(GOAL, STATE)
    assert len(fake_openai.requests) == 1  # the same actions: a hit
    planner(fake_openai, cache=cache, pack_actions=False).plan(GOAL, STATE)
    assert len(fake_openai.requests) == 2  # no actions offered: another request
