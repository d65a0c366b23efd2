"""The hot path's reads, written out and prepared (PostgreSQL).

Every leaf's claim and completion read the same few rows. Built by the ORM, each of these
statements was compiled anew on every leaf (`select_related`, `select_for_update`, the filters):
about a millisecond of the worker's CPU a leaf in all (bench/README.md, the profile). Here each is
written once and prepared once per connection (`web.db.prepared_cursor`); the rows come back as
the ORM's instances (`web.db.from_row`). The callers keep the ORM for SQLite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from audit.chain import Along
from audit.transitions import Audit
from execution.common import LEAF, OPEN_LEAF_STATUSES, RUNNING_CASE_STATUSES
from execution.models import ExecutionControl, TrustScore
from oversight.models import OPEN_GATE_STATUSES, Gate, GateKind, PolicyVersion
from planning.models import Agent, Case, NodeStatus, PlanNode, PlanVersion
from planning.transitions import move_leaf_from
from web.db import checked_on_the_row, columns, from_row, prepared_cursor

_NODE = f'"{PlanNode._meta.db_table}"'


def _literal(value: str) -> str:
    # The statuses and kinds below are the code's own constants, written into the SQL as they are.
    assert value.replace("_", "").isalnum(), value
    return f"'{value}'"


# What a claim of the leaf `n` checks, as four JSON columns (`execution.claiming` reads them):
# its gates (the plan's and its own, by id), its planned agent, that agent's trust scores and
# the active policy. Added to a statement that reads or moves the leaf anyway, so that a claim
# does not read them in one more round trip; that statement must not wait for a lock (SKIP
# LOCKED, or rows it holds already), or these would be read in a snapshot older than the row.
CLAIM_FACTS = (
    "(SELECT COALESCE(json_agg(json_build_object('id', g.id, 'kind', g.kind, "  # noqa: S608
    "'status', g.status, 'content_hash', g.content_hash, 'expires', g.approval_expires_at) "
    "ORDER BY g.id), '[]'::json) "
    f'FROM "{Gate._meta.db_table}" g WHERE g.version_id = n.version_id '
    f"AND (g.kind = {_literal(GateKind.PLAN)} OR (g.kind IN "
    f"({_literal(GateKind.STEP)}, {_literal(GateKind.ESCALATION)}) AND g.node_id = n.id))), "
    f'(SELECT row_to_json(a) FROM "{Agent._meta.db_table}" a WHERE a.slug = n.agent), '
    "(SELECT COALESCE(json_agg(json_build_object('id', s.id, 'agent_id', s.agent_id, "
    "'capability', s.capability, 'successes', s.successes, 'failures', s.failures, "
    "'updated_at', s.updated_at) ORDER BY s.capability), '[]'::json) "
    f'FROM "{TrustScore._meta.db_table}" s WHERE s.agent_id IN '
    f'(SELECT a.id FROM "{Agent._meta.db_table}" a WHERE a.slug = n.agent)), '
    "(SELECT json_build_object('number', p.number, 'values', p.values) "
    f'FROM "{PolicyVersion._meta.db_table}" p '
    f"WHERE p.status = {_literal(PolicyVersion.Status.ACTIVE)} ORDER BY p.number DESC LIMIT 1)"
)
_FACTS = 4  # the columns of CLAIM_FACTS
_NODE_FIELDS = len(PlanNode._meta.concrete_fields)
_VERSION_FIELDS = len(PlanVersion._meta.concrete_fields)

# The leaf with its version, its case and the stop switch. PostgreSQL locks the rows in the order
# the FROM clause names them, the node's first (docs/architecture.md, lock order).
_LEAF_WITH_CASE_SQL = (
    f"SELECT {columns('n', PlanNode)}, {columns('v', PlanVersion)}, {columns('c', Case)}, "  # noqa: S608
    f'EXISTS (SELECT 1 FROM "{ExecutionControl._meta.db_table}" x WHERE x.id = 1 AND x.stopped)'
    "{facts} "
    f"FROM {_NODE} n "
    f'JOIN "{PlanVersion._meta.db_table}" v ON v.id = n.version_id '
    f'JOIN "{Case._meta.db_table}" c ON c.id = v.case_id '
    "WHERE n.id = %s AND n.kind = %s "
)
# A completion: the leaf FOR UPDATE, its case FOR SHARE (completions of one case side by side).
_COMPLETING_SQL = _LEAF_WITH_CASE_SQL.format(facts="") + "FOR UPDATE OF n FOR SHARE OF c"
# A claim: the leaf FOR UPDATE unless another transaction holds it (that one sends or runs it),
# with what the claim checks.
# Only a leaf a claim may take is locked: a refusal (a duplicate message, a leaf a completion took
# first) then writes nothing, and its transaction commits without a flush.
_CLAIMING_SQL = (
    _LEAF_WITH_CASE_SQL.format(facts=f", {CLAIM_FACTS}")
    + f"AND n.status IN ({_literal(NodeStatus.READY)}, {_literal(NodeStatus.RETRYING)}) "
    + "FOR UPDATE OF n SKIP LOCKED"
)

# The pending leaves of a version among some ids, locked in id order (E11: of several parents
# ending at once, exactly one releases their common child: the ids come sorted, and the nested
# loop over them locks each in its turn). Each leaf is found by its primary key, one lookup per
# id, whatever the planner's statistics: written as `n.id = ANY(ids)`, a prepared statement's
# generic plan made while the table was small read the whole table at every completion (a
# sequential scan), for as long as the connection lived.
_PENDING_SQL = (
    f"SELECT {columns('l', PlanNode)} FROM unnest(%s::bigint[]) AS p(id) "  # noqa: S608
    f"CROSS JOIN LATERAL (SELECT n.* FROM {_NODE} n WHERE n.id = p.id "
    f"AND {checked_on_the_row('n.version_id', '%s')} "
    "AND n.kind = %s AND n.status = %s FOR UPDATE OF n) AS l"
)

# The first ready leaf of a version in the plan's order that no other transaction holds, with
# what its claim checks. The status is written out, not a parameter: then the planner may read
# the in-flight index (`plan_node_in_flight`: the few ready, running and retrying nodes of every
# version) instead of the version's every node.
_NEXT_READY_SQL = (
    f"SELECT {columns('n', PlanNode)}, {CLAIM_FACTS} FROM {_NODE} n "  # noqa: S608
    f"WHERE n.version_id = %s AND n.kind = %s AND n.status = {_literal(NodeStatus.READY)} "
    "AND n.id <> ALL(%s::bigint[]) ORDER BY n.position LIMIT 1 FOR UPDATE OF n SKIP LOCKED"
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
    transaction holds (SKIP LOCKED) instead of waiting for it, and reads what it checks with it
    (`with_claim_facts`).
    """
    with prepared_cursor() as cursor:
        cursor.execute(_CLAIMING_SQL if claiming else _COMPLETING_SQL, [node_id, LEAF])
        row = cursor.fetchone()
    if row is None:
        return None
    node, rest = _leaf_version_case(row)
    if claiming:
        with_claim_facts(node, rest)
    return node


