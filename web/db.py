"""A cursor for the hot statements: bound on the server and prepared once per connection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from django.db import connection, connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import Model


class _PreparingCursor(psycopg.Cursor[Any]):
    """A cursor that binds on the server and prepares what it runs, once per connection.

    Only where the connection allows it: Django turns preparing off, and the settings turn it
    back on (`CASEHUB_DB_PREPARED_STATEMENTS`); otherwise it binds on the server unprepared.
    """

    def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
        options.setdefault("prepare", True)
        return super().execute(query, params, **options)


class _PreparedDebugWrapper(CursorDebugWrapper):
    """Django's query log for a preparing cursor: the statement's own text.

    Django would rebuild it from the cursor (`last_executed_query`), which for a prepared
    statement gives "QUERY = '…' - PARAMS = …": tests and tools that read the log (which tables
    a request writes, say) would not see the statement's verb.
    """

    def execute(self, sql: Any, params: Any = None) -> Any:
        with self.debug_sql(sql, params, use_last_executed_query=False):
            return CursorWrapper.execute(self, sql, params)


def prepared_cursor() -> Any:
    """Return a Django cursor over a preparing cursor on the default (PostgreSQL) connection.

    Django's cursors bind on the client, so the server parses and plans each statement anew; a
    statement run for every audit event or every leaf is worth preparing once. Wrapped as Django
    wraps its own (query logging, execute wrappers, errors as `django.db` errors). Parameters
    are sent typed: a statement where the server cannot tell a parameter's type needs a cast.
    """
    connection.ensure_connection()
    raw = _PreparingCursor(connection.connection)
    if connection.queries_logged:
        return _PreparedDebugWrapper(raw, connection)
    return CursorWrapper(raw, connection)


def columns(alias: str, model: type[Model]) -> str:
    """Return the model's columns as a written-out statement selects them (`from_row` reads
    them back), each qualified by the table's `alias`."""
    return ", ".join(f'{alias}."{field.column}"' for field in model._meta.concrete_fields)


def from_row(model: type[Model], values: Sequence[Any]) -> Any:
    """Return the model instance of a row's values (`columns`), converted as the ORM converts
    them."""
    fields = model._meta.concrete_fields
    converted = [
        field.from_db_value(value, None, connection) if hasattr(field, "from_db_value") else value
        for field, value in zip(fields, values, strict=True)
    ]
    return model.from_db(connection.alias, [field.attname for field in fields], converted)


def keep_connections(seconds: int | None) -> None:
    """Keep this process's database connections open `seconds` between uses (None: for ever).

    Django's own setting (`CONN_MAX_AGE`) serves the web server, where `0` closes a connection
    at the end of each request. A Celery worker closes its connections after every task by the
    same setting: a new connection a task, its backend process started by the server and its
    prepared statements prepared again. A worker keeps them instead (health-checked before reuse,
    and closed by the worker after a task that saw a database error).
    """
    for alias in connections:
        connections.settings[alias]["CONN_MAX_AGE"] = seconds
        wrapper = connections[alias]
        wrapper.settings_dict["CONN_MAX_AGE"] = seconds
        if wrapper.connection is not None:
            wrapper.close_at = None
