"""Status fields as state machines: a table of the allowed moves, and moves that are audited.

The four status fields that carry a case's life — `Case.status` and `PlanNode.status`
(`planning/transitions.py`), `Gate.status` (`oversight/transitions.py`) and `WorkItem.status`
(`execution/transitions.py`) — each have one `Transitions` table in the app that owns the model,
and move functions built on `move_row` and `move_rows` here. Nothing else assigns those fields
(`tests/test_architecture.py` reads the source for it).

A move checks its `from → to` pair against the table and changes the row only if it still has
the status it was read with (the row's lock: a single move compares and sets in one UPDATE; a
bulk move locks the rows it changes). It belongs to an `audited` block: the block's events are
appended in the move's transaction, at the block's end or at once (`Audit.add(..., now=True)`),
and a block that moved a row but appended no event raises instead of committing — every status
change has its event, in the same transaction (RELIABILITY S8).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model, QuerySet

from audit.chain import Along, NewEvent, append_events
from web.db import prepared_cursor

__all__ = [
    "Audit",
    "IllegalTransition",
    "Moved",
    "StaleTransition",
    "Transitions",
    "UnauditedMove",
    "audited",
    "move_row",
    "move_row_along",
    "move_row_from",
    "move_rows",
]


class IllegalTransition(Exception):
    """A move the field's table does not allow (a programming error: 500, not an answer)."""

    def __init__(self, field: str, before: str, after: str, *, row: str = "") -> None:
        self.field, self.before, self.after, self.row = field, before, after, row
        where = f" ({row})" if row else ""
        super().__init__(f"{field}: {before} → {after} is not an allowed transition{where}")


class StaleTransition(IllegalTransition):
    """The row's status changed after the caller read it: it moved a row it had not locked."""

    def __init__(self, field: str, before: str, after: str, *, row: str, actual: str | None):
        super().__init__(field, before, after, row=row)
        self.actual = actual
        self.args = (
            f"{field}: {before} → {after} of {row}, but the row is {actual} now: "
            "read it under its lock before moving it",
        )


class UnauditedMove(Exception):
    """An `audited` block moved a status but appended no audit event."""


@dataclass(frozen=True, slots=True)
class Transitions:
    """The allowed moves of one status field: each status → the statuses it may move to.

    A status with no moves is an end. A status never moves to itself (that is no change).
    """

    field: str
    moves: Mapping[str, frozenset[str]]

    @classmethod
    def of(cls, field: str, moves: Mapping[str, Iterable[str]]) -> Transitions:
        """Build a table; raise ValueError for a move to a status the table does not list."""
        table = {
            str(before): frozenset(str(after) for after in afters)
            for before, afters in moves.items()
        }
        for before, afters in table.items():
            unknown = sorted(afters - table.keys())
            if unknown:
                raise ValueError(f"{field}: {before} moves to unknown statuses {unknown}")
            if before in afters:
                raise ValueError(f"{field}: {before} may not move to itself")
        return cls(field, table)

    @property
    def statuses(self) -> tuple[str, ...]:
        return tuple(self.moves)

    @property
    def ends(self) -> tuple[str, ...]:
        """Return the statuses nothing moves on from."""
        return tuple(status for status, afters in self.moves.items() if not afters)

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """Return every allowed (from, to) pair, in the table's order."""
        return tuple(
            (before, after)
            for before, afters in self.moves.items()
            for after in sorted(afters, key=list(self.moves).index)
        )

    def allows(self, before: str, after: str) -> bool:
        return str(after) in self.moves.get(str(before), frozenset())

    def check(self, before: str, after: str, *, row: str = "") -> None:
        """Raise IllegalTransition unless the table allows `before → after`."""
        if not self.allows(before, after):
            raise IllegalTransition(self.field, str(before), str(after), row=row)

    def sources(self, after: str) -> frozenset[str]:
        """Return the statuses that may move to `after`."""
        return frozenset(before for before, afters in self.moves.items() if str(after) in afters)


@dataclass(frozen=True, slots=True)
class Moved:
    """One row a move changed: its id, its status before and after, and the values it read."""

    pk: int
    before: str
    after: str
    values: Mapping[str, Any] = field(default_factory=dict)


