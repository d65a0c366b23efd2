"""A one-step plan at depth 1 for a goal of several parts is flagged for the reviewer."""

from __future__ import annotations

from planning.core.llm.coverage import goal_parts
from planning.core.llm.decomposition import LlmDecomposition
from planning.core.tree import Goal
from planning.packs import PACKS
from tests.fakes import fixtures
from tests.fakes.openai_server import FakeOpenAIServer
from tests.planning.core.llm_helpers import AGENTS, answer, leaf, make_client, subtask

fake_openai = fixtures.fake_openai

TWO_ACTIONS = Goal(name="settle-invoice", description="Verify the invoice and pay the supplier")
ONE_ACTION = Goal(name="investigate-fraud", description="investigate a suspected fraud case")
SERIOUS = {"account_id": "AC-9", "amount": "50000", "prior_flags": 0}


def _llm(server: FakeOpenAIServer, max_depth: int = 1, **kwargs: object) -> LlmDecomposition:
    return LlmDecomposition(make_client(server), AGENTS, max_depth=max_depth, **kwargs)  # type: ignore[arg-type]


def test_the_parts_of_a_goal_are_its_clauses_of_two_words_or_more() -> None:
    assert goal_parts("Verify the invoice and pay the supplier") == (
        "Verify the invoice",
        "pay the supplier",
    )
    assert goal_parts("Triage the alert, then notify the on-call team; close it") == (
        "Triage the alert",
        "notify the on-call team",
        "close it",
    )
    assert goal_parts("review profit and loss") == ("review profit",)
    assert goal_parts("investigate-fraud") == ()


def test_a_one_step_plan_of_a_goal_naming_two_actions_is_flagged(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(answer(leaf("verify", task="verify the invoice")))
    plan = _llm(fake_openai).plan(TWO_ACTIONS, {})
    assert [leaf.key for leaf in plan.leaves] == ["verify"]
    (warning,) = plan.warnings
    assert warning == (
        "the plan of goal 'settle-invoice' has a single step, but the goal has several parts "
        "(its text names 2 parts: 'Verify the invoice', 'pay the supplier'): check that the "
        "step covers all of them, or plan the case again with a depth of 2 or more"
    )


def test_a_plan_of_two_steps_or_a_goal_of_one_part_is_not_flagged(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.enqueue(answer(leaf("verify"), leaf("pay")), answer(leaf("look")))
    assert _llm(fake_openai).plan(TWO_ACTIONS, {}).warnings == ()
    assert _llm(fake_openai).plan(ONE_ACTION, {}).warnings == ()


def test_a_one_step_plan_of_a_goal_the_packs_method_plans_in_several_steps_is_flagged(
    fake_openai: FakeOpenAIServer,
) -> None:
    fraud = PACKS["fraud"]
    fake_openai.enqueue(answer(leaf("look", task="look into it")))
    llm = _llm(fake_openai, examples=fraud.methods, example_task=fraud.root_task)
    plan = llm.plan(Goal(name="investigate-fraud"), SERIOUS)
    (warning,) = plan.warnings
    assert "(the pack's method 'full-investigation' plans it in 5 steps)" in warning


def test_only_a_depth_one_plan_is_checked(fake_openai: FakeOpenAIServer) -> None:
    def respond(request: object) -> str:
        prompt = request.user_prompt  # type: ignore[attr-defined]
        if "Goal: settle-invoice" in prompt:
            return answer(subtask("all", "do-it-all"))
        return answer(leaf("one"))

    fake_openai.responder = respond
    plan = _llm(fake_openai, max_depth=2).plan(TWO_ACTIONS, {})
    assert [leaf.key for leaf in plan.leaves] == ["all.one"]
    assert plan.warnings == ()
