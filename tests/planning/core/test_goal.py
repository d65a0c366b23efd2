import pytest

from planning.core.errors import GoalAlreadySatisfied, NoMethodMatched
from planning.core.goal import Capability, GoalOrientedDecomposition
from planning.core.refs import ref
from planning.core.static import Step
from planning.core.tree import Goal


def cap(name: str, inputs: set[str], outputs: set[str], cost: float = 1.0) -> Capability:
    return Capability(
        name=name,
        agent=f"{name}-agent",
        task=name,
        inputs=frozenset(inputs),
        outputs=frozenset(outputs),
        cost=cost,
    )


def plan(caps, wanted, state=None):
    strategy = GoalOrientedDecomposition(caps, {"goal": wanted})
    return strategy.plan(Goal(name="goal"), state if state is not None else {"case": "c-1"})


def test_linear_chain_from_available_facts():
    result = plan(
        [
            cap("extract", {"case"}, {"fields"}),
            cap("lookup", {"fields"}, {"supplier"}),
            cap("report", {"supplier"}, {"report"}),
        ],
        {"report"},
    )
    assert [leaf.key for leaf in result.leaves] == ["extract", "lookup", "report"]
    assert dict(result.dependencies) == {
        "extract": set(),
        "lookup": {"extract"},
        "report": {"lookup"},
    }


def test_independent_producers_form_parallel_branches():
    result = plan(
        [
            cap("screen-sanctions", {"case"}, {"sanctions"}),
            cap("pull-transactions", {"case"}, {"transactions"}),
            cap("summarise", {"sanctions", "transactions"}, {"summary"}),
        ],
        {"summary"},
    )
    assert result.dependencies["screen-sanctions"] == set()
    assert result.dependencies["pull-transactions"] == set()
    assert result.dependencies["summarise"] == {"screen-sanctions", "pull-transactions"}
    assert result.width() == 2


def test_shared_input_forms_a_diamond():
    result = plan(
        [
            cap("extract", {"case"}, {"fields"}),
            cap("check-totals", {"fields"}, {"totals_ok"}),
            cap("check-duplicates", {"fields"}, {"no_duplicate"}),
            cap("report", {"totals_ok", "no_duplicate"}, {"report"}),
        ],
        {"report"},
    )
    assert result.dependencies["check-totals"] == {"extract"}
    assert result.dependencies["check-duplicates"] == {"extract"}
    assert result.dependencies["report"] == {"check-totals", "check-duplicates"}
    assert len(result.critical_path()) == 3


def test_cheapest_producer_set_wins_and_unneeded_capabilities_are_left_out():
    result = plan(
        [
            cap("manual-review", {"case"}, {"verdict"}, cost=10),
            cap("score", {"case"}, {"score"}, cost=1),
            cap("auto-verdict", {"score"}, {"verdict"}, cost=2),
            cap("unrelated", {"case"}, {"newsletter"}, cost=0),
        ],
        {"verdict"},
    )
    assert [leaf.key for leaf in result.leaves] == ["score", "auto-verdict"]
    for leaf in result.leaves:
        assert leaf.provenance.strategy == "goal"
        assert leaf.provenance.source == leaf.key
    assert result.root.provenance.strategy == "goal"


def test_already_available_facts_are_not_reproduced():
    result = plan(
        [cap("extract", {"case"}, {"fields"}), cap("report", {"fields"}, {"report"})],
        {"report"},
        state={"case": "c-1", "fields": {"total": 5}},
    )
    assert [leaf.key for leaf in result.leaves] == ["report"]


def test_no_path_raises_no_method_matched_naming_the_goal():
    with pytest.raises(NoMethodMatched, match=r"'goal'.*missing_fact") as exc:
        plan(
            [
                cap("extract", {"case"}, {"fields"}),
                cap("report", {"fields", "missing_fact"}, {"report"}),
            ],
            {"report"},
        )
    assert exc.value.task == "goal"


def test_false_and_none_values_are_not_facts():
    with pytest.raises(NoMethodMatched):
        plan(
            [cap("report", {"approved"}, {"report"})],
            {"report"},
            state={"approved": False, "case": None},
        )


def test_goal_already_satisfied_is_a_clear_error():
    with pytest.raises(GoalAlreadySatisfied, match="'goal' is already satisfied"):
        plan([cap("report", {"case"}, {"report"})], {"report"}, state={"case": 1, "report": "done"})


def test_undeclared_goal_raises_no_method_matched():
    strategy = GoalOrientedDecomposition([cap("x", set(), {"y"})], {})
    with pytest.raises(NoMethodMatched, match="no goal facts"):
        strategy.plan(Goal(name="unknown"), {})


def test_a_capability_made_from_a_step_plans_the_same_leaf():
    step = Step(
        key="hold",
        agent="clerk",
        task="Place a hold",
        rationale="the report says so",
        tool="place_hold",
        inputs={"report": ref("report"), "note": "late"},
        depends_on=("report",),
        expected_output="HoldResult",
        failure_policy="escalate",
        risk="financial",
        reads=frozenset({"report_ready"}),
        effects={"held": True},
    )
    hold = Capability.from_step(step, inputs={"report"}, outputs={"held"}, cost=2.5)
    assert (hold.name, hold.inputs, hold.outputs, hold.cost) == (
        "hold",
        {"report"},
        {"held"},
        2.5,
    )
    result = plan([cap("report", {"case"}, {"report"}), hold], {"held"})
    leaf = result.leaf("hold")
    for name in ("agent", "task", "rationale", "tool", "inputs", "expected_output", "risk"):
        assert getattr(leaf, name) == getattr(step, name), name
    assert leaf.failure_policy == "escalate"
    assert result.dependencies["hold"] == {"report"}


def test_a_capability_from_a_step_must_still_produce_something():
    with pytest.raises(ValueError, match="produces nothing"):
        Capability.from_step(Step(key="x", agent="a", task="t"), outputs=set())