_CASES = _NODE_FIELDS + _VERSION_FIELDS + len(Case._meta.concrete_fields)


def _leaf_version_case(row: Sequence[Any]) -> tuple[PlanNode, Sequence[Any]]:
    """Return the leaf of a row of its columns, its version's, its case's and the stop switch
    (`stopped`), with the version and case set; and the row's columns after those."""
    versions = _NODE_FIELDS + _VERSION_FIELDS
    node: PlanNode = from_row(PlanNode, row[:_NODE_FIELDS])
    version: PlanVersion = from_row(PlanVersion, row[_NODE_FIELDS:versions])
    version.case = from_row(Case, row[versions:_CASES])
    node.version = version
    node.stopped = bool(row[_CASES])  # type: ignore[attr-defined]
    return node, row[_CASES + 1 :]


def with_claim_facts(node: PlanNode, facts: Sequence[Any]) -> PlanNode:
    """Keep on `node` the `CLAIM_FACTS` columns a statement read with it, for its claim (in the
    same transaction) to check instead of reading them again."""
    assert len(facts) == _FACTS, facts
    node.claim_facts = tuple(facts)  # type: ignore[attr-defined]
    return node


def pending_lock(version_id: int, ids: Sequence[int], *, after: str = "") -> Along:
    """Return the lock of the version's `pending` leaves among `ids`, in id order, as a statement
    for another to run in its own (`audit.chain.Along`: a completion's move of its leaf); its
    `count` is then the number locked. `_PENDING_SQL` without reading the rows: the release that
    follows reads those it moves. `after` names a CTE read (and so locked) first; none are
    locked when it has no row."""
    # One primary-key lookup per id, in id order (`_PENDING_SQL`).
    sql = (
        '"pending" AS (SELECT l.id FROM unnest(%(pending_ids)s::bigint[]) AS p(id) '  # noqa: S608
        f"CROSS JOIN LATERAL (SELECT n.id FROM {_NODE} n WHERE n.id = p.id AND "
        f"{checked_on_the_row('n.version_id', '%(pending_version)s')} "
        "AND n.kind = %(pending_kind)s AND n.status = %(pending_status)s "
        + (f"AND (SELECT count(*) FROM {after}) > 0 " if after else "")  # noqa: S608
        + "FOR UPDATE OF n) AS l)"
    )
    params = {
        "pending_version": version_id,
        "pending_kind": LEAF,
        "pending_status": NodeStatus.PENDING,
        "pending_ids": sorted(ids),
    }
    return Along(ctes=[sql], params=params, first="pending")


def _aliased(alias: str, model: type[Any], prefix: str) -> str:
    return ", ".join(
        f'{alias}."{field.column}" AS "{prefix}{field.column}"'
        for field in model._meta.concrete_fields
    )


