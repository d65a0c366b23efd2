"""Recursive LLM decomposition through the real openai client against the fake server."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

from planning.core.errors import BudgetExceeded, LlmPlanningError
from planning.core.llm.cache import InMemoryDecompositionCache
from planning.core.llm.client import LlmCallRecord
from planning.core.llm.decomposition import LlmBudgets, LlmDecomposition, expected_calls
from planning.core.tree import Compound, Goal, Leaf
from tests.fakes import fixtures
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply, RecordedRequest, Reply
from tests.planning.core.llm_helpers import (
    AGENTS,
    answer,
    by_goal,
    goal_of,
    is_repair,
    leaf,
    make_client,
    subtask,
)

fake_openai = fixtures.fake_openai

FRAUD = Goal(name="investigate-fraud", description="investigate a suspected fraud case")
STATE = {"case": {"id": "C-17", "amount": 125000, "flags": ["duplicate-vendor"]}}


def planner(server: FakeOpenAIServer, *, max_depth: int = 2, **kwargs: object) -> LlmDecomposition:
    records = kwargs.pop("records", None)
    return LlmDecomposition(
        make_client(server, records),  # type: ignore[arg-type]
        AGENTS,
        max_depth=max_depth,
        **kwargs,  # type: ignore[arg-type]
    )


SEED_ROOT = answer(
    leaf("review-data", "analyst", "review the data"),
    subtask("prepare-report", "prepare-report", "compile findings into a structured report"),
)
SEED_REPORT = answer(
    leaf("1", "analyst", "summarise the anomalies"),
    leaf("2", "writer", "write the structured report"),
)


def test_expected_calls_is_the_geometric_sum() -> None:
    assert expected_calls(5, 1) == 1
    assert expected_calls(5, 2) == 6
    assert expected_calls(5, 3) == 31
    assert expected_calls(5, 4) == 156
    with pytest.raises(ValueError):
        expected_calls(0, 2)


def test_seed_example_at_depth_two_makes_one_call_per_compound(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal({"investigate-fraud": SEED_ROOT, "prepare-report": SEED_REPORT})
    llm = planner(fake_openai)
    assert llm.expected_calls(branching=1) == 2

    plan = llm.plan(FRAUD, STATE)

    assert len(fake_openai.requests) == 2  # the root plus the one compound
    assert plan.llm_calls == 2
    assert [leaf.key for leaf in plan.leaves] == [
        "review-data",
        "prepare-report.1",
        "prepare-report.2",
    ]
    assert plan.dependencies["review-data"] == frozenset()
    # the compound's entry leaf inherits the compound's implicit "after the previous sibling"
    assert plan.dependencies["prepare-report.1"] == {"review-data"}
    assert plan.dependencies["prepare-report.2"] == {"prepare-report.1"}
    report = plan.node("prepare-report")
    assert isinstance(report, Compound)
    assert report.name == "prepare-report"
    assert report.description == "compile findings into a structured report"
    assert plan.parent_of("prepare-report.2") == report
    assert plan.warnings == ()


def test_order_is_preserved_across_the_recursion_boundary(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = by_goal(
        {
            "investigate-fraud": answer(
                leaf("a"), subtask("b", "gather-evidence"), leaf("c", "writer")
            ),
            "gather-evidence": answer(leaf("x"), leaf("y", "investigator", depends_on=[])),
        }
    )
    plan = planner(fake_openai).plan(FRAUD, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["a", "b.x", "b.y", "c"]
    assert plan.topological_order().index("c") > plan.topological_order().index("b.x")
    # both b.x (after a, via the compound) and b.y (independent inside b, so an entry leaf)
    # wait for a; c waits for b's exit leaves
    assert plan.dependencies["b.x"] == {"a"}
    assert plan.dependencies["b.y"] == {"a"}
    assert plan.dependencies["c"] == {"b.x", "b.y"}


def test_provenance_names_strategy_call_and_depth(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = by_goal({"investigate-fraud": SEED_ROOT, "prepare-report": SEED_REPORT})
    plan = planner(fake_openai).plan(FRAUD, STATE)
    root_leaf = plan.leaf("review-data")
    nested_leaf = plan.leaf("prepare-report.1")
    assert root_leaf.provenance.strategy == "llm"
    assert root_leaf.provenance.source == "llm:1"
    assert root_leaf.provenance.depth == 1
    assert nested_leaf.provenance.source == "llm:2"
    assert nested_leaf.provenance.depth == 2
    for node in plan.nodes():
        assert node.provenance.strategy == "llm"
        assert node.provenance.source.startswith("llm:")
    assert plan.root.provenance.depth == 0


def test_last_level_prompt_and_schema_offer_agent_entries_only(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal({"investigate-fraud": SEED_ROOT, "prepare-report": SEED_REPORT})
    planner(fake_openai).plan(FRAUD, STATE)
    first, last = sorted(fake_openai.requests, key=lambda r: r.started_at)
    assert goal_of(last) == "prepare-report"
    assert "subtask" in first.system_prompt
    assert "subtask" in json.dumps(first.json_schema)
    assert "subtask" not in last.system_prompt.lower()
    assert "subtask" not in json.dumps(last.json_schema).lower()
    assert "subtask" not in last.user_prompt.lower()
    assert last.response_format["json_schema"]["name"] == "agent_plan"
    assert first.response_format["json_schema"]["name"] == "nested_plan"


def test_max_depth_one_offers_no_subtasks_at_the_root(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(answer(leaf("a")))
    planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    (request,) = fake_openai.requests
    assert "subtask" not in request.system_prompt.lower()
    assert "subtask" not in json.dumps(request.json_schema).lower()


def test_recursive_prompt_carries_parent_siblings_goal_agents_and_state(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal({"investigate-fraud": SEED_ROOT, "prepare-report": SEED_REPORT})
    planner(fake_openai).plan(FRAUD, STATE)
    nested = next(r for r in fake_openai.requests if goal_of(r) == "prepare-report")
    prompt = nested.user_prompt
    assert "Parent goal: investigate-fraud" in prompt
    assert "Sibling tasks: review the data" in prompt
    assert "Goal: prepare-report" in prompt
    assert "Description: compile findings into a structured report" in prompt
    for agent in AGENTS:
        assert f"- {agent.slug}: {agent.name}" in prompt
    assert "domain expert for financial records" in prompt
    assert "capabilities: review, analyse" in prompt
    assert '"duplicate-vendor"' in prompt and "125000" in prompt
    root = next(r for r in fake_openai.requests if goal_of(r) == "investigate-fraud")
    assert "Description: investigate a suspected fraud case" in root.user_prompt
    assert "Parent goal: (none" in root.user_prompt


def test_max_depth_one_drops_subtask_entries_with_a_warning(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        answer(leaf("a"), subtask("deep", "dig-deeper"), leaf("b", "writer", depends_on=["deep"]))
    )
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 1
    assert [leaf.key for leaf in plan.leaves] == ["a", "b"]
    # b depended on the dropped entry, which came after a: it now waits for a
    assert plan.dependencies["b"] == {"a"}
    (warning,) = plan.warnings
    assert "deep" in warning and "max_depth=1" in warning


def test_entries_past_the_ceiling_are_dropped_at_the_last_level_of_a_deeper_plan(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal(
        {
            "investigate-fraud": answer(subtask("s", "gather")),
            "gather": answer(leaf("a"), subtask("t", "too-deep")),
        }
    )
    plan = planner(fake_openai, max_depth=2).plan(FRAUD, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["s.a"]
    assert len(fake_openai.requests) == 2
    assert any("too-deep" in w for w in plan.warnings)


def test_code_fenced_json_is_accepted(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue("```json\n" + answer(leaf("a"), leaf("b")) + "\n```")
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["a", "b"]
    assert len(fake_openai.requests) == 1


def test_malformed_json_gets_a_repair_request_quoting_the_error(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue('{"steps": [ {"id": "a", ', answer(leaf("a")))
    records: list[LlmCallRecord] = []
    plan = planner(fake_openai, max_depth=1, records=records).plan(FRAUD, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["a"]
    first, repair = fake_openai.requests
    assert not is_repair(first)
    assert is_repair(repair)
    assert "not valid JSON" in repair.last_user_prompt
    assert repair.messages[-2] == {"role": "assistant", "content": '{"steps": [ {"id": "a", '}
    assert plan.llm_calls == 2
    assert plan.leaf("a").provenance.source == "llm:2"
    assert [r.error is not None for r in records] == [True, False]


def test_a_repair_round_that_succeeds_quotes_the_validation_error(
    fake_openai: FakeOpenAIServer,
) -> None:
    missing_task = {"id": "a", "agent": "analyst", "rationale": "r", "depends_on": None}
    fake_openai.enqueue(answer(missing_task), answer(leaf("a", task="check the ledger")))
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert plan.leaf("a").task == "check the ledger"
    repair = fake_openai.requests[1]
    assert "steps.0.agent.task: Field required" in repair.last_user_prompt


def test_repairs_exhausted_fail_without_a_plan(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue("not json", "still not json", "never json", answer(leaf("a")))
    with pytest.raises(LlmPlanningError) as excinfo:
        planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 3  # the call plus two repair requests
    message = str(excinfo.value)
    assert "investigate-fraud" in message and "depth 0" in message
    assert "2 repair" in message


def test_a_cycle_is_sent_back_for_repair(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(
        answer(leaf("a", depends_on=["b"]), leaf("b", depends_on=["a"])),
        answer(leaf("a"), leaf("b", depends_on=["a"])),
    )
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert plan.dependencies["b"] == {"a"}
    assert "not an earlier step" in fake_openai.requests[1].last_user_prompt


def test_a_persistent_cycle_fails_cleanly(fake_openai: FakeOpenAIServer) -> None:
    cyclic = answer(leaf("a", depends_on=["b"]), leaf("b", depends_on=["a"]))
    fake_openai.responder = lambda request: cyclic
    with pytest.raises(LlmPlanningError, match="not an earlier step"):
        planner(fake_openai, max_depth=1).plan(FRAUD, STATE)


def test_self_dependency_and_duplicate_ids_are_repaired(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(
        answer(leaf("a", depends_on=["a"]), leaf("a")),
        answer(leaf("a"), leaf("b")),
    )
    planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    error = fake_openai.requests[1].last_user_prompt
    assert "cannot depend on itself" in error
    assert "used twice" in error


def test_unknown_agents_are_dropped_with_a_warning(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(
        answer(leaf("a"), leaf("b", "oracle", "consult the oracle"), leaf("c", "writer"))
    )
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["a", "c"]
    assert plan.dependencies["c"] == {"a"}
    (warning,) = plan.warnings
    assert "oracle" in warning and "'b'" in warning


def test_disabled_agents_are_not_offered_and_are_dropped(fake_openai: FakeOpenAIServer) -> None:
    from tests.planning.core.llm_helpers import Agent

    agents = (*AGENTS, Agent(slug="retired", name="Retired agent", enabled=False))
    fake_openai.enqueue(answer(leaf("a"), leaf("b", "retired")))
    llm = LlmDecomposition(make_client(fake_openai), agents, max_depth=1)
    plan = llm.plan(FRAUD, STATE)
    assert "retired" not in fake_openai.requests[0].user_prompt
    assert [leaf.key for leaf in plan.leaves] == ["a"]


def test_only_unknown_agents_fail_naming_goal_and_depth(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(answer(leaf("a", "oracle")))
    with pytest.raises(LlmPlanningError, match=r"no usable step for goal 'investigate-fraud'"):
        planner(fake_openai, max_depth=1).plan(FRAUD, STATE)


def test_an_empty_plan_fails_naming_goal_and_depth(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(answer())
    with pytest.raises(
        LlmPlanningError, match=r"empty plan for goal 'investigate-fraud' at depth 0"
    ):
        planner(fake_openai, max_depth=1).plan(FRAUD, STATE)


def test_an_empty_nested_plan_fails_the_whole_plan(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = by_goal({"investigate-fraud": SEED_ROOT, "prepare-report": answer()})
    with pytest.raises(LlmPlanningError, match=r"'prepare-report' at depth 1"):
        planner(fake_openai).plan(FRAUD, STATE)


def test_a_transport_failure_fails_planning_naming_the_goal(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = by_goal(
        {"investigate-fraud": SEED_ROOT, "prepare-report": FakeReply(status=400)}
    )
    with pytest.raises(LlmPlanningError, match=r"planning goal 'prepare-report' at depth 1"):
        planner(fake_openai).plan(FRAUD, STATE)


def test_every_call_is_reported_to_the_hook(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = by_goal({"investigate-fraud": SEED_ROOT, "prepare-report": SEED_REPORT})
    records: list[LlmCallRecord] = []
    planner(fake_openai, records=records).plan(FRAUD, STATE)
    assert sorted(r.call_id for r in records) == ["llm:1", "llm:2"]
    assert all(r.prompt_tokens > 0 and r.completion_tokens > 0 for r in records)
    assert {r.schema_name for r in records} == {"nested_plan", "agent_plan"}


def _tree_responder(branching: int) -> Callable[[RecordedRequest], Reply]:
    """Answer every goal with `branching` nested entries, or agent entries at the last level."""

    def respond(request: RecordedRequest) -> Reply:
        goal = goal_of(request)
        if "subtask" in request.system_prompt:
            return answer(*(subtask(f"s{i}", f"{goal}/s{i}") for i in range(branching)))
        return answer(*(leaf(f"l{i}", depends_on=[]) for i in range(branching)))

    return respond


def test_sibling_compounds_are_expanded_concurrently(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.latency_s = 0.2
    fake_openai.responder = _tree_responder(3)
    plan = planner(fake_openai, max_depth=2).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 1 + 3
    assert len(plan.leaves) == 9
    # the three nested calls were all in flight together: two call latencies end to end
    assert fake_openai.max_overlap() == 3
    assert fake_openai.sequential_rounds() == 2


def test_depth_three_runs_in_three_rounds(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.latency_s = 0.1
    fake_openai.responder = _tree_responder(3)
    plan = planner(fake_openai, max_depth=3).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == expected_calls(3, 3) == 13
    assert len(plan.leaves) == 27
    assert fake_openai.max_overlap() == 9
    assert fake_openai.sequential_rounds() == 3
    assert plan.leaf("s0.s1.l2").provenance.depth == 3


def test_the_call_budget_fails_cleanly_and_cancels_outstanding_work(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = _tree_responder(3)
    llm = planner(fake_openai, max_depth=3, budgets=LlmBudgets(max_calls=5))
    with pytest.raises(BudgetExceeded) as excinfo:
        llm.plan(FRAUD, STATE)
    assert excinfo.value.budget == "llm_calls"
    assert excinfo.value.limit == 5
    assert len(fake_openai.requests) <= 5
    # the pool was shut down: no planning worker is left behind
    assert not [t for t in threading.enumerate() if t.name.startswith("casehub-plan")]


def test_the_token_budget_fails_cleanly(fake_openai: FakeOpenAIServer) -> None:
    def respond(request: RecordedRequest) -> Reply:
        steps = [subtask("s"), subtask("t")] if goal_of(request) == FRAUD.name else [leaf("a")]
        return FakeReply(content=answer(*steps), prompt_tokens=400, completion_tokens=100)

    fake_openai.responder = respond
    llm = planner(fake_openai, max_depth=2, budgets=LlmBudgets(max_tokens=1200))
    with pytest.raises(BudgetExceeded) as excinfo:
        llm.plan(FRAUD, STATE)
    assert excinfo.value.budget == "llm_tokens"
    assert excinfo.value.used > 1200


def test_the_leaf_budget_fails_cleanly(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = _tree_responder(3)
    llm = planner(fake_openai, max_depth=2, budgets=LlmBudgets(max_leaves=7))
    with pytest.raises(BudgetExceeded) as excinfo:
        llm.plan(FRAUD, STATE)
    assert excinfo.value.budget == "leaves"


def test_the_fanout_budget_fails_cleanly_and_is_stated_in_the_prompt(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(answer(*(leaf(f"l{i}") for i in range(5))))
    llm = planner(fake_openai, max_depth=1, budgets=LlmBudgets(max_fanout=4))
    with pytest.raises(BudgetExceeded) as excinfo:
        llm.plan(FRAUD, STATE)
    assert (excinfo.value.budget, excinfo.value.limit, excinfo.value.used) == ("fan_out", 4, 5)
    assert "At most 4 steps" in fake_openai.requests[0].system_prompt


def test_a_repeated_goal_is_answered_from_the_cache(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = by_goal({"investigate-fraud": SEED_ROOT, "prepare-report": SEED_REPORT})
    cache = InMemoryDecompositionCache()
    first = planner(fake_openai, cache=cache).plan(FRAUD, STATE)
    calls_before = len(fake_openai.requests)
    second = planner(fake_openai, cache=cache).plan(FRAUD, STATE)
    assert calls_before == 2
    assert len(fake_openai.requests) == calls_before  # zero calls for the repeated goal
    assert second.llm_calls == 0
    assert [leaf.key for leaf in second.leaves] == [leaf.key for leaf in first.leaves]
    assert second.dependencies == first.dependencies
    assert all(leaf.provenance.source.startswith("llm:cache:") for leaf in second.leaves)


def test_the_cache_misses_when_the_state_changes(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = by_goal({"investigate-fraud": answer(leaf("a"))})
    cache = InMemoryDecompositionCache()
    planner(fake_openai, max_depth=1, cache=cache).plan(FRAUD, STATE)
    planner(fake_openai, max_depth=1, cache=cache).plan(FRAUD, {"case": {"id": "C-18"}})
    assert len(fake_openai.requests) == 2


def test_a_repaired_answer_is_cached_under_the_original_request(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue("oops", answer(leaf("a")))
    cache = InMemoryDecompositionCache()
    planner(fake_openai, max_depth=1, cache=cache).plan(FRAUD, STATE)
    plan = planner(fake_openai, max_depth=1, cache=cache).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 2
    assert [leaf.key for leaf in plan.leaves] == ["a"]


def test_leaves_are_plain_agent_assignments(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(answer(leaf("a", "investigator", "interview the vendor")))
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    (only,) = plan.leaves
    assert isinstance(only, Leaf)
    assert (only.agent, only.task, only.rationale) == (
        "investigator",
        "interview the vendor",
        "investigator is suited",
    )
    assert only.tool is None


def test_max_depth_below_one_is_refused(fake_openai: FakeOpenAIServer) -> None:
    with pytest.raises(ValueError, match="max_depth"):
        planner(fake_openai, max_depth=0)