class Audit:
    """The audit events of one `audited` block and the status moves they cover."""

    __slots__ = ("_along", "_appended", "_checks", "_open", "_pending", "chain", "moved")

    def __init__(self, chain: str) -> None:
        self.chain = chain
        self.moved: list[Moved] = []
        self._pending: list[NewEvent] = []
        self._along: list[Along] = []
        # the moves run along the append (`move_row_along`): each set must change one row
        self._checks: list[tuple[Along, Callable[[], StaleTransition]]] = []
        self._appended = 0
        self._open = True

    def add(self, *events: NewEvent, now: bool = False) -> None:
        """Append `events` to the block's chain when the block ends, in the order added.

        `now` appends them (and any added before) at once: before the block takes a row (the
        deadline sweeps' lock order) or so that they precede the events of a block nested in it.
        """
        self.require_open()
        self._pending.extend(events)
        if now:
            self._flush()

    def along(self, writes: Along) -> None:
        """Run the caller's `writes` with the block's next append (PostgreSQL: in one statement
        when that append is of one event; `audit.chain.Along`), after any given before. Their
        row count is in `writes.count` once the block has ended."""
        self.require_open()
        self._along.append(writes)

    def cover(self, moved: Iterable[Moved]) -> None:
        """Record moves the block's events cover (the move functions call it)."""
        self.require_open()
        self.moved.extend(moved)

    def require_open(self) -> None:
        """Raise RuntimeError unless the audited block is still open (a move checks it first)."""
        if not self._open:
            raise RuntimeError("the audited block of this move has ended")

    def _flush(self) -> None:
        if self._pending or self._along:
            append_events(self._pending, chain=self.chain, along=self._along)
            self._appended += len(self._pending)
            self._pending = []
            self._along = []
        for writes, stale in self._checks:
            if writes.count != 1:
                raise stale()
        self._checks = []

    def _close(self) -> None:
        self._open = False
        if self.moved and not (self._pending or self._appended):
            changed = ", ".join(f"{m.pk}: {m.before} → {m.after}" for m in self.moved[:5])
            raise UnauditedMove(f"status moved without an audit event ({changed})")
        self._flush()


@contextmanager
def audited(*, chain: str) -> Iterator[Audit]:
    """Open a block whose status moves are covered by the events added to it, all in one
    transaction (the caller's, or one of its own).

    The events are appended to `chain` when the block ends (or when added `now`). Raises
    UnauditedMove, rolling the caller's transaction back, for a block that moved a status but
    added no event; an exception inside the block appends nothing.
    """
    with transaction.atomic(savepoint=False):
        audit = Audit(chain)
        try:
            yield audit
        except BaseException:
            audit._open = False
            raise
        audit._close()


def move_row(
    table: Transitions,
    row: Any,
    *,
    to: str,
    audit: Audit,
    label: str = "",
    along: Along | None = None,
    **fields: Any,
) -> str:
    """Move one row from the status it was read with to `to`, with the fields that go with it;
    set them on `row` too and return the status it had.

    The UPDATE compares and sets: it changes the row only if its status is still the one read.
    Raises IllegalTransition for a pair the table does not allow, and StaleTransition when the
    row's status changed since it was read (the caller had not locked it). `along`
    (PostgreSQL) is the caller's statements to run in the UPDATE's (`audit.chain.Along`; its
    `first` before the row changes).
    """
    before = str(row.status)
    label = label or f"{type(row).__name__} {row.pk}"
    table.check(before, to, row=label)
    audit.cover([Moved(row.pk, before, str(to))])
    model = type(row)
    changed = _compare_and_set(model, row.pk, before, str(to), fields, along=along)
    if changed != 1:
        raise _stale(model, row.pk, table.field, before, str(to), label=label)
    row.status = to
    for name, value in fields.items():
        setattr(row, name, value)
    return before


def _stale(
    model: type[Model], pk: Any, field: str, before: str, to: str, *, label: str
) -> StaleTransition:
    """Return the error of a compare-and-set that changed no row, with the row's status now."""
    actual = model._default_manager.filter(pk=pk).values_list("status", flat=True).first()
    return StaleTransition(field, before, to, row=label, actual=actual)


