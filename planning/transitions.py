"""The state machines of a case's status and of a plan node's: their tables and move functions.

Nothing else assigns `Case.status` (a case is submitted `planning`) or `PlanNode.status` (a node
is stored `pending`). See `audit.transitions` for how a move is checked and audited.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone

from audit.chain import Along, NewEvent
from audit.transitions import (
    Audit,
    Moved,
    Transitions,
    move_row,
    move_row_along,
    move_row_from,
    move_rows,
)
from planning.models import Case, CaseStatus, NodeStatus, PlanNode
from web.db import checked_on_the_row, columns, from_row, prepared_cursor

__all__ = ["CASE", "NODE", "block_nodes", "move_case", "move_node", "move_nodes", "release_nodes"]

_C = CaseStatus

CASE = Transitions.of(
    "Case.status",
    {
        # Planned into a version awaiting approval, or planning failed for good.
        _C.PLANNING: {_C.AWAITING_APPROVAL, _C.PLAN_FAILED, _C.CANCELLED},
        _C.PLAN_FAILED: set(),
        # Its plan gate approved or rejected (an edit keeps it awaiting approval).
        _C.AWAITING_APPROVAL: {_C.APPROVED, _C.REJECTED, _C.CANCELLED},
        # The approving transaction starts execution at once; the moves of `executing` are open
        # to an approved case too (execution.common.RUNNING_CASE_STATUSES).
        _C.APPROVED: {
            _C.EXECUTING,
            _C.VERIFYING,
            _C.COMPLETED,
            _C.FAILED,
            _C.REJECTED,
            _C.CANCELLED,
            _C.AWAITING_APPROVAL,
        },
        # Every step ended: verified by the rules (then maybe the goal judge), or failed by a
        # step's `abort` policy; rejected by a step gate's rejection under `abort`; re-planned
        # after a failed step into a version awaiting approval.
        _C.EXECUTING: {
            _C.VERIFYING,
            _C.COMPLETED,
            _C.FAILED,
            _C.REJECTED,
            _C.CANCELLED,
            _C.AWAITING_APPROVAL,
        },
        # The goal judge's verdict (or no verdict after too many deliveries).
        _C.VERIFYING: {_C.COMPLETED, _C.FAILED, _C.CANCELLED},
        _C.COMPLETED: set(),
        _C.FAILED: set(),
        _C.CANCELLED: set(),
        _C.REJECTED: set(),
    },
)


def move_case(case: Case, *, to: str, audit: Audit, **fields: Any) -> str:
    """Move a case read under its row lock to `to`, with the fields that go with it; return its
    status before. Raises IllegalTransition (StaleTransition when it changed meanwhile)."""
    return move_row(
        CASE, case, to=to, audit=audit, label=f"case {case.pk}", updated_at=timezone.now(), **fields
    )


_N = NodeStatus
# What a step that ended in an earlier plan version keeps in the new one (planning.versions).
_KEPT = {_N.SUCCEEDED, _N.FAILED, _N.SKIPPED}

NODE = Transitions.of(
    "PlanNode.status",
    {
        # Gated when its version's gates open; released once the steps it needs succeeded;
        # blocked when one of them will not; or keeps what it ended as in an earlier version.
        _N.PENDING: {_N.AWAITING_APPROVAL, _N.READY, _N.BLOCKED, _N.CANCELLED, *_KEPT},
        # Its gate (a step gate or an escalation) approved, rejected (skipped under `continue`,
        # failed under `abort`, or for good after an escalation), or it ended in an earlier version.
        _N.AWAITING_APPROVAL: {_N.PENDING, _N.BLOCKED, _N.CANCELLED, *_KEPT},
        # Claimed by a worker; back to waiting when its approval no longer holds or its routing
        # escalates.
        _N.READY: {_N.RUNNING, _N.PENDING, _N.AWAITING_APPROVAL, _N.BLOCKED, _N.CANCELLED},
        # Its attempt ends: succeeded, failed (for good, or to be retried, or escalated), stopped at
        # a safe point or recovered from a lost worker (ready again), cancelled.
        _N.RUNNING: {
            _N.SUCCEEDED,
            _N.FAILED,
            _N.RETRYING,
            _N.READY,
            _N.AWAITING_APPROVAL,
            _N.CANCELLED,
        },
        # Ready again once its wait is over (or claimed by the retry's own message).
        _N.RETRYING: {
            _N.READY,
            _N.RUNNING,
            _N.PENDING,
            _N.AWAITING_APPROVAL,
            _N.BLOCKED,
            _N.CANCELLED,
        },
        _N.SUCCEEDED: set(),
        _N.FAILED: set(),
        _N.SKIPPED: set(),
        _N.CANCELLED: set(),
        _N.BLOCKED: set(),
    },
)


def move_node(
    node: PlanNode, *, to: str, audit: Audit, along: Along | None = None, **fields: Any
) -> str:
    """Move a plan node read under its lock to `to`, with the fields that go with it; return its
    status before. Raises IllegalTransition (StaleTransition when it changed meanwhile).
    `along`: the caller's statements run in the move's (`audit.transitions.move_row`)."""
    label = f"node {node.key} ({node.pk})"
    return move_row(NODE, node, to=to, audit=audit, label=label, along=along, **fields)


def move_node_along(node: PlanNode, *, to: str, audit: Audit, name: str, **fields: Any) -> None:
    """Move a plan node read under its lock to `to` in the statement of the block's append
    (PostgreSQL; `audit.transitions.move_row_along`: checked and covered now, changed then)."""
    label = f"node {node.key} ({node.pk})"
    move_row_along(NODE, node, to=to, audit=audit, name=name, label=label, **fields)


def move_leaf_from(
    node_id: int, *, before: str, to: str, audit: Audit, **options: Any
) -> tuple[Any, ...] | None:
    """Move a plan node from `before` to `to` in one statement with the caller's reads and locks
    (`source`), if `where` holds; return the `returning` values, or None when nothing moved.
    `options` are `audit.transitions.move_row_from`'s (`source`, `where`, `returning`, `join`)
    and the fields that go with the move (PostgreSQL)."""
    return move_row_from(
        NODE,
        PlanNode,
        node_id,
        before=before,
        to=to,
        audit=audit,
        label=f"node {node_id}",
        **options,
    )


def move_nodes(
    nodes: QuerySet[PlanNode] | Sequence[PlanNode],
    *,
    to: str,
    audit: Audit,
    from_: Iterable[str] | None = None,
    **fields: Any,
) -> list[Moved]:
    """Move, set-based, the nodes in one of the `from_` statuses (by default every status that may
    move to `to`) to `to`; return them, each with its `key`. `nodes` is a query, or nodes the
    caller locked already. Raises IllegalTransition as `move_rows` does."""
    return move_rows(NODE, nodes, to=to, audit=audit, from_=from_, read=("key",), **fields)


# The locked pending nodes of the list whose every dependency (a leaf key of the same version)
# is a leaf that succeeded, made ready in one statement: the check reads the statuses in the
# UPDATE's own snapshot, taken after the nodes were locked (a parent that committed meanwhile
# counts, E11). Each dependency's status is a scalar subquery, so it is one lookup in the
# (version, key) index whatever the planner's statistics: as an anti-join over the set of keys
# (which it guesses at 100) a prepared statement's generic plan read the version's every node
# for each node released.
_RELEASE_SQL = """
UPDATE {table} n SET status = %s, enqueued_at = %s
 WHERE n.id = ANY(%s) AND n.status = %s
   AND NOT EXISTS (
     SELECT 1 FROM jsonb_array_elements_text(n.depends_on) AS dep(key)
      WHERE (SELECT d.status FROM {table} d
              WHERE d.version_id = n.version_id AND d.kind = %s AND d.key = dep.key)
            IS DISTINCT FROM %s)