# A completion's leaf FOR UPDATE and its case FOR SHARE (the lock order of `_COMPLETING_SQL`),
# with its case and the stop switch: only while the case runs the leaf's version.
_COMPLETING_CTE = (
    f'"completing" AS (SELECT {_aliased("c", Case, "c_")}, '  # noqa: S608
    f'EXISTS (SELECT 1 FROM "{ExecutionControl._meta.db_table}" x WHERE x.id = 1 AND x.stopped) '
    'AS "stopped" '
    f"FROM {_NODE} n "
    f'JOIN "{Case._meta.db_table}" c ON c.id = %(done_case)s '
    "WHERE n.id = %(done_node)s AND n.kind = %(done_kind)s AND "
    f"{checked_on_the_row('n.version_id', '%(done_version)s')} "
    "AND c.current_version_id = n.version_id AND c.status = ANY(%(done_running)s) "
    "FOR UPDATE OF n FOR SHARE OF c)"
)
_CASE_FIELDS = len(Case._meta.concrete_fields)


def complete_in_one(
    leaf: PlanNode,
    attempt: int,
    *,
    dependents: Sequence[int],
    audit: Audit,
    **fields: Any,
) -> tuple[PlanNode, Along | None] | None:
    """Move a completing leaf `running → succeeded` with the fields in one statement that also
    locks the leaf and its case (FOR SHARE) and reads the case, and locks its pending
    `dependents` (`pending_lock`): the completion's first read and its move in one round trip.

    `leaf` is the leaf as its claim read it, with its version (a plan version does not change);
    only for the plain case: the leaf is `running` at `attempt` and its case runs its version.
    Returns `leaf` as moved (its status and the fields set, its version's case read again, the
    stop switch as `stopped`) and the dependents' lock (its `count` set; None without
    dependents); None when nothing moved, for the caller to read the leaf and see why (stale,
    cancelled, re-planned), `leaf` then as it was.
    """
    version = leaf.version
    source = Along(
        ctes=[_COMPLETING_CTE],
        params={
            "done_node": leaf.pk,
            "done_kind": LEAF,
            "done_version": version.pk,
            "done_case": version.case_id,
            "done_running": list(RUNNING_CASE_STATUSES),
            "done_attempt": attempt,
        },
        first="completing",
    )
    lock = None
    if dependents:
        lock = pending_lock(version.pk, dependents, after="completing")
        source = Along(
            ctes=[*source.ctes, *lock.ctes],
            params={**source.params, **lock.params},
            first="pending",
        )
    row = move_leaf_from(
        leaf.pk,
        before=NodeStatus.RUNNING,
        to=NodeStatus.SUCCEEDED,
        audit=audit,
        source=source,
        join='"completing" t',
        where="m.attempts = %(done_attempt)s",
        returning="t.*",
        instance=leaf,
        **fields,
    )
    if row is None:
        return None
    if lock is not None:
        lock.count = source.count
    # `leaf` is now the row as the statement left it: the claim's, moved (no one else writes a
    # running leaf but its worker's lease renewals, and the move clears the lease).
    version.case = from_row(Case, row[:_CASE_FIELDS])
    leaf.stopped = bool(row[_CASE_FIELDS])  # type: ignore[attr-defined]
    return leaf, lock


def locked_pending(version_id: int, ids: Sequence[int]) -> list[PlanNode]:
    """Return the version's `pending` leaves among `ids`, locked in id order."""
    with prepared_cursor() as cursor:
        cursor.execute(_PENDING_SQL, [sorted(ids), version_id, LEAF, NodeStatus.PENDING])
        rows = cursor.fetchall()
    return [from_row(PlanNode, row) for row in rows]


_STATUS_SQL = f"SELECT n.status FROM {_NODE} n WHERE n.id = %s AND n.kind = %s"  # noqa: S608


def leaf_status(node_id: int) -> str | None:
    """Return a leaf's status as committed (no lock), or None when there is no such leaf."""
    with prepared_cursor() as cursor:
        cursor.execute(_STATUS_SQL, [node_id, LEAF])
        row = cursor.fetchone()
    return None if row is None else str(row[0])


def next_ready(version_id: int, *, besides: Sequence[int] = ()) -> PlanNode | None:
    """Return the version's first `ready` leaf (the plan's order) no other transaction holds,
    but those of `besides`, locked, with what its claim checks (`with_claim_facts`)."""
    with prepared_cursor() as cursor:
        cursor.execute(_NEXT_READY_SQL, [version_id, LEAF, list(besides)])
        row = cursor.fetchone()
    if row is None:
        return None
    return with_claim_facts(from_row(PlanNode, row[:_NODE_FIELDS]), row[_NODE_FIELDS:])


def open_work(version_id: int) -> bool:
    """Tell whether the version still has an open leaf or an open gate: one statement."""
    params = [version_id, LEAF, list(OPEN_LEAF_STATUSES), version_id, list(OPEN_GATE_STATUSES)]
    with prepared_cursor() as cursor:
        cursor.execute(_OPEN_WORK_SQL, params)
        (found,) = cursor.fetchone()
    return bool(found)