def _compare_and_set(
    model: type[Model],
    pk: Any,
    before: str,
    to: str,
    fields: Mapping[str, Any],
    *,
    along: Along | None = None,
) -> int:
    """Set the row's status to `to` and the fields, if its status is still `before`; return the
    rows changed (0 or 1).

    On PostgreSQL a prepared UPDATE (one per model and set of fields, written once), its values
    prepared by their fields as the ORM's `update()` prepares them: transitions run on every
    step of every case, and compiling the ORM's UPDATE cost more than running it. Elsewhere, and
    for a value that is an expression, the ORM's `update()`.
    """
    expressions = any(hasattr(value, "resolve_expression") for value in fields.values())
    db = connections[DEFAULT_DB_ALIAS]  # not the `connection` proxy: a lookup per question
    if along is not None and (db.vendor != "postgresql" or expressions):
        raise ValueError("statements along a move are PostgreSQL's, with plain values")
    if db.vendor != "postgresql" or expressions:
        return int(model._default_manager.filter(pk=pk, status=before).update(status=to, **fields))
    sql, columns = _update_statement(model, tuple(fields))
    values = [
        _db_value(column, value, db) for column, value in zip(columns, fields.values(), strict=True)
    ]
    with prepared_cursor() as cursor:
        if along is None:
            cursor.execute(sql, [to, *values, pk, before])
            return int(cursor.rowcount)
        # The caller's statements first (`first` forced before the row changes), their count
        # returned with the row: named parameters, the UPDATE's as `cas0`, `cas1`, …
        named = iter(f"%(cas{i})s" for i in range(len(values) + 3))
        update = sql.replace("%s", "{}").format(*named)
        params = {f"cas{i}": v for i, v in enumerate([to, *values, pk, before])}
        if along.params.keys() & params.keys():
            raise ValueError("parameters of statements along a move clash")
        cursor.execute(
            f"WITH {', '.join(along.ctes)} {update} "  # noqa: S608
            f"AND (SELECT count(*) FROM {along.first}) >= 0 "
            f"RETURNING (SELECT count(*) FROM {along.first})",
            {**along.params, **params},
        )
        row = cursor.fetchone()
        along.count = int(row[0]) if row is not None else None
        return 1 if row is not None else 0


def move_row_along(
    table: Transitions,
    row: Any,
    *,
    to: str,
    audit: Audit,
    name: str,
    label: str = "",
    **fields: Any,
) -> None:
    """Move one row read under its lock, as `move_row` does, but in the statement of the block's
    append (PostgreSQL, `Audit.along`): one round trip less for a row whose move the block's
    event records anyway. `name` names its CTE (unique in the block).

    The move is checked against the table and covered now, and the row's attributes are set;
    the compare-and-set runs with the append, and a row that did not change then raises
    StaleTransition as the block ends (its transaction rolls back). Until then the row is
    unchanged in the database: a query of the block that follows sees its status before.
    """
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql":
        raise ValueError("a move along an append is PostgreSQL's; see move_row")
    before = str(row.status)
    label = label or f"{type(row).__name__} {row.pk}"
    table.check(before, to, row=label)
    audit.require_open()
    model: type[Model] = type(row)
    sql, columns = _update_statement(model, tuple(fields))
    values = [to]
    for column, value in zip(columns, fields.values(), strict=True):
        if hasattr(value, "resolve_expression"):
            raise ValueError("a move along an append takes plain values")
        values.append(_db_value(column, value, db))
    values += [row.pk, before]
    update = sql.replace("%s", "{}").format(*(f"%({name}_{i})s" for i in range(len(values))))
    writes = Along(
        ctes=[f'"{name}" AS ({update} RETURNING 1)'],
        params={f"{name}_{i}": value for i, value in enumerate(values)},
        first=name,
    )
    audit.along(writes)
    audit._checks.append(
        (writes, lambda: _stale(model, row.pk, table.field, before, str(to), label=label))
    )
    audit.cover([Moved(row.pk, before, str(to))])
    row.status = to
    for name_, value in fields.items():
        setattr(row, name_, value)


def move_row_from(
    table: Transitions,
    model: type[Model],
    pk: Any,
    *,
    before: str,
    to: str,
    audit: Audit,
    source: Along,
    where: str,
    returning: str,
    join: str = "",
    label: str = "",
    instance: Model | None = None,
    **fields: Any,
) -> tuple[Any, ...] | None:
    """Move the row `pk` of `model` from `before` to `to` with the fields, in one statement
    (PostgreSQL) with `source`: the caller's CTEs that lock and read other rows first (its lock
    order: `source.first` is read before the row changes). The row moves only if its status is
    still `before` and `where` holds (SQL over the row as `m` and the CTEs, `join` naming those
    the UPDATE reads FROM); then the move is covered by `audit` and the values of `returning`
    (SQL over `m`, the row after the move, and what `join` names) come back. None when nothing
    moved: nothing is covered, and the caller reads the row to see why (it may have moved on,
    or `where` did not hold).

    For a caller that would otherwise read the row under its lock in a statement of its own and
    then move it (`move_row`): one round trip less. `instance`, the row as the caller read it
    before, gets the status and the fields set when the row moved. Raises IllegalTransition for
    a pair the table does not allow.
    """
    label = label or f"{model.__name__} {pk}"
    table.check(before, to, row=label)
    audit.require_open()
    db = connections[DEFAULT_DB_ALIAS]
    if db.vendor != "postgresql":
        raise ValueError("a move with its reads in one statement is PostgreSQL's")
    quote = db.ops.quote_name
    meta = model._meta
    status = quote(str(getattr(meta.get_field("status"), "column", "status")))
    params: dict[str, Any] = {"cas_to": to, "cas_pk": pk, "cas_before": before}
    assignments = [f"{status} = %(cas_to)s"]
    for i, (name, value) in enumerate(fields.items()):
        column: Any = meta.get_field(name)
        if hasattr(value, "resolve_expression"):
            raise ValueError("a move with its reads in one statement takes plain values")
        assignments.append(f"{quote(str(column.column))} = %(cas{i})s")
        params[f"cas{i}"] = _db_value(column, value, db)
    if source.params.keys() & params.keys():
        raise ValueError("parameters of statements along a move clash")
    reads = f"FROM {join} " if join else ""
    sql = (
        f"WITH {', '.join(source.ctes)} "  # noqa: S608 (names from the model, values parameters)
        f"UPDATE {quote(meta.db_table)} AS m SET {', '.join(assignments)} {reads}"
        f"WHERE m.{quote(str(meta.pk.column))} = %(cas_pk)s AND m.{status} = %(cas_before)s "
        f"AND (SELECT count(*) FROM {source.first}) >= 0 AND ({where}) "
        f"RETURNING (SELECT count(*) FROM {source.first}), {returning}"
    )
    with prepared_cursor() as cursor:
        cursor.execute(sql, {**source.params, **params})
        row = cursor.fetchone()
    if row is None:
        return None
    source.count = int(row[0])
    audit.cover([Moved(pk, before, str(to))])
    if instance is not None:
        instance.status = to  # type: ignore[attr-defined]
        for name, value in fields.items():
            setattr(instance, name, value)
    return tuple(row[1:])


