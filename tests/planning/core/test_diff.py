"""The diff of two plans: what an edit added, removed and changed, and how dependencies moved."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from planning.core.dag import DagPlan
from planning.core.diff import diff_plans
from planning.core.serialize import node_hash
from planning.core.tree import Compound, Leaf, Node, Provenance
from tests.planning.core.test_dag_properties import trees

PROV = Provenance(strategy="static", source="test", depth=1)


def leaf(key: str, depends_on: tuple[str, ...] | None = None, **fields: object) -> Leaf:
    return Leaf(
        key=key,
        agent="clerk",
        task=f"do {key}",
        depends_on=depends_on,
        provenance=PROV,
        **fields,  # type: ignore[arg-type]
    )


def plan(*children: Node) -> DagPlan:
    return DagPlan.build(Compound(key="root", name="Root", children=children, provenance=PROV))


def replace_node(node: Node, key: str, new: Node | None) -> Node:
    """Return the tree under `node` with node `key` replaced by `new` (None: removed)."""
    if isinstance(node, Leaf):
        return node
    children = []
    for child in node.children:
        if child.key == key:
            if new is not None:
                children.append(new)
            continue
        children.append(replace_node(child, key, new))
    return dataclasses.replace(node, children=tuple(children))


def test_a_plan_compared_with_itself_has_an_empty_diff() -> None:
    p = plan(leaf("a"), leaf("b", inputs={"n": 1}))
    diff = diff_plans(p, p)
    assert diff.is_empty
    assert diff.as_data() == {"added": [], "removed": [], "changed": [], "dependencies": []}


def test_a_changed_agent_and_inputs_are_listed_with_before_and_after() -> None:
    old = plan(leaf("a"), leaf("b", inputs={"n": 1}))
    new = plan(leaf("a"), dataclasses.replace(old.leaf("b"), agent="auditor", inputs={"n": 2}))
    diff = diff_plans(old, new)
    assert diff.added == diff.removed == ()
    assert diff.dependencies == ()
    (change,) = diff.changed
    assert change.key == "b"
    assert [(c.field, c.before, c.after) for c in change.fields] == [
        ("agent", "clerk", "auditor"),
        ("inputs", {"n": 1}, {"n": 2}),
    ]


def test_provenance_alone_is_not_a_change() -> None:
    old = plan(leaf("a"))
    by_edit = Provenance(strategy="static", source="edit by olivia", depth=1)
    edited = dataclasses.replace(old.leaf("a"), provenance=by_edit)
    assert diff_plans(old, plan(edited)).is_empty


def test_a_removed_leaf_is_listed_and_its_dependents_lose_it() -> None:
    old = plan(leaf("a"), leaf("b"), leaf("c"))  # a -> b -> c
    new = plan(leaf("a"), leaf("c", depends_on=("a",)))
    diff = diff_plans(old, new)
    assert diff.removed == ("b",)
    assert diff.added == ()
    (change,) = diff.changed
    assert [(c.field, c.before, c.after) for c in change.fields] == [("depends_on", None, ["a"])]
    (moved,) = diff.dependencies
    assert (moved.key, moved.before, moved.after) == ("c", ("b",), ("a",))
    assert (moved.gained, moved.lost) == (("a",), ("b",))


def test_resolved_dependencies_change_without_a_declared_change() -> None:
    # "after the previous sibling": inserting a leaf before c moves c without touching c.
    old = plan(leaf("a"), leaf("c"))
    new = plan(leaf("a"), leaf("b"), leaf("c"))
    diff = diff_plans(old, new)
    assert diff.added == ("b",)
    assert diff.changed == ()
    assert [d.as_data() for d in diff.dependencies] == [
        {"node": "c", "before": ["a"], "after": ["b"], "gained": ["b"], "lost": ["a"]}
    ]


def test_a_compound_renamed_and_a_node_changing_kind() -> None:
    old = plan(Compound(key="g", name="Group", children=(leaf("x"),), provenance=PROV), leaf("y"))
    new = plan(
        Compound(key="g", name="Checks", children=(leaf("x"),), provenance=PROV),
        Compound(key="y", name="Now a group", children=(leaf("z"),), provenance=PROV),
    )
    diff = diff_plans(old, new)
    assert diff.added == ("z",)
    changes = {c.key: [(f.field, f.before, f.after) for f in c.fields] for c in diff.changed}
    assert changes["g"] == [("name", "Group", "Checks")]
    assert ("kind", "leaf", "compound") in changes["y"]
    assert ("agent", "clerk", None) in changes["y"]
    assert ("name", None, "Now a group") in changes["y"]


def test_the_diff_data_is_json() -> None:
    old = plan(leaf("a", inputs={"ids": [1, 2], "opts": {"deep": True}}), leaf("b"))
    new = plan(leaf("a", inputs={"ids": [1, 3], "opts": {"deep": True}}), leaf("c"))
    data = diff_plans(old, new).as_data()
    assert json.loads(json.dumps(data)) == data
    assert data["changed"][0]["fields"][0]["after"] == {"ids": [1, 3], "opts": {"deep": True}}


# Properties ---------------------------------------------------------------------------------


@st.composite
def edited(draw: st.DrawFn) -> tuple[DagPlan, DagPlan]:
    """Draw a plan and the same plan after one edit of one leaf (or of none)."""
    old = DagPlan.build(draw(trees()))
    target = draw(st.sampled_from([leaf.key for leaf in old.leaves]))
    node = old.leaf(target)
    kind = draw(st.sampled_from(["agent", "task", "inputs", "independent", "remove", "same"]))
    if kind == "remove":
        parent = old.parent_of(target)
        assert parent is not None
        if len(parent.children) == 1:
            kind = "same"
        else:
            root = replace_node(old.root, target, None)
            assert isinstance(root, Compound)
            for sibling in parent.children:
                if sibling.depends_on and target in sibling.depends_on:
                    deps = tuple(k for k in sibling.depends_on if k != target)
                    lighter = dataclasses.replace(sibling, depends_on=deps)
                    root = replace_node(root, sibling.key, lighter)  # type: ignore[assignment]
            return old, DagPlan.build(root)  # type: ignore[arg-type]
    changes: dict[str, object] = {
        "agent": {"agent": "someone-else"},
        "task": {"task": "another task"},
        "inputs": {"inputs": {"x": draw(st.integers())}},
        "independent": {"depends_on": ()},
        "same": {"provenance": Provenance(strategy="static", source="edit", depth=0)},
    }[kind]  # type: ignore[assignment]
    root = replace_node(old.root, target, dataclasses.replace(node, **changes))  # type: ignore[arg-type]
    return old, DagPlan.build(root)  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(edited())
def test_unchanged_leaves_are_exactly_those_whose_node_hash_is_unchanged(
    plans: tuple[DagPlan, DagPlan],
) -> None:
    # The hash approvals bind to (R3) and the diff reviewers read (R9) agree on every leaf.
    old, new = plans
    diff = diff_plans(old, new)
    named = {c.key for c in diff.changed} | {d.key for d in diff.dependencies}
    common = [leaf.key for leaf in new.leaves if leaf.key in {x.key for x in old.leaves}]
    for key in common:
        same = node_hash(old.leaf(key), old.dependencies[key]) == node_hash(
            new.leaf(key), new.dependencies[key]
        )
        assert same == (key not in named), key


@settings(max_examples=100, deadline=None)
@given(edited())
def test_the_reverse_diff_swaps_added_removed_and_before_after(
    plans: tuple[DagPlan, DagPlan],
) -> None:
    old, new = plans
    forward, backward = diff_plans(old, new), diff_plans(new, old)
    assert set(forward.added) == set(backward.removed)
    assert set(forward.removed) == set(backward.added)
    swapped = {
        (c.key, f.field, json.dumps(f.after), json.dumps(f.before))
        for c in backward.changed
        for f in c.fields
    }
    assert {
        (c.key, f.field, json.dumps(f.before), json.dumps(f.after))
        for c in forward.changed
        for f in c.fields
    } == swapped
    assert {(d.key, frozenset(d.before), frozenset(d.after)) for d in forward.dependencies} == {
        (d.key, frozenset(d.after), frozenset(d.before)) for d in backward.dependencies
    }


@settings(max_examples=100, deadline=None)
@given(trees())
def test_any_plan_compared_with_itself_is_empty(root: Compound) -> None:
    p = DagPlan.build(root)
    assert diff_plans(p, p).is_empty
