"""The evaluation's scorer on hand-made plans: exact F1 values, validity and its failures."""

from __future__ import annotations

import pytest

from eval.dataset import Constraints, EvalGoal
from eval.scoring import (
    catalogue_failures,
    constraint_failures,
    match_leaves,
    overlap,
    reduced_edges,
    validity_failures,
)
from planning.core.errors import PlanInvalid
from planning.packs.fraud import PACK as FRAUD
from planning.packs.invoice import PACK as INVOICE
from tests.eval.plans import flat_plan

CHAIN = flat_plan(
    ("pull", "transaction-monitor", "pull_transactions", "Pull the transactions", ()),
    ("draft", "fraud-analyst", None, "Draft the findings", ("pull",)),
    ("legal", "legal-counsel", None, "Review the findings", ("draft",)),
    ("freeze", "account-controls", "freeze_account", "Freeze the account", ("legal",)),
)


def test_a_plan_scores_one_against_itself() -> None:
    scores = overlap(CHAIN, CHAIN)
    assert (scores.node_f1, scores.edge_f1) == (1.0, 1.0)


def test_a_plan_missing_its_last_step_has_exact_node_and_edge_f1() -> None:
    plan = flat_plan(
        ("a", "transaction-monitor", "pull_transactions", "Pull all transactions", ()),
        ("b", "fraud-analyst", None, "Draft findings for the case", ("a",)),
        ("c", "legal-counsel", None, "Legal review of the findings", ("b",)),
    )
    scores = overlap(plan, CHAIN)
    assert scores.pairs == (("a", "pull"), ("b", "draft"), ("c", "legal"))
    # nodes: precision 3/3, recall 3/4; edges: 2 of 2 predicted right, 2 of 3 expected found
    assert scores.node_f1 == pytest.approx(6 / 7)
    assert scores.edge_precision == 1.0
    assert scores.edge_recall == pytest.approx(2 / 3)
    assert scores.edge_f1 == pytest.approx(0.8)


def test_an_extra_step_and_a_wrong_edge_lower_precision() -> None:
    plan = flat_plan(
        ("pull", "transaction-monitor", "pull_transactions", "Pull", ()),
        ("chat", "investigator", None, "Chat with someone", ()),
        ("draft", "fraud-analyst", None, "Draft the findings", ("chat",)),
        ("legal", "legal-counsel", None, "Review the findings", ("draft",)),
        ("freeze", "account-controls", "freeze_account", "Freeze", ("legal",)),
    )
    scores = overlap(plan, CHAIN)
    # 4 of 5 leaves match all 4 reference leaves: P 4/5, R 1 → F1 8/9
    assert scores.node_f1 == pytest.approx(8 / 9)
    # predicted edges chat→draft (unmatched end), draft→legal, legal→freeze: 2/3 right, 2/3 found
    assert scores.edge_f1 == pytest.approx(2 / 3)


def test_a_redundant_transitive_edge_is_not_counted() -> None:
    plan = flat_plan(
        ("a", "x", None, "first", ()),
        ("b", "x", None, "second", ("a",)),
        ("c", "x", None, "third", ("a", "b")),
    )
    assert reduced_edges(plan) == {("a", "b"), ("b", "c")}


def test_leaves_match_by_tool_and_never_across_different_tools() -> None:
    reference = flat_plan(
        ("dup", "payments-auditor", "check_duplicate_payment", "Check for a duplicate", ()),
        ("totals", "payments-auditor", "check_totals", "Check the totals", ()),
    )
    plan = flat_plan(
        ("x", "payments-auditor", "check_totals", "Check for a duplicate", ()),
        ("y", "payments-auditor", "place_payment_hold", "Check the totals", ()),
    )
    assert match_leaves(plan, reference) == (("x", "totals"),)


def test_without_a_tool_leaves_match_by_agent_and_a_shared_word() -> None:
    reference = flat_plan(("ref", "investigator", None, "Interview the customer", ()))
    same_agent = flat_plan(("p", "investigator", None, "Customer call", ()))
    other_agent = flat_plan(("p", "fraud-analyst", None, "Interview the customer", ()))
    no_shared_word = flat_plan(("p", "investigator", None, "Phone them", ()))
    assert match_leaves(same_agent, reference) == (("p", "ref"),)
    assert match_leaves(other_agent, reference) == ()
    assert match_leaves(no_shared_word, reference) == ()
    assert overlap(other_agent, reference).node_f1 == 0.0


