"""The hot path's reads, written out and prepared (PostgreSQL).

Every leaf's claim and completion read the same few rows. Built by the ORM, each of these
statements was compiled anew on every leaf (`select_related`, `select_for_update`, the filters):
about a millisecond of the worker's CPU a leaf in all (bench/README.md, the profile). Here each is
written once and prepared once per connection (`web.db.prepared_cursor`); the rows come back as
the ORM's instances (`web.db.from_row`). The callers keep the ORM for SQLite.
"""

from __future__ import annotations

from collections.abc import Sequence

from execution.common import LEAF, OPEN_LEAF_STATUSES
from execution.models import ExecutionControl
from oversight.models import OPEN_GATE_STATUSES, Gate
from planning.models import Case, NodeStatus, PlanNode, PlanVersion
from web.db import columns, from_row, prepared_cursor

_NODE = f'"{PlanNode._meta.db_table}"'
_NODE_FIELDS = len(PlanNode._meta.concrete_fields)
_VERSION_FIELDS = len(PlanVersion._meta.concrete_fields)

# The leaf with its version, its case and the stop switch. PostgreSQL locks the rows in the order
# the FROM clause names them, the node's first (docs/architecture.md, lock order).
_LEAF_WITH_CASE_SQL = (
    f"SELECT {columns('n', PlanNode)}, {columns('v', PlanVersion)}, {columns('c', Case)}, "  # noqa: S608
    f'EXISTS (SELECT 1 FROM "{ExecutionControl._meta.db_table}" x WHERE x.id = 1 AND x.stopped) '
    f"FROM {_NODE} n "
    f'JOIN "{PlanVersion._meta.db_table}" v ON v.id = n.version_id '
    f'JOIN "{Case._meta.db_table}" c ON c.id = v.case_id '
    "WHERE n.id = %s AND n.kind = %s "
)
# A completion: the leaf FOR UPDATE, its case FOR SHARE (completions of one case side by side).
_COMPLETING_SQL = _LEAF_WITH_CASE_SQL + "FOR UPDATE OF n FOR SHARE OF c"
# A claim: the leaf FOR UPDATE unless another transaction holds it (that one sends or runs it).
_CLAIMING_SQL = _LEAF_WITH_CASE_SQL + "FOR UPDATE OF n SKIP LOCKED"

# The pending leaves of a version among some ids, locked in id order (E11: of several parents
# ending at once, exactly one releases their common child).
_PENDING_SQL = (
    f"SELECT {columns('n', PlanNode)} FROM {_NODE} n "  # noqa: S608
    "WHERE n.version_id = %s AND n.kind = %s AND n.status = %s AND n.id = ANY(%s) "
    "ORDER BY n.id FOR UPDATE OF n"
)

# The first ready leaf of a version in the plan's order that no other transaction holds.
_NEXT_READY_SQL = (
    f"SELECT {columns('n', PlanNode)} FROM {_NODE} n "  # noqa: S608
    "WHERE n.version_id = %s AND n.kind = %s AND n.status = %s "
    "ORDER BY n.position LIMIT 1 FOR UPDATE OF n SKIP LOCKED"
)

# Whether a version still has an open leaf or an open gate.
_OPEN_WORK_SQL = (
    f"SELECT EXISTS (SELECT 1 FROM {_NODE} n "  # noqa: S608
    "WHERE n.version_id = %s AND n.kind = %s AND n.status = ANY(%s)) "
    f'OR EXISTS (SELECT 1 FROM "{Gate._meta.db_table}" g '
    "WHERE g.version_id = %s AND g.status = ANY(%s))"
)


def leaf_with_case(node_id: int, *, claiming: bool) -> PlanNode | None:
    """Return the leaf, locked FOR UPDATE, with its version and case set and the stop switch as
    its `stopped`; None when there is no such leaf or (`claiming`) another transaction holds it.

    A completion (`claiming` False) also locks the case FOR SHARE; a claim skips a leaf another
    transaction holds (SKIP LOCKED) instead of waiting for it.
    """
    with prepared_cursor() as cursor:
        cursor.execute(_CLAIMING_SQL if claiming else _COMPLETING_SQL, [node_id, LEAF])
        row = cursor.fetchone()
    if row is None:
        return None
    versions = _NODE_FIELDS + _VERSION_FIELDS
    node: PlanNode = from_row(PlanNode, row[:_NODE_FIELDS])
    version: PlanVersion = from_row(PlanVersion, row[_NODE_FIELDS:versions])
    version.case = from_row(Case, row[versions:-1])
    node.version = version
    node.stopped = bool(row[-1])  # type: ignore[attr-defined]
    return node


def locked_pending(version_id: int, ids: Sequence[int]) -> list[PlanNode]:
    """Return the version's `pending` leaves among `ids`, locked in id order."""
    with prepared_cursor() as cursor:
        cursor.execute(_PENDING_SQL, [version_id, LEAF, NodeStatus.PENDING, list(ids)])
        rows = cursor.fetchall()
    return [from_row(PlanNode, row) for row in rows]


def next_ready(version_id: int) -> PlanNode | None:
    """Return the version's first `ready` leaf (the plan's order) no other transaction holds,
    locked."""
    with prepared_cursor() as cursor:
        cursor.execute(_NEXT_READY_SQL, [version_id, LEAF, NodeStatus.READY])
        row = cursor.fetchone()
    return from_row(PlanNode, row) if row is not None else None


def open_work(version_id: int) -> bool:
    """Tell whether the version still has an open leaf or an open gate: one statement."""
    params = [version_id, LEAF, list(OPEN_LEAF_STATUSES), version_id, list(OPEN_GATE_STATUSES)]
    with prepared_cursor() as cursor:
        cursor.execute(_OPEN_WORK_SQL, params)
        (found,) = cursor.fetchone()
    return bool(found)
