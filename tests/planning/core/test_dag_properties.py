"""Property: any generated tree flattens to an acyclic DAG that respects the dependency rules."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from planning.core.dag import DagPlan
from planning.core.tree import Compound, Leaf, Provenance

PROV = Provenance(strategy="static", source="generated", depth=0)

shapes = st.recursive(
    st.just("leaf"), lambda inner: st.lists(inner, min_size=1, max_size=4), max_leaves=24
)


@st.composite
def trees(draw) -> Compound:
    counter = itertools.count()

    def build(shape):
        key = f"n{next(counter)}"
        if shape == "leaf":
            return Leaf(key=key, agent="a", task=key, provenance=PROV)
        children = []
        for child_shape in shape:
            child = build(child_shape)
            earlier = [c.key for c in children]
            kind = draw(st.sampled_from(["absent", "independent", "earlier"]))
            if kind == "absent":
                deps = None
            elif kind == "independent" or not earlier:
                deps = ()
            else:
                deps = tuple(draw(st.lists(st.sampled_from(earlier), min_size=1, unique=True)))
            children.append(_with_deps(child, deps))
        return Compound(key=key, name=key, children=tuple(children), provenance=PROV)

    shape = draw(shapes)
    return build(shape if isinstance(shape, list) else [shape])


def _with_deps(node, deps):
    if isinstance(node, Leaf):
        return Leaf(
            key=node.key,
            agent=node.agent,
            task=node.task,
            depends_on=deps,
            provenance=node.provenance,
        )
    return Compound(
        key=node.key,
        name=node.name,
        children=node.children,
        depends_on=deps,
        provenance=node.provenance,
    )


def _leaf_keys(node) -> set[str]:
    return {leaf.key for leaf in node.iter_leaves()} if isinstance(node, Compound) else {node.key}


def _sibling_edges(compound: Compound) -> dict[str, set[str]]:
    """Resolve declared dependencies: absent → previous sibling, () → none."""
    edges: dict[str, set[str]] = {}
    previous = None
    for child in compound.children:
        if child.depends_on is None:
            edges[child.key] = set() if previous is None else {previous}
        else:
            edges[child.key] = set(child.depends_on)
        previous = child.key
    return edges


def _closure(deps) -> dict[str, set[str]]:
    closure: dict[str, set[str]] = {}

    def visit(key):
        if key not in closure:
            closure[key] = set()
            for dep in deps[key]:
                closure[key] |= {dep} | visit(dep)
        return closure[key]

    for key in deps:
        visit(key)
    return closure


@settings(max_examples=300, deadline=None)
@given(trees())
def test_any_tree_flattens_to_an_acyclic_dag_respecting_the_rules(root):
    plan = DagPlan.build(root)
    order = plan.topological_order()
    assert sorted(order) == sorted(leaf.key for leaf in root.iter_leaves())
    position = {key: i for i, key in enumerate(order)}
    for key, deps in plan.dependencies.items():
        assert all(position[d] < position[key] for d in deps)

    after = _closure(plan.dependencies)
    for compound in (n for n in root.walk() if isinstance(n, Compound)):
        edges = _sibling_edges(compound)
        sibling_after = _closure(edges)
        children = {c.key: c for c in compound.children}
        # Every leaf of a child runs after every leaf of each child it (transitively) follows.
        for later, earlier_set in sibling_after.items():
            for earlier in earlier_set:
                for b in _leaf_keys(children[later]):
                    assert _leaf_keys(children[earlier]) <= after[b]
        # And nothing else orders leaves of different children: independent stays parallel.
        for x, y in itertools.permutations(children, 2):
            if x not in sibling_after[y]:
                for b in _leaf_keys(children[y]):
                    assert not (_leaf_keys(children[x]) & after[b])

    # Ready sets replay the whole plan.
    done: set[str] = set()
    while len(done) < len(plan.leaves):
        ready = plan.ready(done)
        assert ready
        assert all(plan.dependencies[k] <= done for k in ready)
        done |= ready
    assert len(plan.critical_path()) == len(plan.levels())
    assert plan.width() == max(len(level) for level in plan.levels())