RETURNING n.id{returning}
"""


def release_nodes(
    nodes: Sequence[PlanNode], *, audit: Audit, enqueued_at: datetime, returning: str = ""
) -> list[PlanNode]:
    """Make `ready` the nodes, `pending` and locked by the caller, whose dependencies all
    succeeded; return them (their attributes set). One UPDATE on PostgreSQL, which checks the
    dependencies itself; elsewhere one query reads their statuses first. Raises
    IllegalTransition as `move_rows` does.

    `returning` (PostgreSQL) is more columns for the UPDATE to return of each node it moved (SQL
    over the node as `n`); each returned node has them as its `returned` tuple.
    """
    pending = [n for n in nodes if n.status == NodeStatus.PENDING]
    if not pending:
        return []
    if connection.vendor != "postgresql":
        if returning:
            raise ValueError("columns returned by the release are PostgreSQL's")
        waited_for = {dep for node in pending for dep in node.depends_on}
        statuses = dict(
            PlanNode.objects.filter(
                version_id=pending[0].version_id, kind=PlanNode.Kind.LEAF, key__in=waited_for
            ).values_list("key", "status")
        )
        ready = [
            node
            for node in pending
            if all(statuses.get(dep) == NodeStatus.SUCCEEDED for dep in node.depends_on)
        ]
        if ready:
            move_nodes(ready, to=NodeStatus.READY, audit=audit, enqueued_at=enqueued_at)
        return ready
    NODE.check(NodeStatus.PENDING, NodeStatus.READY)
    audit.require_open()
    with prepared_cursor() as cursor:
        cursor.execute(
            _RELEASE_SQL.format(
                table=connection.ops.quote_name(PlanNode._meta.db_table),
                returning=f", {returning}" if returning else "",
            ),
            [
                NodeStatus.READY, enqueued_at, [n.pk for n in pending], NodeStatus.PENDING,
                PlanNode.Kind.LEAF, NodeStatus.SUCCEEDED,
            ],
        )  # fmt: skip
        moved = {row[0]: tuple(row[1:]) for row in cursor.fetchall()}
    ready = [node for node in pending if node.pk in moved]
    if returning:
        for node in ready:
            node.returned = moved[node.pk]  # type: ignore[attr-defined]
    audit.cover(Moved(n.pk, NodeStatus.PENDING, NodeStatus.READY, {"key": n.key}) for n in ready)
    for node in ready:
        node.status = NodeStatus.READY
        node.enqueued_at = enqueued_at
    return ready


@functools.cache
def _release_locked_sql(returning: str) -> str:
    """Return `release_locked`'s statement returning the nodes' columns and `returning` (built
    once per caller's columns: a completion releases at every leaf)."""
    table = connection.ops.quote_name(PlanNode._meta.db_table)
    return _RELEASE_SQL.format(
        table=table, returning=f", {columns('n', PlanNode)}, {returning}"
    ).replace(
        "WHERE n.id = ANY(%s)",
        f"WHERE n.id = ANY(%s) AND {checked_on_the_row('n.version_id', '%s')}",
    )


def release_locked(
    version_id: int, ids: Sequence[int], *, audit: Audit, enqueued_at: datetime, returning: str
) -> list[PlanNode]:
    """Make `ready` the leaves among `ids` (of one version) that are `pending`, locked by the
    caller already, and whose dependencies all succeeded: `release_nodes` for a caller that
    locked them without reading them (PostgreSQL). Returns them read from the UPDATE, each with
    the `returning` columns (SQL over the node as `n`) as its `returned` tuple, in id order."""
    if connection.vendor != "postgresql":
        raise ValueError("releasing leaves by id is PostgreSQL's; see release_nodes")
    NODE.check(NodeStatus.PENDING, NodeStatus.READY)
    audit.require_open()
    fields = len(PlanNode._meta.concrete_fields)
    with prepared_cursor() as cursor:
        cursor.execute(
            _release_locked_sql(returning),
            [
                NodeStatus.READY, enqueued_at, list(ids), version_id, NodeStatus.PENDING,
                PlanNode.Kind.LEAF, NodeStatus.SUCCEEDED,
            ],
        )  # fmt: skip
        rows = sorted(cursor.fetchall(), key=lambda row: row[0])
    ready = []
    for row in rows:
        node = from_row(PlanNode, row[1 : 1 + fields])
        node.returned = tuple(row[1 + fields :])
        ready.append(node)
    audit.cover(Moved(n.pk, NodeStatus.PENDING, NodeStatus.READY, {"key": n.key}) for n in ready)
    return ready


def block_nodes(
    nodes: QuerySet[PlanNode],
    *,
    audit: Audit,
    why: str,
    actor: User | None = None,
    from_: Iterable[str] | None = None,
) -> list[str]:
    """Block the nodes of the query that are still waiting (a running one ends on its own), each
    with an event of its own, `planning.node.blocked`; return their keys."""
    moved = move_nodes(nodes, to=NodeStatus.BLOCKED, audit=audit, from_=from_)
    audit.add(
        *(
            NewEvent(
                "planning.node.blocked",
                actor,
                {
                    "node": node.values["key"],
                    "why": why,
                    "before": {"status": node.before},
                    "after": {"status": node.after},
                },
            )
            for node in moved
        )
    )
    return [node.values["key"] for node in moved]
