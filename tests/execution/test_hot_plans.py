"""A completion finds its leaf, the dependents it locks and releases, and their dependencies by
index, whatever the planner knows (PostgreSQL).

The hot statements are prepared once per connection, and after five runs PostgreSQL may keep a
generic plan, made without the parameters' values. With the version's index and the primary key
looking equally cheap (a table without statistics), such a plan found a leaf through its
version and filtered out the version's every other node; with statistics, the release checked
each dependency by reading the version's every leaf. Both cost a 1,000-leaf plan milliseconds a
completion. Here the generic plans of a real completion's statements are explained on a plan of
600 leaves, before and after ANALYZE.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from execution import actions as execution
from planning.catalogue import sync_packs
from planning.models import NodeStatus, PlanNode
from tests.cases import scripted_case

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements' plans"),
]

LAYERS, WIDTH = 30, 20
NODE_TABLE = PlanNode._meta.db_table
# What may find a plan node: its primary key, or its version and key (the unique index).
BY_INDEX = {f"{NODE_TABLE}_pkey", "plan_node_key_unique"}


@pytest.fixture
def big_case(settings: Any, analyst: Any, officer: Any) -> Iterator[Any]:
    settings.CASEHUB_EXTRA_PACKS = ["tests.fakes.execution_pack.PACK"]
    # the scripted pack hangs every leaf under one method (the bench's pack groups them)
    settings.CASEHUB_PLAN_MAX_LEAVES = settings.CASEHUB_PLAN_MAX_FANOUT = LAYERS * WIDTH
    sync_packs()
    leaves = [
        {
            "key": f"l{layer}-{i}",
            "depends_on": [f"l{layer - 1}-{(i + k) % WIDTH}" for k in range(3)] if layer else [],
        }
        for layer in range(LAYERS)
        for i in range(WIDTH)
    ]
    case = scripted_case(analyst, officer, leaves)
    yield case


def _generic_plan(sql: str, params: Any) -> dict[str, Any]:
    """Return the generic plan (EXPLAIN, JSON) of a statement as the preparing cursor sends it."""
    if isinstance(params, dict):
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        text = re.sub(r"%\((\w+)\)s", number, sql)
        values = [params[name] for name in names]
    else:
        counter = iter(range(1, 1000))
        text = re.sub(r"%s", lambda _: f"${next(counter)}", sql)
        values = list(params)
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
        cursor.execute(f"PREPARE hot_plan AS {text}")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        marks = ", ".join(["%s"] * len(values))
        cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE hot_plan({marks})", values)
        (plan,) = cursor.fetchone()
        cursor.execute("DEALLOCATE hot_plan")
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def _node_scans(plan: dict[str, Any]) -> list[str]:
    """Return how the plan reads the plan-node table: an index's name, or the scan's type (a
    bitmap heap scan by the indexes under it)."""
    kind = plan["Node Type"]
    ours = plan.get("Relation Name") == NODE_TABLE
    found = []
    if ours and "Scan" in kind and kind != "Bitmap Heap Scan":
        found.append(plan.get("Index Name") or kind)
    for child in plan.get("Plans", []):
        if ours and kind == "Bitmap Heap Scan" and child["Node Type"].startswith("Bitmap"):
            found += _bitmap_indexes(child)
        else:
            found += _node_scans(child)
    return found


def _bitmap_indexes(plan: dict[str, Any]) -> list[str]:
    """Return the indexes of a bitmap (a Bitmap Index Scan, or a BitmapAnd or BitmapOr of them)."""
    if plan["Node Type"] == "Bitmap Index Scan":
        return [plan["Index Name"]]
    return [name for child in plan.get("Plans", []) for name in _bitmap_indexes(child)]


def _completion_statements(case: Any, key: str) -> list[tuple[str, Any]]:
    """Claim the case's leaf `key` and complete it (claiming the next); return the statements
    the completion sent, with their parameters."""
    first = PlanNode.objects.get(version=case.current_version, key=key)
    claim = execution.claim_leaf(first.pk, worker="w")
    sent: list[tuple[str, Any]] = []

    def keep(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        execution.complete_leaf(
            claim.node_id, claim.attempt, {}, leaf=claim.node, keep=1, worker="w"
        )
    return sent


@pytest.fixture
def small_case(settings: Any, analyst: Any, officer: Any) -> Iterator[Any]:
    settings.CASEHUB_EXTRA_PACKS = ["tests.fakes.execution_pack.PACK"]
    sync_packs()
    leaves = [
        {"key": f"s{layer}-{i}", "depends_on": [f"s0-{k}" for k in range(3)] if layer else []}
        for layer in range(2)
        for i in range(3)
    ]
    yield scripted_case(analyst, officer, leaves)


def test_a_completion_locks_its_dependents_by_key_in_a_small_table(small_case: Any) -> None:
    """A worker prepares a completion's statements on its first leaves and keeps their generic
    plans while its connection lives: planned on a table of a few nodes, the dependents' lock
    must still find each by its primary key, or it reads the whole table at every completion
    once the table has grown (a sequential scan in the bench's profile)."""
    sent = _completion_statements(small_case, "s0-0")
    (completing,) = [(sql, params) for sql, params in sent if '"completing" AS' in sql]
    assert '"pending" AS' in completing[0]  # the leaf has dependents: their lock is in it
    scans = _node_scans(_generic_plan(*completing))
    assert scans and set(scans) <= BY_INDEX, scans
    (release,) = [(sql, params) for sql, params in sent if "enqueued_at = %s" in sql]
    scans = _node_scans(_generic_plan(*release))
    assert scans and set(scans) <= BY_INDEX, scans


@pytest.mark.parametrize("analyzed", [False, True], ids=["no statistics", "analyzed"])
def test_a_completions_statements_find_plan_nodes_by_index(big_case: Any, analyzed: bool) -> None:
    if analyzed:
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {NODE_TABLE}")
    first = PlanNode.objects.get(version=big_case.current_version, key="l0-0")
    sent = _completion_statements(big_case, "l0-0")
    # The leaf's move (with its dependents' lock), their release, and the claim of the next
    # ready leaf (it released none: each leaf of the next layer waits for three): each read by
    # its key, or through the in-flight index (alone, or ANDed in a bitmap with the version's
    # entries of the key index), never the version's every node.
    in_flight = "plan_node_in_flight"
    hot = {
        "completing": ('"completing" AS', BY_INDEX, None),
        "release": ("enqueued_at = %s", BY_INDEX, None),
        "next ready": ("SKIP LOCKED", BY_INDEX | {in_flight}, in_flight),
    }
    for name, (mark, allowed, needed) in hot.items():
        found = [(sql, params) for sql, params in sent if mark in sql]
        assert len(found) == 1, (name, [sql[:80] for sql, _ in sent])
        scans = _node_scans(_generic_plan(*found[0]))
        assert scans and set(scans) <= allowed, (name, scans)
        assert needed is None or needed in scans, (name, scans)
    assert PlanNode.objects.get(pk=first.pk).status == NodeStatus.SUCCEEDED
