"""Each request tells the model the plan's size budget, and a part only its own share of it."""

from __future__ import annotations

from planning.core.llm.decomposition import LlmDecomposition
from planning.core.llm.expansion import ExpansionJob, LlmBudgets, share_leaves
from planning.core.tree import Goal, Leaf, Provenance
from planning.packs import PACKS
from tests.fakes import fixtures
from tests.fakes.openai_server import FakeOpenAIServer, RecordedRequest
from tests.planning.core.llm_helpers import (
    AGENTS,
    answer,
    by_goal,
    goal_of,
    leaf,
    make_client,
    subtask,
)

fake_openai = fixtures.fake_openai

PROVENANCE = Provenance(strategy="llm", source="llm:1", depth=1)


def _job(key: str) -> ExpansionJob:
    return ExpansionJob(key=key, goal=Goal(name=key), depth=1)


def test_the_leaves_already_placed_come_off_the_budget_and_the_rest_is_shared() -> None:
    first = Leaf(key="a", agent="analyst", task="t", provenance=PROVENANCE)
    children = share_leaves(20, (first, _job("b"), _job("c")))
    assert children[0] is first
    assert [c.max_leaves for c in children[1:] if isinstance(c, ExpansionJob)] == [9, 9]
    tight = share_leaves(2, (first, _job("b"), _job("c")))
    assert [c.max_leaves for c in tight[1:] if isinstance(c, ExpansionJob)] == [1, 1]


def _plan(server: FakeOpenAIServer, budgets: LlmBudgets) -> dict[str, RecordedRequest]:
    server.responder = by_goal(
        {
            "investigate": answer(leaf("a"), subtask("r", "report", "write it up", ["a"])),
            "report": answer(leaf("x"), leaf("y", "writer")),
        }
    )
    LlmDecomposition(make_client(server), AGENTS, max_depth=2, budgets=budgets).plan(
        Goal(name="investigate"), {}
    )
    return {goal_of(r): r for r in server.requests}


def test_the_root_request_names_the_whole_budget_and_a_part_its_share(
    fake_openai: FakeOpenAIServer,
) -> None:
    requests = _plan(fake_openai, LlmBudgets(max_leaves=40, max_fanout=6))
    root, part = requests["investigate"], requests["report"]
    assert "the whole plan may have at most 40 steps" in root.user_prompt
    # 40 less the one leaf the root placed, for the one part
    assert "this part may add at most 39 steps" in part.user_prompt
    assert "Plan only this part of the parent goal" in part.user_prompt
    assert "Plan only this part" not in root.user_prompt
    # the part's request is at the last level: nothing there mentions subtasks
    assert "subtask" not in part.user_prompt.lower()
    assert "small" not in root.user_prompt


def test_a_small_budget_asks_for_fewer_coarser_subtasks_and_caps_the_steps(
    fake_openai: FakeOpenAIServer,
) -> None:
    requests = _plan(fake_openai, LlmBudgets(max_leaves=10, max_fanout=6))
    root, part = requests["investigate"], requests["report"]
    # a full fan-out of 6 subtasks of 6 steps each would need 36 leaves: 10 gives one subtask
    assert "use at most 1 subtask(s), each a coarse part" in root.user_prompt
    assert "At most 6 steps" in root.system_prompt
    # the part may add 9 leaves, more than the fan-out: its answer is held to the fan-out
    assert part.json_schema["properties"]["steps"]["maxItems"] == 6


def test_a_part_whose_share_is_below_the_fan_out_is_held_to_its_share(
    fake_openai: FakeOpenAIServer,
) -> None:
    requests = _plan(fake_openai, LlmBudgets(max_leaves=4, max_fanout=6))
    part = requests["report"]
    assert "this part may add at most 3 steps" in part.user_prompt
    assert "At most 3 steps" in part.system_prompt
    assert part.json_schema["properties"]["steps"]["maxItems"] == 3


def test_a_part_the_model_made_is_not_shown_the_whole_cases_method(
    fake_openai: FakeOpenAIServer,
) -> None:
    fraud = PACKS["fraud"]
    fake_openai.responder = by_goal(
        {
            "investigate-fraud": answer(leaf("a"), subtask("r", "gather-evidence", "d", ["a"])),
            "gather-evidence": answer(leaf("x")),
        }
    )
    LlmDecomposition(
        make_client(fake_openai),
        AGENTS,
        max_depth=2,
        examples=fraud.methods,
        example_task=fraud.root_task,
    ).plan(Goal(name="investigate-fraud"), {"account_id": "ACC-1", "flags": 3})
    requests = {goal_of(r): r for r in fake_openai.requests}
    assert "Example: " in requests["investigate-fraud"].user_prompt
    # no method plans "gather-evidence": the root task's whole method would be copied into it
    assert "Example: " not in requests["gather-evidence"].user_prompt
