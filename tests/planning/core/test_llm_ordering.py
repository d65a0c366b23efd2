"""Two pack actions the model left independent are ordered as the pack orders them."""

from __future__ import annotations

from typing import Any

from planning.core.dag import DagPlan
from planning.core.goal import Capability
from planning.core.llm.decomposition import LlmDecomposition
from planning.core.llm.ordering import fill_preconditions, order_pack_actions
from planning.core.tree import Compound, Leaf, Provenance
from planning.core.validation import validate_plan
from planning.packs import PACKS
from tests.fakes import fixtures
from tests.fakes.openai_server import FakeOpenAIServer
from tests.planning.core.llm_helpers import answer, by_goal, leaf, make_client

fake_openai = fixtures.fake_openai

FRAUD = PACKS["fraud"]
STATE = FRAUD.initial_state({"account_id": "ACC-300", "amount": "12500"})
GOAL = FRAUD.goal("Large transfer flagged on ACC-300")

LLM = Provenance(strategy="llm", source="llm:1", depth=1)
STATIC = Provenance(strategy="hybrid", source="static:m", depth=1)


def action(step_id: str, name: str, depends_on: list[str] | None = None) -> dict[str, Any]:
    return {**leaf(step_id, "fraud-analyst", f"run {name}", depends_on), "action": name}


def planner(server: FakeOpenAIServer) -> LlmDecomposition:
    return LlmDecomposition(
        make_client(server), FRAUD.agents, max_depth=1, actions=FRAUD.capabilities_for
    )


def test_a_freeze_planned_beside_its_legal_review_waits_for_it(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal(
        {
            GOAL.name: answer(
                action("a", "draft-findings", []),
                action("b", "legal-review", []),
                action("c", "freeze-account", []),
            )
        }
    )
    plan = planner(fake_openai).plan(GOAL, STATE)
    assert "legal-review" in plan.upstream("freeze-account")
    assert "draft-findings" in plan.upstream("legal-review")
    assert any(
        "'freeze-account'" in w and "findings_reviewed" in w and "now waits for 'legal-review'" in w
        for w in plan.warnings
    )
    validate_plan(plan, FRAUD.catalogue())


def test_an_order_the_model_gave_is_kept_without_a_warning(fake_openai: FakeOpenAIServer) -> None:
    fake_openai.responder = by_goal(
        {GOAL.name: answer(action("b", "legal-review", []), action("c", "freeze-account", ["b"]))}
    )
    plan = planner(fake_openai).plan(GOAL, STATE)
    assert plan.dependencies["freeze-account"] == frozenset({"legal-review"})
    assert not any("now waits for" in w for w in plan.warnings)


def test_a_pair_planned_the_other_way_round_is_left_with_a_warning() -> None:
    def step(key: str, depends_on: tuple[str, ...] | None, source: Provenance = LLM) -> Leaf:
        return Leaf(
            key=key, agent="bot", task=f"do {key}", depends_on=depends_on, provenance=source
        )

    made = Capability(name="make", agent="bot", task="do make", outputs=frozenset({"x"}))
    used = Capability(
        name="use", agent="bot", task="do use", inputs=frozenset({"x"}), outputs=frozenset({"y"})
    )
    backwards = Compound(
        key="g", name="g", provenance=LLM, children=(step("use", ()), step("make", ("use",)))
    )
    tree, warnings = order_pack_actions(backwards, (made, used))
    assert tree == backwards
    assert len(warnings) == 1 and "check the order" in warnings[0]
    # two statically planned leaves keep their method's order (here: none)
    static = Compound(
        key="g",
        name="g",
        provenance=STATIC,
        children=(step("make", (), STATIC), step("use", (), STATIC)),
    )
    assert order_pack_actions(static, (made, used)) == (static, ())
    # one of them the model's: the consumer waits for the producer
    mixed = Compound(
        key="g", name="g", provenance=LLM, children=(step("make", (), STATIC), step("use", ()))
    )
    ordered, notes = order_pack_actions(mixed, (made, used))
    assert ordered.children[1].depends_on == ("make",)
    assert len(notes) == 1


# -- what an action needs ------------------------------------------------------------------------


def test_a_freeze_planned_alone_gets_what_the_pack_says_it_needs_first(
    fake_openai: FakeOpenAIServer,
) -> None:
    fake_openai.responder = by_goal({GOAL.name: answer(action("a", "freeze-account", []))})
    plan = planner(fake_openai).plan(GOAL, STATE)
    keys = [leaf.key for leaf in plan.leaves]
    assert keys[-1] == "freeze-account"
    assert set(keys) == {
        "pull-transactions",
        "detect-anomalies",
        "screen-sanctions",
        "interview-customer",
        "draft-findings",
        "legal-review",
        "freeze-account",
    }
    upstream = plan.upstream("freeze-account")
    assert upstream == set(keys) - {"freeze-account"}
    assert "legal-review" in plan.dependencies["freeze-account"]
    assert "pull-transactions" in plan.upstream("interview-customer")
    assert any("needs findings_reviewed" in w and "'legal-review'" in w for w in plan.warnings)
    validate_plan(plan, FRAUD.catalogue())


def _capability(name: str, *, needs: str = "", makes: str, **more: Any) -> Capability:
    return Capability(
        name=name,
        agent="bot",
        task=f"do {name}",
        inputs=frozenset({needs} if needs else ()),
        outputs=frozenset({makes}),
        **more,
    )


def _alone(name: str, provenance: Provenance = LLM) -> Compound:
    only = Leaf(key=name, agent="bot", task=f"do {name}", provenance=provenance)
    return Compound(key="g", name="g", provenance=provenance, children=(only,))


def test_what_a_consequential_action_needs_comes_from_the_cheapest_safe_producer() -> None:
    act = _capability("act", needs="x", makes="y", risk="financial")
    risky = _capability("risky", makes="x", risk="destructive", cost=1.0)
    safe = _capability("safe", makes="x", cost=5.0)
    filled, warnings = fill_preconditions(_alone("act"), (act, risky, safe), {})
    assert [leaf.key for leaf in filled.iter_leaves()] == ["safe", "act"]
    assert DagPlan.build(filled).dependencies["act"] == frozenset({"safe"})
    assert len(warnings) == 1 and "needs x" in warnings[0]
    # with only a consequential producer the fact stays unprovided: never added on its own
    assert fill_preconditions(_alone("act"), (act, risky), {}) == (_alone("act"), ())
    # a fact the case's state holds needs nothing
    assert fill_preconditions(_alone("act"), (act, safe), {"x": "given"}) == (_alone("act"), ())


def test_only_a_consequential_model_planned_action_is_filled_in() -> None:
    use = _capability("use", needs="x", makes="y")
    act = _capability("act", needs="x", makes="y", risk="financial")
    make = _capability("make", makes="x")
    assert fill_preconditions(_alone("use"), (use, make), {}) == (_alone("use"), ())
    static = _alone("act", STATIC)
    assert fill_preconditions(static, (act, make), {}) == (static, ())
