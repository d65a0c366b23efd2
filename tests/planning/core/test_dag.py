import pytest

from planning.core.dag import DagPlan
from planning.core.errors import PlanInvalid
from planning.core.tree import Compound, Leaf, Provenance

PROV = Provenance(strategy="static", source="test", depth=1)


def leaf(key: str, depends_on: tuple[str, ...] | None = None) -> Leaf:
    return Leaf(key=key, agent="agent", task=f"do {key}", depends_on=depends_on, provenance=PROV)


def group(key: str, *children: Leaf | Compound, depends_on=None) -> Compound:
    return Compound(key=key, name=key, children=children, depends_on=depends_on, provenance=PROV)


def test_absent_depends_on_means_after_previous_sibling():
    plan = DagPlan.build(group("root", leaf("a"), leaf("b"), leaf("c")))
    assert dict(plan.dependencies) == {"a": set(), "b": {"a"}, "c": {"b"}}
    assert plan.topological_order() == ("a", "b", "c")
    assert plan.width() == 1


def test_empty_depends_on_means_independent():
    plan = DagPlan.build(group("root", leaf("a"), leaf("b", ()), leaf("c", ())))
    assert dict(plan.dependencies) == {"a": set(), "b": set(), "c": set()}
    assert plan.ready(()) == {"a", "b", "c"}
    assert plan.width() == 3


def test_dependency_on_compound_is_on_its_exit_leaves_and_entry_leaves_inherit():
    inner = group("inner", leaf("x", ()), leaf("y", ()), leaf("z", ("x",)))
    plan = DagPlan.build(group("root", leaf("a"), inner, leaf("b")))
    # x and y are entry leaves: they inherit "after a"; z waits for x only.
    assert plan.dependencies["x"] == {"a"}
    assert plan.dependencies["y"] == {"a"}
    assert plan.dependencies["z"] == {"x"}
    # b depends on the compound, i.e. on its exit leaves y and z (not x, which z waits for).
    assert plan.dependencies["b"] == {"y", "z"}


def test_ready_follows_done_leaves():
    plan = DagPlan.build(group("root", leaf("a"), leaf("b", ("a",)), leaf("c", ("a",)), leaf("d")))
    assert plan.ready(()) == {"a"}
    assert plan.ready({"a"}) == {"b", "c"}
    assert plan.ready({"a", "b"}) == {"c"}
    assert plan.ready({"a", "b", "c"}) == {"d"}
    assert plan.ready({"a", "b", "c", "d"}) == frozenset()


def test_critical_path_and_width_of_a_diamond():
    plan = DagPlan.build(
        group("root", leaf("a"), leaf("b", ("a",)), leaf("c", ("a",)), leaf("d", ("b", "c")))
    )
    assert plan.critical_path() == ("a", "b", "d")
    assert plan.critical_path({"a": 1, "b": 1, "c": 5, "d": 1}) == ("a", "c", "d")
    assert plan.width() == 2


def test_node_and_parent_lookup():
    inner = group("inner", leaf("x"))
    plan = DagPlan.build(group("root", inner, leaf("b")))
    assert plan.node("inner") is inner
    assert plan.parent_of("x") is inner
    assert plan.parent_of("root") is None
    with pytest.raises(KeyError):
        plan.node("missing")


def test_empty_plan_is_refused():
    with pytest.raises(PlanInvalid, match="no leaf tasks") as exc:
        DagPlan.build(group("root"))
    assert exc.value.keys == ("root",)


def test_empty_nested_compound_is_refused_naming_it():
    with pytest.raises(PlanInvalid, match="'hollow'") as exc:
        DagPlan.build(group("root", leaf("a"), group("hollow")))
    assert exc.value.keys == ("hollow",)


def test_duplicate_keys_are_refused_naming_them():
    with pytest.raises(PlanInvalid, match=r"duplicate keys.*'a'") as exc:
        DagPlan.build(group("root", leaf("a"), group("g", leaf("a"))))
    assert exc.value.keys == ("a",)


def test_duplicate_key_between_compound_and_leaf_is_refused():
    with pytest.raises(PlanInvalid, match="'g'"):
        DagPlan.build(group("root", group("g", leaf("x")), leaf("g")))


def test_self_dependency_is_refused_naming_the_step():
    # Seed 002: "Step 1 cannot depend on itself".
    with pytest.raises(PlanInvalid, match="'step-1' depends on itself") as exc:
        DagPlan.build(group("root", leaf("step-1", ("step-1",))))
    assert exc.value.keys == ("step-1",)


def test_unknown_dependency_is_refused_naming_both_keys():
    with pytest.raises(PlanInvalid, match="'b' depends on unknown key 'ghost'") as exc:
        DagPlan.build(group("root", leaf("a"), leaf("b", ("ghost",))))
    assert exc.value.keys == ("b", "ghost")


@pytest.mark.scenario("L4")
def test_cycle_is_refused_naming_its_keys():
    with pytest.raises(PlanInvalid, match="dependency cycle") as exc:
        DagPlan.build(group("root", leaf("a", ("c",)), leaf("b", ("a",)), leaf("c", ("b",))))
    assert set(exc.value.keys) == {"a", "b", "c"}


def test_seed_002_forward_dependency_that_closes_a_cycle_is_refused():
    # Seed 002's bad plan: step 1 depends on step 2. With step 2 implicitly after step 1
    # (absent depends_on) the two wait for each other.
    with pytest.raises(PlanInvalid, match="dependency cycle") as exc:
        DagPlan.build(group("root", leaf("step-1", ("step-2",)), leaf("step-2")))
    assert set(exc.value.keys) == {"step-1", "step-2"}


def test_forward_dependency_on_an_independent_later_sibling_is_ordered_not_refused():
    # DESIGN §3 refuses self, unknown and cyclic dependencies; an acyclic forward reference
    # (as a reviewer's edit may create) is ordered by the DAG.
    plan = DagPlan.build(group("root", leaf("step-1", ("step-2",)), leaf("step-2", ())))
    assert plan.topological_order() == ("step-2", "step-1")


def test_dependency_on_own_ancestor_is_refused():
    with pytest.raises(PlanInvalid, match="'x' depends on 'g', which contains it"):
        DagPlan.build(group("root", leaf("a"), group("g", leaf("x", ("g",)))))


def test_dependency_of_compound_on_its_own_child_is_refused():
    with pytest.raises(PlanInvalid, match="'g' depends on 'x', which is inside it"):
        DagPlan.build(group("root", leaf("a"), group("g", leaf("x"), depends_on=("x",))))


def test_cycle_through_compounds_is_refused():
    g1 = group("g1", leaf("a"), depends_on=("g2",))
    g2 = group("g2", leaf("b"), depends_on=("g1",))
    with pytest.raises(PlanInvalid, match="dependency cycle") as exc:
        DagPlan.build(group("root", g1, g2))
    assert set(exc.value.keys) == {"a", "b"}


def test_leaf_inputs_are_an_immutable_copy():
    raw = {"ids": [1, 2], "nested": {"k": "v"}}
    item = Leaf(key="a", agent="x", task="t", inputs=raw, provenance=PROV)
    raw["ids"].append(3)
    assert item.inputs["ids"] == (1, 2)
    with pytest.raises(TypeError):
        item.inputs["nested"]["k"] = "changed"  # type: ignore[index]
