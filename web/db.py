"""A cursor for the hot statements: bound on the server and prepared once per connection."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import Model, signals
from django.db.models.base import ModelState


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
    # The connection itself, not the `connection` proxy: the wrapper asks it something on every
    # execute, and each question through the proxy is a thread-local lookup.
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    raw = _PreparingCursor(db.connection)
    if db.queries_logged:
        return _PreparedDebugWrapper(raw, db)
    return CursorWrapper(raw, db)


def checked_on_the_row(column: str, param: str) -> str:
    """Return an equality test of a NOT NULL `column` (SQL) with `param` that the planner checks
    on the rows it found and never uses to find them.

    For a row found by its primary key that must also belong to, say, a version: written as
    `=`, a prepared statement's generic plan may reach for the version's index instead (on
    tables without statistics the two look equally cheap) and read the version's every row.
    `IS NOT DISTINCT FROM` is the same test on a column that cannot be NULL, and no index serves
    it.
    """
    return f"{column} IS NOT DISTINCT FROM {param}"


@functools.cache
def columns(alias: str, model: type[Model]) -> str:
    """Return the model's columns as a written-out statement selects them (`from_row` reads
    them back), each qualified by the table's `alias` (built once: a completion's statements
    name them at every leaf)."""
    return ", ".join(f'{alias}."{field.column}"' for field in model._meta.concrete_fields)


def from_row(model: type[Model], values: Sequence[Any]) -> Any:
    """Return the model instance of a row's values (`columns`), converted as the ORM converts
    them."""
    db = connections[DEFAULT_DB_ALIAS]
    names, converters = _row_reading(model, db.vendor)
    if len(values) != len(names):
        raise ValueError(f"{model.__name__} has {len(names)} columns, not {len(values)}")
    converted = list(values)
    for i, convert, column in converters:
        converted[i] = convert(converted[i], column, db)
    if signals.pre_init.has_listeners(model) or signals.post_init.has_listeners(model):
        return model.from_db(db.alias, names, converted)
    # What `from_db` makes, without `Model.__init__`'s walk over the fields and its signals
    # (none listens): the row's values as the instance's attributes, loaded from `db`.
    instance = object.__new__(model)
    instance.__dict__.update(zip(names, converted, strict=True))
    state = instance._state = ModelState()
    state.adding = False
    state.db = db.alias
    return instance


@functools.cache
def _row_reading(model: type[Model], vendor: str) -> tuple[list[str], list[tuple[int, Any, Any]]]:
    """Return the model's column attribute names and, by position, the converters of database
    values the ORM applies to its columns — the backend's, then the field's — with the column
    they are given (read once per model and backend: a leaf's completion reads three rows).

    The backend's own matter on SQLite, whose driver hands a datetime back naive; the ORM makes it
    aware. They depend on the backend and the settings only, not on the thread's connection.
    """
    ops = connections[DEFAULT_DB_ALIAS].ops
    fields = model._meta.concrete_fields
    converters = []
    for i, field in enumerate(fields):
        column = field.get_col(model._meta.db_table)
        for convert in ops.get_db_converters(column) + column.get_db_converters(ops.connection):
            converters.append((i, convert, column))
    return [field.attname for field in fields], converters


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
