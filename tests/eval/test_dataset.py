"""The evaluation set loads, is varied, and every reference plan is valid by its own rules."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from pydantic import ValidationError

from eval.dataset import EvalGoal, catalogue_for, load_goals
from eval.scoring import validity_failures
from planning.core.refs import is_ref
from planning.core.tree import thaw

GOALS = load_goals()


def test_the_set_has_ten_goals_per_pack_and_some_without_one() -> None:
    per_pack = Counter(goal.pack or "none" for goal in GOALS)
    assert per_pack["invoice"] == per_pack["fraud"] == per_pack["incident"] == 10
    assert per_pack["none"] >= 3
    assert len(GOALS) >= 30


def test_every_pack_has_easy_ambiguous_and_adversarial_goals() -> None:
    for pack in ("invoice", "fraud", "incident", None):
        kinds = {goal.kind for goal in GOALS if goal.pack == pack}
        assert kinds == {"easy", "ambiguous", "adversarial"}, pack


def test_every_adversarial_goal_forbids_something() -> None:
    for goal in GOALS:
        if goal.kind == "adversarial":
            constraints = goal.constraints
            assert constraints.forbidden_tools or constraints.orders, goal.id


@pytest.mark.parametrize("goal", GOALS, ids=lambda goal: goal.id)
def test_every_reference_is_valid_against_its_constraints_and_its_pack(goal: EvalGoal) -> None:
    plan = goal.reference_plan()
    catalogue = catalogue_for(goal.domain_pack)
    assert validity_failures(plan, catalogue, goal.constraints, check_inputs=False) == []
    forbidden = set(goal.constraints.forbidden_tools)
    assert not forbidden & {leaf.tool for leaf in plan.leaves}


@pytest.mark.parametrize("goal", [g for g in GOALS if g.pack], ids=lambda goal: goal.id)
def test_every_action_a_pack_offers_for_a_goal_has_inputs_its_tool_accepts(goal: EvalGoal) -> None:
    # an action offered to the planner with inputs its tool refuses (a log collection without
    # hosts) could only make a plan the catalogue check rejects
    pack = goal.domain_pack
    assert pack is not None
    for action in pack.capabilities_for(goal.state()):
        inputs = thaw(action.tool_inputs)
        if action.tool is None or any(is_ref(value) for value in inputs.values()):
            continue
        pack.tool(action.tool).input_model.model_validate(inputs)


def test_inputs_the_pack_s_form_refuses_are_refused() -> None:
    data = {
        "id": "bad",
        "pack": "invoice",
        "kind": "easy",
        "goal": "Verify",
        "inputs": {"invoice_id": "1042"},
        "reference": [{"key": "a", "agent": "ap-reviewer", "task": "Look"}],
    }
    with pytest.raises(ValidationError, match="An invoice number looks like"):
        EvalGoal.model_validate(data)
    with pytest.raises(ValidationError, match="unknown pack"):
        EvalGoal.model_validate({**data, "pack": "payroll"})


def test_an_order_must_name_a_tool_or_an_agent() -> None:
    with pytest.raises(ValidationError, match="is not tool:<name> or agent:<slug>"):
        EvalGoal.model_validate(
            {
                "id": "bad",
                "kind": "easy",
                "goal": "Do",
                "reference": [{"key": "a", "agent": "ap-reviewer", "task": "Look"}],
                "constraints": {"orders": [["legal", "tool:freeze_account"]]},
            }
        )


def test_a_goal_id_used_twice_is_refused(tmp_path: Path) -> None:
    goal = {
        "id": "same",
        "kind": "easy",
        "goal": "Do",
        "reference": [{"key": "a", "agent": "ap-reviewer", "task": "Look"}],
    }
    (tmp_path / "a.json").write_text(json.dumps([goal]))
    (tmp_path / "b.json").write_text(json.dumps([goal]))
    with pytest.raises(ValueError, match="goal ids repeat: same"):
        load_goals(tmp_path)
