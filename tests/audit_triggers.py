"""Suspend the audit table's append-only triggers inside one transaction of the test database.

The test suite's flush (TransactionTestCase) empties every table, and the tamper tests play a
superuser who edits events; both need the triggers out of the way for one transaction, and only
that one: the suspension is undone at its end, or rolled back with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection as default_connection

TABLE = "oversight_auditevent"
_PG_ENABLE = {"O": "ENABLE", "A": "ENABLE ALWAYS", "R": "ENABLE REPLICA", "D": "DISABLE"}


@contextmanager
def audit_triggers_suspended(connection: Any = default_connection) -> Iterator[None]:
    """Switch the audit table's triggers off until the block ends, then restore them as they were.

    Raises RuntimeError outside a transaction: a failure inside the block must roll back with it.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("suspend the audit triggers inside transaction.atomic()")
    table = connection.ops.quote_name(TABLE)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT tgname, tgenabled FROM pg_trigger"
                " WHERE tgrelid = %s::regclass AND NOT tgisinternal",
                [TABLE],
            )
            states = cursor.fetchall()
            # ALTER TABLE refuses while rows of this transaction await their deferred foreign-key
            # checks: run the checks now (every deferrable constraint here is initially deferred).
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        else:
            cursor.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s",
                [TABLE],
            )
            states = cursor.fetchall()
            for name, _sql in states:
                cursor.execute(f"DROP TRIGGER {connection.ops.quote_name(name)}")
    yield
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            for name, state in states:
                quoted = connection.ops.quote_name(name)
                cursor.execute(f"ALTER TABLE {table} {_PG_ENABLE[state]} TRIGGER {quoted}")
            cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        else:
            for _name, sql in states:
                cursor.execute(sql)


def audit_trigger_states(connection: Any = default_connection) -> dict[str, str]:
    """Return the audit table's triggers by name: PostgreSQL's enabled state, SQLite's 'present'."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT tgname, tgenabled FROM pg_trigger"
                " WHERE tgrelid = %s::regclass AND NOT tgisinternal",
                [TABLE],
            )
            return {name: str(state) for name, state in cursor.fetchall()}
        cursor.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s", [TABLE]
        )
        return {name: "present" for (name,) in cursor.fetchall()}