def test_two_plans_without_edges_have_their_node_f1_as_edge_f1() -> None:
    single = flat_plan(("a", "investigator", None, "Interview the customer", ()))
    pair = flat_plan(
        ("a", "investigator", None, "Interview the customer", ()),
        ("b", "legal-counsel", None, "Review", ()),
    )
    stranger = flat_plan(("z", "fraud-analyst", None, "Something else", ()))
    assert overlap(single, single).edge_f1 == 1.0
    assert overlap(pair, single).edge_f1 == pytest.approx(2 / 3)
    assert overlap(stranger, single).edge_f1 == 0.0
    assert overlap(single, CHAIN).edge_f1 == 0.0


def test_a_freeze_before_the_legal_review_breaks_the_order() -> None:
    plan = flat_plan(
        ("pull", "transaction-monitor", "pull_transactions", "Pull", ()),
        ("freeze", "account-controls", "freeze_account", "Freeze", ("pull",)),
        ("legal", "legal-counsel", None, "Review", ("freeze",)),
    )
    constraints = Constraints(orders=(("agent:legal-counsel", "tool:freeze_account"),))
    failures = constraint_failures(plan, constraints)
    assert [f.check for f in failures] == ["constraint.order"]
    assert "'freeze'" in failures[0].detail
    assert constraint_failures(CHAIN, constraints) == []


def test_a_freeze_without_any_legal_review_breaks_the_order_too() -> None:
    plan = flat_plan(("freeze", "account-controls", "freeze_account", "Freeze", ()))
    constraints = Constraints(orders=(("agent:legal-counsel", "tool:freeze_account"),))
    assert [f.check for f in constraint_failures(plan, constraints)] == ["constraint.order"]


def test_forbidden_and_missing_tools_and_agents_and_size_are_each_named() -> None:
    constraints = Constraints(
        required_tools=("screen_sanctions",),
        forbidden_tools=("freeze_account",),
        required_agents=("investigator",),
        forbidden_agents=("account-controls",),
        max_leaves=3,
    )
    checks = sorted(f.check for f in constraint_failures(CHAIN, constraints))
    assert checks == [
        "constraint.forbidden_agent",
        "constraint.forbidden_tool",
        "constraint.max_leaves",
        "constraint.required_agent",
        "constraint.required_tool",
    ]


def test_unknown_agents_and_tools_and_tools_not_allowed_are_invalid() -> None:
    plan = flat_plan(
        ("a", "ghost", None, "Haunt", ()),
        ("b", "fraud-analyst", "wipe_disk", "Wipe", ()),
        ("c", "transaction-monitor", None, "Monitor", ()),
    )
    failures = catalogue_failures(plan, FRAUD.catalogue(), check_inputs=False)
    details = [f.detail for f in failures]
    assert details == [
        "unknown agent 'ghost'",
        "tool 'wipe_disk' is not allowed for 'fraud-analyst'",
        "tool agent 'transaction-monitor' has no tool",
    ]


def test_a_tool_step_without_its_inputs_is_invalid_with_the_planner_s_own_checks() -> None:
    plan = flat_plan(("s", "erp-connector", "get_supplier", "Look up the supplier", ()))
    assert catalogue_failures(plan, INVOICE.catalogue(), check_inputs=False) == []
    failures = validity_failures(plan, INVOICE.catalogue(), Constraints())
    assert [f.check for f in failures] == ["catalogue"]
    assert "supplier_id: Field required" in failures[0].detail


def _goal(reference: list[dict[str, object]]) -> EvalGoal:
    return EvalGoal.model_validate(
        {"id": "g", "kind": "easy", "goal": "A goal", "reference": reference}
    )


def test_a_cyclic_reference_is_refused() -> None:
    goal = _goal(
        [
            {"key": "a", "agent": "fraud-analyst", "task": "A", "depends_on": ["b"]},
            {"key": "b", "agent": "fraud-analyst", "task": "B", "depends_on": ["a"]},
        ]
    )
    with pytest.raises(PlanInvalid, match="cycle"):
        goal.reference_plan()


def test_a_reference_naming_an_unknown_step_is_refused() -> None:
    goal = _goal([{"key": "a", "agent": "fraud-analyst", "task": "A", "depends_on": ["zz"]}])
    with pytest.raises(PlanInvalid, match="unknown key"):
        goal.reference_plan()
