"""Recursive LLM decomposition through the real openai client against the fake server."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest

from planning.core.errors import BudgetExceeded, LlmPlanningError
from planning.core.llm.cache import InMemoryDecompositionCache
from planning.core.llm.decomposition import (
    LlmBudgets,
    LlmDecomposition,
    NoAgentAvailable,
    expected_calls,
)
from planning.core.llm.records import LlmCallRecord
from planning.core.tree import Compound, Goal, Leaf
from tests.fakes import fixtures
from tests.fakes.openai_server import FakeOpenAIServer, FakeReply, RecordedRequest, Reply
from tests.planning.core.llm_helpers import (
    AGENTS,
    Agent,
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
    plan = planner(fake_openai).plan(FRAUD, STATE)

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


def test_max_depth_one_repairs_then_drops_subtask_entries_with_a_warning(
    fake_openai: FakeOpenAIServer,
) -> None:
    stubborn = answer(
        leaf("a"), subtask("deep", "dig-deeper"), leaf("b", "writer", depends_on=["deep"])
    )
    fake_openai.responder = lambda request: stubborn
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    # the call and one repair request: the same answer again ends the repairs
    assert len(fake_openai.requests) == 2
    assert "steps.1: is a subtask" in fake_openai.requests[1].last_user_prompt
    assert [leaf.key for leaf in plan.leaves] == ["a", "b"]
    # b depended on the dropped entry, which came after a: it now waits for a
    assert plan.dependencies["b"] == {"a"}
    (warning,) = plan.warnings
    assert "'deep' ('dig-deeper')" in warning and "max_depth=1" in warning
    assert "after 1 repair request(s) (the model repeated an earlier answer" in warning


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
    assert len(fake_openai.requests) == 3  # the root, then gather and one repair (repeated)
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
    # max_depth=1: checked against the agent-only schema that was sent (no union tag in the path)
    assert "steps.0.task: Field required" in repair.last_user_prompt


def test_repairs_exhausted_fail_without_a_plan(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue("not json", "still not json", "never json", answer(leaf("a")))
    with pytest.raises(LlmPlanningError) as excinfo:
        planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 3  # the call plus two repair requests
    message = str(excinfo.value)
    assert "investigate-fraud" in message and "depth 0" in message
    assert "2 repair" in message


def test_a_cycle_loses_the_reference_that_looks_ahead_and_keeps_both_steps(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(answer(leaf("a", depends_on=["b"]), leaf("b", depends_on=["a"])))
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 1  # nothing to repair: the reference is dropped
    assert [leaf.key for leaf in plan.leaves] == ["a", "b"]
    assert plan.dependencies["a"] == frozenset()
    assert plan.dependencies["b"] == {"a"}
    (warning,) = plan.warnings
    assert warning.startswith("step 'a' ('do a') of goal 'investigate-fraud' at depth 0:")
    assert "depends on 'b', which has not appeared earlier" in warning
    assert "dropped from depends_on" in warning


def test_a_self_dependency_is_dropped_and_a_reused_id_renamed_with_warnings(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        answer(
            leaf("a", depends_on=["a"]),
            leaf("a", task="do it again", depends_on=["a"]),
            leaf("b", depends_on=["a"]),
        )
    )
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 1
    assert [leaf.key for leaf in plan.leaves] == ["a", "a-2", "b"]
    assert plan.leaf("a-2").task == "do it again"
    # a reference to a reused id means the nearest step before it that carried the id
    assert plan.dependencies["a-2"] == {"a"}
    assert plan.dependencies["b"] == {"a-2"}
    itself, renamed = plan.warnings
    assert "step 'a' ('do a')" in itself and "cannot depend on itself" in itself
    assert "step 'a-2' ('do it again')" in renamed and "renamed 'a-2'" in renamed


def test_a_renamed_id_does_not_take_an_id_the_answer_uses_later(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(answer(leaf("a"), leaf("a"), leaf("a-2")))
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["a", "a-3", "a-2"]


def test_unknown_agents_get_repair_requests_then_are_dropped_with_a_warning(
    fake_openai: FakeOpenAIServer,
) -> None:
    stubborn = answer(leaf("a"), leaf("b", "oracle", "consult the oracle"), leaf("c", "writer"))
    fake_openai.responder = lambda request: stubborn
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 2  # the answer came back unchanged: no third call
    assert (
        "steps.1.agent: 'oracle' is not one of the available agents (analyst, investigator, "
        "writer)" in fake_openai.requests[1].last_user_prompt
    )
    assert [leaf.key for leaf in plan.leaves] == ["a", "c"]
    assert plan.dependencies["c"] == {"a"}
    (warning,) = plan.warnings
    assert "'b' ('consult the oracle')" in warning and "'oracle'" in warning


def test_disabled_agents_are_not_offered_and_are_dropped(fake_openai: FakeOpenAIServer) -> None:
    agents = (*AGENTS, Agent(slug="retired", name="Retired agent", enabled=False))
    fake_openai.responder = lambda request: answer(leaf("a"), leaf("b", "retired"))
    llm = LlmDecomposition(make_client(fake_openai), agents, max_depth=1)
    plan = llm.plan(FRAUD, STATE)
    assert "retired" not in fake_openai.requests[0].user_prompt
    assert [leaf.key for leaf in plan.leaves] == ["a"]


def test_only_unknown_agents_fail_naming_goal_and_depth(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = lambda request: answer(leaf("a", "oracle"))
    with pytest.raises(
        LlmPlanningError, match=r"no usable step for goal 'investigate-fraud' at depth 0"
    ):
        planner(fake_openai, max_depth=1).plan(FRAUD, STATE)


def test_an_empty_plan_fails_naming_goal_and_depth(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = lambda request: answer()
    with pytest.raises(LlmPlanningError) as excinfo:
        planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert "no usable step for goal 'investigate-fraud' at depth 0" in str(excinfo.value)
    assert "the answer has no steps" in str(excinfo.value)
    assert "has no steps" in fake_openai.requests[1].last_user_prompt  # it was asked again


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
    # long enough for the nine calls of the second round to overlap on a busy machine
    fake_openai.latency_s = 0.5
    fake_openai.responder = _tree_responder(3)
    plan = planner(fake_openai, max_depth=3).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == expected_calls(3, 3) == 13
    assert len(plan.leaves) == 27
    assert fake_openai.max_overlap() == 9
    assert fake_openai.sequential_rounds() == 3
    assert plan.leaf("s0.s1.l2").provenance.depth == 3


@pytest.mark.scenario("L5")
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


@pytest.mark.scenario("L5")
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


def test_the_fanout_budget_fails_cleanly_after_the_repairs_and_is_stated_in_the_prompt(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = lambda request: answer(*(leaf(f"l{i}") for i in range(5)))
    llm = planner(fake_openai, max_depth=1, budgets=LlmBudgets(max_fanout=4))
    with pytest.raises(BudgetExceeded) as excinfo:
        llm.plan(FRAUD, STATE)
    assert (excinfo.value.budget, excinfo.value.limit, excinfo.value.used) == ("fan_out", 4, 5)
    assert "At most 4 steps" in fake_openai.requests[0].system_prompt
    assert len(fake_openai.requests) == 2  # the same answer twice ends the repairs


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


# -- what still fails after the repairs is dropped (DESIGN §3) ----------------------------------


def test_one_invalid_entry_among_valid_ones_is_dropped_with_a_warning_after_the_repairs(
    fake_openai: FakeOpenAIServer,
) -> None:
    no_task = {"id": "b", "agent": "analyst", "rationale": "r", "depends_on": None}
    stubborn = answer(leaf("a"), no_task, leaf("c", "writer"))
    fake_openai.responder = lambda request: stubborn
    records: list[LlmCallRecord] = []
    plan = planner(fake_openai, max_depth=1, records=records).plan(FRAUD, STATE)

    assert len(fake_openai.requests) == 2  # the call and a repair request quoting the entry
    assert "steps.1.task: Field required" in fake_openai.requests[1].last_user_prompt
    assert [leaf.key for leaf in plan.leaves] == ["a", "c"]
    assert plan.dependencies["c"] == {"a"}  # c waited for b, which waited for a
    (warning,) = plan.warnings
    assert "dropped step 'b'" in warning and "'investigate-fraud'" in warning
    assert warning.endswith(
        "still invalid after 1 repair request(s) (the model repeated an earlier answer word "
        "for word, so the 1 repair request(s) left were not sent): task: Field required"
    )
    assert plan.leaf("a").provenance.source == "llm:2"
    assert all(r.error and "steps.1.task" in r.error for r in records)  # the trail says why


def test_the_latest_answer_with_usable_entries_is_the_one_kept(
    fake_openai: FakeOpenAIServer,
) -> None:
    no_task = {"id": "b", "agent": "analyst", "rationale": "r", "depends_on": None}
    fake_openai.enqueue(
        answer(leaf("a"), no_task),
        answer(leaf("a", "oracle"), no_task),  # worse: nothing usable
        "not json at all",
    )
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["a"]
    assert plan.leaf("a").provenance.source == "llm:1"
    assert len(plan.warnings) == 1 and "dropped step 'b'" in plan.warnings[0]


def test_an_entry_dropped_in_a_nested_answer_is_a_warning_of_the_whole_plan(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal(
        {
            "investigate-fraud": SEED_ROOT,
            "prepare-report": answer(leaf("1"), leaf("2", "oracle"), leaf("3", "writer")),
        }
    )
    plan = planner(fake_openai).plan(FRAUD, STATE)
    assert [leaf.key for leaf in plan.leaves] == [
        "review-data",
        "prepare-report.1",
        "prepare-report.3",
    ]
    (warning,) = plan.warnings
    assert "'prepare-report' at depth 1" in warning


# -- the last level is checked against what it was offered --------------------------------------


def test_an_all_subtask_answer_at_the_last_level_gets_a_repair_request(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        answer(subtask("gather"), subtask("report")), answer(leaf("gather"), leaf("report"))
    )
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["gather", "report"]
    repair = fake_openai.requests[1]
    assert repair.response_format["json_schema"]["name"] == "agent_plan"
    assert "- steps.0: is a subtask" in repair.last_user_prompt
    assert "- steps.1: is a subtask" in repair.last_user_prompt
    assert "every step must be an agent assignment" in repair.last_user_prompt
    assert plan.warnings == ()


def test_an_answer_over_the_fanout_limit_gets_a_repair_request(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        answer(*(leaf(f"l{i}") for i in range(6))), answer(*(leaf(f"l{i}") for i in range(3)))
    )
    plan = planner(fake_openai, max_depth=1, budgets=LlmBudgets(max_fanout=4)).plan(FRAUD, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["l0", "l1", "l2"]
    assert "the answer has 6 steps; at most 4 are allowed" in (
        fake_openai.requests[1].last_user_prompt
    )


def test_dropped_entries_can_bring_an_answer_within_the_fanout_limit(
    fake_openai: FakeOpenAIServer,
) -> None:
    stubborn = answer(leaf("a"), leaf("b"), leaf("c", "oracle"))
    fake_openai.responder = lambda request: stubborn
    llm = planner(fake_openai, max_depth=1, budgets=LlmBudgets(max_fanout=2))
    plan = llm.plan(FRAUD, STATE)
    assert [leaf.key for leaf in plan.leaves] == ["a", "b"]


# -- only agents that can act on a bare task are offered ----------------------------------------

TOOL_AGENT = Agent(slug="ledger-bot", name="Ledger bot", kind="tool", capabilities=("ledger",))


def test_tool_agents_are_not_offered_and_naming_one_gets_a_repair_request(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        answer(leaf("pull", "ledger-bot", "pull the ledger")),
        answer(leaf("pull", "analyst", "pull the ledger")),
    )
    llm = LlmDecomposition(make_client(fake_openai), (*AGENTS, TOOL_AGENT), max_depth=1)
    plan = llm.plan(FRAUD, STATE)
    first, repair = fake_openai.requests
    assert "ledger-bot" not in first.user_prompt
    assert "- investigator: Investigator" in first.user_prompt  # a human agent is offered
    assert "'ledger-bot' is not one of the available agents" in repair.last_user_prompt
    assert plan.leaf("pull").agent == "analyst"
    assert plan.leaf("pull").tool is None


def test_without_an_llm_or_human_agent_planning_fails_telling_the_admin_what_to_enable(
    fake_openai: FakeOpenAIServer,
) -> None:
    retired = Agent(slug="retired", name="Retired", enabled=False)
    llm = LlmDecomposition(make_client(fake_openai), (TOOL_AGENT, retired), max_depth=1)
    with pytest.raises(NoAgentAvailable) as excinfo:
        llm.plan(FRAUD, STATE)
    message = str(excinfo.value)
    assert "'investigate-fraud'" in message
    assert "'llm' or 'human'" in message and "enable" in message
    assert isinstance(excinfo.value, LlmPlanningError)
    assert fake_openai.requests == []  # nothing was asked of the model


# -- depends_on names earlier siblings only (seed 002) ------------------------------------------


def test_a_forward_reference_is_dropped_with_a_warning_and_the_step_kept(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal(
        {
            "investigate-fraud": answer(subtask("s", "gather")),
            "gather": answer(leaf("1"), leaf("2", depends_on=["3"]), leaf("3", depends_on=["1"])),
        }
    )
    plan = planner(fake_openai).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 2  # no repair request for a reference
    assert [leaf.key for leaf in plan.leaves] == ["s.1", "s.2", "s.3"]
    assert plan.dependencies["s.2"] == {"s.1"}  # it named nothing earlier: after the previous
    assert plan.dependencies["s.3"] == {"s.1"}
    (warning,) = plan.warnings
    assert "step '2' ('do 2') of goal 'gather' at depth 1" in warning
    assert "depends on '3', which has not appeared earlier" in warning
    assert warning.endswith("it now runs after the previous step")


def test_a_reference_to_no_step_at_all_is_dropped_and_the_good_ones_kept(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        answer(leaf("a"), leaf("b", depends_on=[]), leaf("c", depends_on=["ghost", "b"]))
    )
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 1
    assert plan.dependencies["c"] == {"b"}
    (warning,) = plan.warnings
    assert "depends on 'ghost', which is not the id of any step" in warning


def test_an_answer_of_invented_references_and_one_reused_id_keeps_every_step(
    fake_openai: FakeOpenAIServer,
) -> None:
    # what a very small model answers: the format's example id for every step, made-up ids
    fake_openai.enqueue(
        answer(
            leaf("review-data", task="review the ledger", depends_on=["step-0"]),
            leaf("review-data", task="interview the vendor", depends_on=["step-1"]),
            leaf("review-data", "writer", task="write the report", depends_on=["step-2"]),
        )
    )
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 1
    assert [leaf.key for leaf in plan.leaves] == ["review-data", "review-data-2", "review-data-3"]
    assert plan.dependencies["review-data-2"] == {"review-data"}
    assert plan.dependencies["review-data-3"] == {"review-data-2"}
    assert len(plan.warnings) == 5  # three dropped references, two renamed ids


def test_a_repair_sent_for_another_problem_also_quotes_the_references_to_fix(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(
        answer(leaf("a", depends_on=["ghost"]), leaf("b", "oracle")),
        answer(leaf("a"), leaf("b")),
    )
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    repair = fake_openai.requests[1].last_user_prompt
    assert "steps.1.agent: 'oracle' is not one of the available agents" in repair
    assert (
        "steps.0.depends_on: step 'a' depends on 'ghost', which is not the id of any step "
        "(dropped from depends_on)" in repair
    )
    assert plan.warnings == ()  # the repaired answer had nothing left to fix


# -- concurrency is the client's setting --------------------------------------------------------


def test_a_last_level_of_sixty_four_calls_runs_in_one_latency(
    fake_openai: FakeOpenAIServer,
) -> None:
    # in one process with the fake server, 64 sends take a few hundred ms, and nearly a second
    # on a machine busy with a parallel test run (CI saw 46 in flight at 0.6 s): the latency must
    # exceed that for all 64 to be seen in flight together
    fake_openai.latency_s = 2.5
    fake_openai.responder = _tree_responder(8)
    llm = LlmDecomposition(
        make_client(fake_openai, max_concurrency=64),
        AGENTS,
        max_depth=3,
        budgets=LlmBudgets(max_calls=100, max_leaves=1000, max_fanout=8),
    )
    plan = llm.plan(FRAUD, STATE)
    assert len(fake_openai.requests) == expected_calls(8, 3) == 73
    assert len(plan.leaves) == 512
    assert fake_openai.max_overlap() == 64
    assert fake_openai.sequential_rounds() == 3


def test_a_lower_concurrency_setting_caps_the_calls_in_flight(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.latency_s = 0.1
    fake_openai.responder = _tree_responder(3)
    llm = LlmDecomposition(make_client(fake_openai, max_concurrency=2), AGENTS, max_depth=2)
    llm.plan(FRAUD, STATE)
    assert fake_openai.max_overlap() == 2
    assert fake_openai.sequential_rounds() == 3  # the root, then three calls two at a time


# -- a planner agent's own system prompt --------------------------------------------------------


def test_a_planner_agents_instructions_open_the_system_prompt_and_the_format_stays(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal({"investigate-fraud": SEED_ROOT, "prepare-report": SEED_REPORT})
    instructions = "You are the fraud desk's senior planner. Prefer interviews over reports."
    planner(fake_openai, instructions=instructions).plan(FRAUD, STATE)
    for request in fake_openai.requests:
        assert request.system_prompt.startswith(instructions)
        assert "planning component of CaseHub" not in request.system_prompt
        assert 'Answer with JSON only: an object {"steps": [...]}' in request.system_prompt
        assert "Do not decide which steps need human approval" in request.system_prompt
    nested, last = sorted(fake_openai.requests, key=lambda r: r.started_at)
    assert "subtask" in nested.system_prompt
    assert "subtask" not in last.system_prompt.lower()


# -- repair requests move on, and a repeated answer ends them -----------------------------------


def test_repair_requests_quote_the_problems_and_change_between_rounds(
    fake_openai: FakeOpenAIServer,
) -> None:
    no_task = {"id": "b", "agent": "analyst", "rationale": "r", "depends_on": None}
    fake_openai.enqueue(
        answer(leaf("a"), leaf("b", "oracle")),
        answer(leaf("a", "oracle"), leaf("b", "oracle")),  # different, same kind of problem
        answer(leaf("a"), no_task),
    )
    plan = planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    first, second = (r.last_user_prompt for r in fake_openai.requests[1:])
    assert first.startswith("Your previous answer could not be used (repair request 1 of 2):")
    assert "- steps.1.agent: 'oracle' is not one of the available agents" in first
    assert "last request" not in first
    assert second.startswith("Your answer still could not be used (repair request 2 of 2):")
    assert "- steps.0.agent: 'oracle' is not one of the available agents" in second
    assert "last request: steps that are still wrong are left out" in second
    assert "same problems" not in second  # the problems changed
    assert [leaf.key for leaf in plan.leaves] == ["a"]


def test_a_second_round_with_the_same_problems_says_so(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.enqueue(
        answer(leaf("a", "oracle")),
        answer(leaf("a", "oracle", task="ask the oracle")),  # another text, the same problem
        answer(leaf("a")),
    )
    planner(fake_openai, max_depth=1, max_repairs=3).plan(FRAUD, STATE)
    first, second = (r.last_user_prompt for r in fake_openai.requests[1:])
    assert "same problems" not in first
    assert "repair request 2 of 3" in second
    assert "These are the same problems as in your previous answer" in second
    assert "last request" not in second


def test_the_same_answer_twice_ends_the_repairs_with_a_clear_reason(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = lambda request: answer(leaf("a", "oracle"))
    llm = planner(fake_openai, max_depth=1, max_repairs=4)
    with pytest.raises(LlmPlanningError) as excinfo:
        llm.plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 2  # not the five calls four repairs would spend
    message = str(excinfo.value)
    assert message.startswith(
        "the LLM returned no usable step for goal 'investigate-fraud' at depth 0 after 1 repair "
        "request(s) (the model repeated an earlier answer word for word, so the 3 repair "
        "request(s) left were not sent):"
    )
    assert "'oracle' is not one of the available agents" in message


def test_a_repeat_is_the_same_json_whatever_its_spacing_or_fence(
    fake_openai: FakeOpenAIServer,
) -> None:
    bad = {"steps": [leaf("a", "oracle")]}
    fake_openai.enqueue(
        json.dumps(bad),
        "```json\n" + json.dumps(bad, indent=2) + "\n```",
        answer(leaf("a")),
    )
    with pytest.raises(LlmPlanningError, match="repeated an earlier answer"):
        planner(fake_openai, max_depth=1).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 2


def test_an_earlier_answer_coming_back_later_also_ends_the_repairs(
    fake_openai: FakeOpenAIServer,
) -> None:
    first = answer(leaf("a", "oracle"))
    fake_openai.enqueue(first, "not json", first, answer(leaf("a")))
    with pytest.raises(LlmPlanningError, match="after 2 repair request"):
        planner(fake_openai, max_depth=1, max_repairs=4).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 3


def test_an_answer_from_the_cache_carries_the_warnings_of_its_fixed_references(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = lambda request: answer(leaf("a"), leaf("b", depends_on=["ghost"]))
    cache = InMemoryDecompositionCache()
    first = planner(fake_openai, max_depth=1, cache=cache).plan(FRAUD, STATE)
    second = planner(fake_openai, max_depth=1, cache=cache).plan(FRAUD, STATE)
    assert len(fake_openai.requests) == 1
    assert second.warnings == first.warnings and len(first.warnings) == 1
    assert second.dependencies == first.dependencies
