import json
from dataclasses import replace

from planning.core.dag import DagPlan
from planning.core.serialize import content_hash, node_from_data, node_to_data
from planning.core.static import StaticDecomposition
from planning.packs import fraud


def _plan() -> DagPlan:
    pack = fraud.PACK
    state = pack.initial_state({"account_id": "ACC-300", "amount": "12500"})
    return StaticDecomposition(pack.methods).plan(pack.goal(), state)


def test_tree_round_trips_through_json():
    plan = _plan()
    data = json.loads(json.dumps(node_to_data(plan.root)))
    rebuilt = DagPlan.build(node_from_data(data))
    assert rebuilt.root == plan.root
    assert dict(rebuilt.dependencies) == dict(plan.dependencies)
    assert content_hash(rebuilt) == content_hash(plan)


def test_content_hash_changes_with_any_edit():
    plan = _plan()
    leaf = plan.leaf("freeze-account")
    edited_root = node_from_data(node_to_data(plan.root))
    children = tuple(
        replace(c, task="Freeze the account now") if c.key == leaf.key else c
        for c in edited_root.children
    )
    edited = DagPlan.build(replace(edited_root, children=children))
    assert len(content_hash(plan)) == 64
    assert content_hash(edited) != content_hash(plan)
