"""A pack action the model planned in two parts of one plan runs once (`merge_repeated_actions`)."""

from __future__ import annotations

from typing import Any

from planning.core.dag import DagPlan
from planning.core.llm.repeats import merge_repeated_actions
from planning.core.refs import REF_KEY, ref
from planning.core.tree import Compound, Leaf, Node, Provenance

LLM = Provenance(strategy="llm", source="llm:1", depth=2)
STATIC = Provenance(strategy="hybrid", source="static:checks", depth=2)


def tool_leaf(
    key: str,
    tool: str = "extract",
    inputs: dict[str, Any] | None = None,
    depends_on: tuple[str, ...] | None = None,
    provenance: Provenance = LLM,
) -> Leaf:
    return Leaf(
        key=key,
        agent="extractor",
        task=f"run {tool}",
        tool=tool,
        inputs={"invoice_id": "INV-1"} if inputs is None else inputs,
        depends_on=depends_on,
        provenance=provenance,
    )


def part(key: str, *children: Node, depends_on: tuple[str, ...] | None = None) -> Compound:
    return Compound(key=key, name=key, children=children, depends_on=depends_on, provenance=LLM)


def root(*children: Node) -> Compound:
    return Compound(key="goal", name="goal", children=children, provenance=LLM)


def test_the_same_action_in_two_sibling_parts_runs_once_and_its_dependents_wait_for_it() -> None:
    tree = root(
        part("a", tool_leaf("extract"), tool_leaf("check", "check", {"x": ref("extract")})),
        part(
            "b",
            tool_leaf("b.extract"),
            tool_leaf("total", "total", {"x": ref("b.extract")}),
            depends_on=(),
        ),
    )
    merged, warnings = merge_repeated_actions(tree)
    plan = DagPlan.build(merged)
    assert [leaf.key for leaf in plan.leaves] == ["extract", "check", "total"]
    assert plan.leaf("total").inputs["x"][REF_KEY] == "extract"
    assert plan.dependencies["total"] == frozenset({"extract"})
    assert len(warnings) == 1
    assert "'b.extract'" in warnings[0] and "runs it once" in warnings[0]


def test_a_part_left_empty_goes_and_what_waited_for_it_waits_for_the_kept_leaf() -> None:
    tree = root(
        part("a", tool_leaf("extract")),
        part("b", tool_leaf("b.extract"), depends_on=()),
        tool_leaf("report", "report", {}, depends_on=("b",)),
    )
    merged, _ = merge_repeated_actions(tree)
    plan = DagPlan.build(merged)
    assert [leaf.key for leaf in plan.leaves] == ["extract", "report"]
    assert "b" not in {node.key for node in plan.nodes()}
    assert plan.dependencies["report"] == frozenset({"extract"})


def test_no_order_is_lost_when_the_repeat_was_a_parts_exit() -> None:
    # "b" ends with the repeat; "c" waits for "b", so it must still wait for "prepare" (what
    # the repeat waited for) and for the kept extraction
    tree = root(
        part("a", tool_leaf("extract")),
        part("b", tool_leaf("prepare", "prepare", {}), tool_leaf("b.extract"), depends_on=()),
        part("c", tool_leaf("report", "report", {})),
    )
    merged, _ = merge_repeated_actions(tree)
    plan = DagPlan.build(merged)
    assert "b.extract" not in {leaf.key for leaf in plan.leaves}
    assert {"prepare", "extract"} <= plan.upstream("report")


def test_the_same_tool_on_other_inputs_is_not_merged() -> None:
    tree = root(
        part("a", tool_leaf("extract")),
        part("b", tool_leaf("b.extract", inputs={"invoice_id": "INV-2"}), depends_on=()),
    )
    merged, warnings = merge_repeated_actions(tree)
    assert merged == tree
    assert warnings == ()


def test_a_static_method_that_runs_a_tool_twice_keeps_both() -> None:
    tree = root(
        tool_leaf("check", provenance=STATIC),
        tool_leaf("fix", "fix", {}, provenance=STATIC),
        tool_leaf("check-again", provenance=STATIC),
    )
    merged, warnings = merge_repeated_actions(tree)
    assert merged == tree
    assert warnings == ()


def test_a_model_planned_repeat_of_a_statically_planned_action_is_merged() -> None:
    tree = root(
        part("a", tool_leaf("extract", provenance=STATIC)),
        part("b", tool_leaf("b.extract"), depends_on=()),
    )
    merged, warnings = merge_repeated_actions(tree)
    assert [leaf.key for leaf in merged.iter_leaves()] == ["extract"]
    assert len(warnings) == 1


def test_the_leaf_kept_is_the_first_in_dependency_order() -> None:
    # tree order puts "late" first, but it waits for "b": "b.extract" is the one kept
    tree = root(
        part("a", tool_leaf("late"), depends_on=("b",)),
        part("b", tool_leaf("b.extract"), depends_on=()),
    )
    merged, _ = merge_repeated_actions(tree)
    assert [leaf.key for leaf in merged.iter_leaves()] == ["b.extract"]