def _db_value(column: Any, value: Any, db: BaseDatabaseWrapper) -> Any:
    """Return `value` prepared for `column` in an UPDATE, as the ORM's `update()` prepares it."""
    if column.remote_field is not None and hasattr(value, "prepare_database_save"):
        value = value.prepare_database_save(column)
    return column.get_db_prep_save(value, db)


@functools.lru_cache(maxsize=256)
def _update_statement(model: type[Model], names: tuple[str, ...]) -> tuple[str, list[Any]]:
    """Return the compare-and-set UPDATE of `model` (its status and `names`) and their fields."""
    meta = model._meta
    columns: list[Any] = [meta.get_field(name) for name in names]
    quote = connection.ops.quote_name
    status = quote(str(getattr(meta.get_field("status"), "column", "status")))
    assignments = "".join(f", {quote(str(column.column))} = %s" for column in columns)
    sql = (
        f"UPDATE {quote(meta.db_table)} SET {status} = %s{assignments} "  # noqa: S608
        f"WHERE {quote(str(meta.pk.column))} = %s AND {status} = %s"
    )
    return sql, columns


def move_rows(
    table: Transitions,
    rows: QuerySet[Any] | Sequence[Any],
    *,
    to: str,
    audit: Audit,
    from_: Iterable[str] | None = None,
    read: Sequence[str] = (),
    **fields: Any,
) -> list[Moved]:
    """Move, set-based, the rows that have one of the `from_` statuses (by default every status
    the table lets move to `to`) to `to`, with the fields that go with it; return those moved.

    `rows` is a query (its matching rows are locked in id order, then changed in one UPDATE;
    `read` names values to return with each, such as the key its events name) or rows the
    caller locked already (changed in one UPDATE, their attributes set). Raises
    IllegalTransition for a `from_` status the table does not let move to `to`, and
    StaleTransition when a row changed under the caller.
    """
    sources = table.sources(to) if from_ is None else frozenset(str(s) for s in from_)
    for before in sorted(sources):
        table.check(before, to)
    audit.require_open()
    if isinstance(rows, QuerySet):
        model = rows.model
        found = [
            Moved(pk, str(status), str(to), dict(zip(read, values, strict=True)))
            for pk, status, *values in rows.filter(status__in=sources)
            .select_for_update(of=("self",))
            .order_by("pk")
            .values_list("pk", "status", *read)
        ]
        instances: Sequence[Any] = ()
    else:
        instances = [row for row in rows if str(row.status) in sources]
        if not instances:
            return []
        model = type(instances[0])
        found = [
            Moved(row.pk, str(row.status), str(to), {name: getattr(row, name) for name in read})
            for row in instances
        ]
    if not found:
        return []
    audit.cover(found)
    changed = model._default_manager.filter(
        pk__in=[m.pk for m in found], status__in=sources
    ).update(status=to, **fields)
    if changed != len(found):
        raise StaleTransition(
            table.field,
            "/".join(sorted(sources)),
            str(to),
            row=f"{len(found)} {model.__name__} rows, {changed} changed",
            actual=None,
        )
    for row in instances:
        row.status = to
        for name, value in fields.items():
            setattr(row, name, value)
    return found
