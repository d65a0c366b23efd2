"""Append and verify hash-chained audit events.

This module imports nothing else of the apps, so every app may write its events through it
without an import running back up (STYLE: dependencies point one way). The chain rules
themselves (canonical JSON, the event hash, verification) are those of `casehub_verify.py`, the
standalone verifier auditors run, so there is one implementation of them.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import psycopg
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import TextField
from django.db.models.base import ModelState
from django.db.models.functions import Cast
from django.utils import timezone
from psycopg.conninfo import make_conninfo

import casehub_verify
from audit import scan as audit_scan
from audit.along import Along, Writes, run_along
from audit.models import ActorKind, AuditChainHead, AuditEvent
from casehub_verify import (
    GENESIS_HASH,
    ChainProblem,
    ChainVerifier,
    canonical_json,
    event_hash,
    event_text_around,
    format_time,
)
from observability.metrics import count_on_commit
from web.db import prepared_cursor

__all__ = [
    "EVENT_COLUMNS",
    "GENESIS_HASH",
    "SYSTEM_CHAIN",
    "Actor",
    "Along",
    "ChainProblem",
    "NewEvent",
    "append_event",
    "append_events",
    "canonical_json",
    "case_chain",
    "check_chain",
    "event_hash",
    "event_record",
    "verify_chain",
    "verify_events",
]

SYSTEM_CHAIN = "system"
logger = logging.getLogger(__name__)


def case_chain(case_id: int) -> str:
    """Return the name of the audit chain of one case."""
    return f"case:{case_id}"


@dataclass(frozen=True, slots=True)
class Actor:
    """Who caused an event: a user, an agent (by slug) or the system."""

    kind: str
    label: str
    user: User | None = None

    @classmethod
    def of(cls, who: AbstractBaseUser | AnonymousUser | str | None) -> Actor:
        """Build an actor from a user, an agent slug, or None for the system.

        Raises TypeError for a signed-in user that is not a row of the user model.
        """
        if who is None:
            return cls(ActorKind.SYSTEM, "system")
        if isinstance(who, str):
            return cls(ActorKind.AGENT, who)
        if isinstance(who, AnonymousUser) or not who.is_authenticated:
            return cls(ActorKind.ANONYMOUS, "anonymous")
        if not isinstance(who, get_user_model()):
            raise TypeError(f"an audit actor is a {get_user_model().__name__}, not {who!r}")
        return cls(ActorKind.USER, who.get_username(), who)


def _json_safe(data: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return the data as it will come back from the database, so what is hashed is what is read.

    A JSON round trip turns dates and decimals into text. Then floats with an integral value
    become ints: PostgreSQL's jsonb stores numbers as numerics and gives `1e16` back as
    `10000000000000000` and `-0.0` as `0`, which would hash differently. Non-finite floats
    are refused (JSON has no NaN or Infinity). Raises ValueError for them.
    """
    if data is None:
        return {}
    if type(data) is dict:
        plain = _plain_copy(data)
        if plain is not _NOT_PLAIN:
            return plain  # the round trip would give back the same (every event of a leaf)
    loaded = json.loads(json.dumps(dict(data), cls=DjangoJSONEncoder, allow_nan=False))
    normalised = _integral_floats_as_ints(loaded)
    assert isinstance(normalised, dict)
    return normalised


_NOT_PLAIN = object()


def _plain_copy(value: Any) -> Any:
    """Return a copy of `value` if the JSON round trip would give it back unchanged, else
    `_NOT_PLAIN`: dicts with str keys, lists, str, int, bool and None, of exactly those types
    (floats, subclasses such as enums, tuples and dates take the round trip)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        copy = {}
        for key, item in value.items():
            if type(key) is not str:
                return _NOT_PLAIN
            item = _plain_copy(item)
            if item is _NOT_PLAIN:
                return _NOT_PLAIN
            copy[key] = item
        return copy
    if kind is list:
        items = []
        for item in value:
            item = _plain_copy(item)
            if item is _NOT_PLAIN:
                return _NOT_PLAIN
            items.append(item)
        return items
    return _NOT_PLAIN


def _integral_floats_as_ints(value: Any) -> Any:
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {key: _integral_floats_as_ints(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral_floats_as_ints(item) for item in value]
    return value


@dataclass(frozen=True, slots=True)
class NewEvent:
    """One event for `append_events`: what happened, who did it, and its data."""

    action: str
    actor: Actor | AbstractBaseUser | AnonymousUser | str | None = None
    data: Mapping[str, Any] | None = None


def append_event(
    action: str,
    *,
    actor: Actor | AbstractBaseUser | AnonymousUser | str | None = None,
    chain: str = SYSTEM_CHAIN,
    data: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """Append an event to a chain inside the caller's transaction.

    Appends to one chain are serialised by a row lock on the chain's head (a write lock on SQLite),
    so concurrent writers never fork a chain. Raises ValueError for an action that is not dotted
    or data that JSON cannot hold (before anything is written); a database error inside the
    append dooms the caller's transaction (it rolls back), so no half-written append can commit.
    """
    return append_events([NewEvent(action, actor, data)], chain=chain)[0]


def append_events(
    events: Sequence[NewEvent],
    *,
    chain: str = SYSTEM_CHAIN,
    along: Along | Sequence[Along] | None = None,
) -> list[AuditEvent]:
    """Append several events to one chain, in order, in one go inside the caller's transaction.

    The same events as that many `append_event` calls in a row, in two statements however many
    there are: for a business transaction that writes several events to a chain. Raises
    ValueError as append_event does, before anything is written. `along` (PostgreSQL) is the
    caller's writes to run with them (one set or several): in the same statement as one event's
    append, before the appends otherwise.
    """
    pending = [_prepared(event) for event in events]
    db = connections[DEFAULT_DB_ALIAS]  # not the `connection` proxy: a lookup per question
    sets = [along] if isinstance(along, Along) else list(along or ())
    if sets and db.vendor != "postgresql":
        raise ValueError("writes along an append are PostgreSQL statements")
    writes = Writes.of(sets) if sets else None
    if not pending:
        if writes is not None:
            run_along(writes)
        return []
    if len(pending) == 1 and db.vendor == "postgresql":
        one = _append_one(db, chain, *pending[0], along=writes)
        count_on_commit([(one.action, one.data)])
        return [one]
    if writes is not None:
        run_along(writes)
    # No savepoint: an append that fails marks the caller's transaction for rollback instead.
    # Prepared on PostgreSQL: the head's statement once, the insert once per batch size.
    cursor_of = prepared_cursor if connection.vendor == "postgresql" else connection.cursor
    with transaction.atomic(savepoint=False), cursor_of() as cursor:
        last_seq, prev_hash = _advance_head(cursor, chain, len(pending))
        now = timezone.now()
        rows: list[AuditEvent] = []
        texts: list[str] = []
        seq = last_seq - len(pending)
        for who, action, payload, text in pending:
            seq += 1
            digest = event_hash(
                chain=chain,
                seq=seq,
                time=now,
                actor_kind=who.kind,
                actor=who.label,
                action=action,
                data=payload,
                prev_hash=prev_hash,
            )
            rows.append(
                _stored_event(
                    db.alias, None, chain, seq, now, who, action, payload, prev_hash, digest
                )
            )
            texts.append(text)
            prev_hash = digest
        for start in range(0, len(rows), INSERT_BATCH):
            batch = rows[start : start + INSERT_BATCH]
            keys = _insert_rows(cursor, chain, batch, texts[start : start + INSERT_BATCH])
            for event, pk in zip(batch, keys, strict=True):
                event.pk = pk
    # The metrics count what commits: nothing of a transaction that rolls back.
    count_on_commit([(event.action, event.data) for event in rows])
    return rows


def _prepared(event: NewEvent) -> tuple[Actor, str, dict[str, Any], str]:
    """Check one event and return its actor, action, data as hashed and data's JSON text."""
    action = event.action
    if action.count(".") < 1 or not all(action.split(".")):
        raise ValueError(
            f"audit action codes are dotted, like 'oversight.gate.approved': {action!r}"
        )
    who = event.actor if isinstance(event.actor, Actor) else Actor.of(event.actor)
    payload = _json_safe(event.data)
    # the text the JSON field itself would write (json.dumps, its default encoder)
    return who, action, payload, json.dumps(payload)


INSERT_BATCH = 500  # events a statement inserts at most (SQLite takes 32,766 parameters)
_HEAD_TABLE = connection.ops.quote_name(AuditChainHead._meta.db_table)
_EVENT_TABLE = connection.ops.quote_name(AuditEvent._meta.db_table)
_INSERTED_COLUMNS = (
    "chain", "seq", "time", "actor_kind", "actor_label", "actor_user_id", "action", "data",
    "prev_hash", "hash",
)  # fmt: skip
_EVENT_COLUMNS_SQL = ", ".join(connection.ops.quote_name(column) for column in _INSERTED_COLUMNS)
# One statement locks the chain's head (creating it for a new chain) and moves its seq on by the
# number of events; it returns the new last seq and the hash of the event before the first new
# one (head_hash is not changed yet). Concurrent appends to the chain wait here for the lock.
_ADVANCE_HEAD = (
    f"INSERT INTO {_HEAD_TABLE} (chain, seq, head_hash) VALUES (%s, %s, %s) "  # noqa: S608
    f"ON CONFLICT (chain) DO UPDATE SET seq = {_HEAD_TABLE}.seq + EXCLUDED.seq "
    "RETURNING seq, head_hash"
)


# One event in one statement (PostgreSQL): the head's UPDATE locks its row, moves seq on, keeps
# the old head_hash as prev_hash and hashes the event in the database (SHA-256 over the event's
# text with both filled in: `event_text_around`); the insert takes the new row's values. An
# UPDATE's SET reads the row it locks: in READ COMMITTED an append that waited for the lock
# re-reads the head its predecessor committed, so no locking read is needed before it.
_HEAD_MOVE = (
    "UPDATE {head} SET seq = seq + 1, prev_hash = head_hash, head_hash = encode(sha256("
    "convert_to(%(before)s::text || head_hash || %(between)s::text || (seq + 1)::text "
    "|| %(after)s::text, 'UTF8')), 'hex') WHERE chain = %(chain)s{also} "
    "RETURNING seq, prev_hash, head_hash"
)
_INSERT_FROM_HEAD = (
    "INSERT INTO {event} ({columns}) "
    "SELECT %(chain)s::text, head.seq, %(time)s::timestamptz, %(kind)s::text, %(label)s::text, "
    "%(user)s::bigint, %(action)s::text, %(data)s::jsonb, head.prev_hash, head.head_hash "
    "FROM head RETURNING id, seq, prev_hash, hash"
)
_APPEND_ONE = (
    "WITH head AS ("
    + _HEAD_MOVE.format(head=_HEAD_TABLE, also="")
    + ") "
    + _INSERT_FROM_HEAD.format(event=_EVENT_TABLE, columns=_EVENT_COLUMNS_SQL)
)


# `_APPEND_ONE` with a caller's writes (`Along`) in front: the head's lock waits for the rows
# of `first`, and the statement returns one row even for a chain with no head yet (its id NULL).
_APPEND_ALONG = (
    "WITH {ctes}, head AS ("
    + _HEAD_MOVE.format(head="{head}", also=" AND {written}")
    + "), ins AS ("
    + _INSERT_FROM_HEAD.format(event="{event}", columns="{columns}")
    + ") SELECT ins.id, ins.seq, ins.prev_hash, ins.hash, {counts} "
    "FROM (SELECT 1) AS one LEFT JOIN ins ON true"
)


def _append_one(
    db: BaseDatabaseWrapper,
    chain: str,
    who: Actor,
    action: str,
    payload: dict[str, Any],
    text: str,
    *,
    along: Writes | None = None,
) -> AuditEvent:
    """Append one event in one statement (PostgreSQL); see `_APPEND_ONE`, and `Along` for the
    caller's writes run in it.

    A chain's first event creates its head first (one more statement, once per chain).
    """
    now = timezone.now()
    before, between, after = event_text_around(chain, now, who.kind, who.label, action, payload)
    params = {
        "chain": chain,
        "before": before,
        "between": between,
        "after": after,
        "time": now,
        "kind": who.kind,
        "label": who.label,
        "user": who.user.pk if who.user is not None else None,
        "action": action,
        "data": text,
    }
    if along is not None:
        with transaction.atomic(savepoint=False), prepared_cursor() as cursor:
            row = _execute_along(cursor, chain, params, along)
    elif db.get_autocommit() and not db.in_atomic_block:
        # Outside any transaction the statement is a transaction of its own: one round trip,
        # no BEGIN and COMMIT around it (a new chain's head, seq 0, is harmless on its own).
        with prepared_cursor() as cursor:
            row = _execute_append(cursor, chain, params)
    else:
        # No savepoint: an append that fails marks the caller's transaction for rollback.
        with transaction.atomic(savepoint=False), prepared_cursor() as cursor:
            row = _execute_append(cursor, chain, params)
    pk, seq, prev_hash, digest = row
    return _stored_event(db.alias, pk, chain, seq, now, who, action, payload, prev_hash, digest)


def _stored_event(
    alias: str,
    pk: int | None,
    chain: str,
    seq: int,
    now: datetime,
    who: Actor,
    action: str,
    payload: dict[str, Any],
    prev_hash: str,
    digest: str,
) -> AuditEvent:
    """Return the event as the ORM would hold it after reading its row back, its fields set
    directly (AuditEvent has no field that post_init fills in): Model.__init__ costs more than
    the rest of an append's Python."""
    event = _NEW_EVENT(AuditEvent)
    user = who.user
    event.__dict__.update(
        zip(
            _EVENT_ATTNAMES,
            (pk, chain, seq, now, who.kind, who.label, user.pk if user is not None else None,
             action, payload, prev_hash, digest),
            strict=True,
        )
    )  # fmt: skip
    state = event._state = ModelState()
    state.adding = False
    state.db = alias
    if user is not None:
        _ACTOR_USER.set_cached_value(event, user)
    return event


_EVENT_ATTNAMES = [field.attname for field in AuditEvent._meta.concrete_fields]
if _EVENT_ATTNAMES != [
    "id", "chain", "seq", "time", "actor_kind", "actor_label", "actor_user_id", "action", "data",
    "prev_hash", "hash",
]:  # fmt: skip
    raise ImportError(
        f"_append_one builds AuditEvent from values in another order: {_EVENT_ATTNAMES}"
    )
_ACTOR_USER = AuditEvent._meta.get_field("actor_user")
_NEW_EVENT = object.__new__


def _execute_along(cursor: Any, chain: str, params: dict[str, Any], along: Writes) -> Any:
    """Run `_APPEND_ALONG` and return the event's row; each set's `count` is set. For a chain
    with no head the caller's writes ran already: the head is created and the event appended
    alone."""
    sql = _APPEND_ALONG.format(
        ctes=along.ctes,
        head=_HEAD_TABLE,
        written=along.written,
        counts=along.counts,
        event=_EVENT_TABLE,
        columns=_EVENT_COLUMNS_SQL,
    )
    if along.params.keys() & params.keys():
        raise ValueError(
            f"parameters of writes along an append clash: {along.params.keys() & params.keys()}"
        )
    cursor.execute(sql, {**along.params, **params})
    found = cursor.fetchone()
    row = found[:4]
    along.done(found[4:])
    if row[0] is None:
        return _execute_append(cursor, chain, params)
    return row


def _execute_append(cursor: Any, chain: str, params: Mapping[str, Any]) -> Any:
    """Run `_APPEND_ONE` and return its row; a chain's first event creates its head first."""
    cursor.execute(_APPEND_ONE, params)
    row = cursor.fetchone()
    if row is None:  # a new chain: no head yet
        cursor.execute(
            f"INSERT INTO {_HEAD_TABLE} (chain, seq, head_hash) VALUES (%s, 0, %s) "  # noqa: S608
            "ON CONFLICT (chain) DO NOTHING",
            [chain, GENESIS_HASH],
        )
        cursor.execute(_APPEND_ONE, params)
        row = cursor.fetchone()
    return row


def _advance_head(cursor: Any, chain: str, count: int) -> tuple[int, str]:
    cursor.execute(_ADVANCE_HEAD, [chain, count, GENESIS_HASH])
    seq, head_hash = cursor.fetchone()
    return int(seq), str(head_hash)


def _insert_rows(
    cursor: Any, chain: str, events: Sequence[AuditEvent], data_texts: Sequence[str]
) -> list[int]:
    """Insert the events' rows, point the chain's head at the last, return their primary keys.

    data_texts holds each event's `data` as JSON text, as the JSON field would write it.

    One statement on PostgreSQL (the insert in a CTE of the head's update), two on SQLite.
    """
    values: list[Any] = []
    for event, data_text in zip(events, data_texts, strict=True):
        values += [
            event.chain,
            event.seq,
            connection.ops.adapt_datetimefield_value(event.time),
            event.actor_kind,
            event.actor_label,
            event.actor_user_id,
            event.action,
            data_text,
            event.prev_hash,
            event.hash,
        ]
    marks = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(events))
    # Table and column names come from the model, values are parameters.
    insert = f"INSERT INTO {_EVENT_TABLE} ({_EVENT_COLUMNS_SQL}) VALUES {marks} RETURNING id, seq"  # noqa: S608
    head = [events[-1].hash, events[-1].prev_hash, chain]
    if connection.vendor == "postgresql":
        cursor.execute(
            f"WITH inserted AS ({insert}) UPDATE {_HEAD_TABLE} SET head_hash = %s, "  # noqa: S608
            "prev_hash = %s WHERE chain = %s "
            "RETURNING (SELECT array_agg(id ORDER BY seq) FROM inserted)",
            [*values, *head],
        )
        return [int(pk) for pk in cursor.fetchone()[0]]
    cursor.execute(insert, values)
    by_seq = dict((int(seq), int(pk)) for pk, seq in cursor.fetchall())
    cursor.execute(
        f"UPDATE {_HEAD_TABLE} SET head_hash = %s, prev_hash = %s WHERE chain = %s",  # noqa: S608
        head,
    )
    return [by_seq[event.seq] for event in events]


# The stored columns of the fields of casehub_verify.EVENT_FIELDS, in that order.
EVENT_COLUMNS = (
    "chain", "seq", "time", "actor_kind", "actor_label", "action", "data", "prev_hash", "hash",
)  # fmt: skip
VERIFY_CHUNK = 5000  # rows fetched at a time from the server-side cursor
_DATA_FIELD = AuditEvent._meta.get_field("data")
_raw_decode = json.JSONDecoder().raw_decode  # json.loads's own decoder, without its wrapping


def _stored_data(text: str | None) -> Any:
    """Return `data` from its stored JSON text exactly as the model field returns it.

    The field decodes with json.loads, which for a text without surrounding whitespace is its
    decoder's raw_decode when that consumes the whole text; anything else (whitespace, a BOM,
    text that is not JSON, NULL) is left to the field itself.
    """
    if _DATA_FIELD.decoder is None and text:
        try:
            value, end = _raw_decode(text)
        except ValueError:
            pass
        else:
            if end == len(text):
                return value
    return _DATA_FIELD.from_db_value(text, _DATA_FIELD.cached_col, connection)


def event_record(event: AuditEvent) -> dict[str, Any]:
    """Return an event as the chain rules see it: every field its hash covers, and the hash."""
    return {
        "chain": event.chain,
        "seq": event.seq,
        "time": format_time(event.time),
        "actor_kind": event.actor_kind,
        "actor": event.actor_label,
        "action": event.action,
        "data": event.data,
        "prev_hash": event.prev_hash,
        "hash": event.hash,
    }


def verify_events(events: Iterable[AuditEvent], chain: str) -> list[ChainProblem]:
    """Check that stored events form one chain from the genesis hash; return every break."""
    return casehub_verify.verify_events((event_record(event) for event in events), chain)


def check_chain(chain: str, *, processes: int | None = None) -> ChainVerifier:
    """Check one stored chain event by event and against its head; return what was found.

    On PostgreSQL the events are read by `audit.scan` as rows of plain values, in one
    snapshot with the head. A chain of at least PARALLEL_MIN_EVENTS events read outside a
    transaction is cut into `processes` parts (default: VERIFY_PROCESSES) checked at once, one
    here and each other in a worker process reading the same snapshot; a part's verifier
    starts from the stored event before it, so the parts together find what one pass finds
    (and a part whose worker fails is checked here). Inside the caller's transaction the chain
    is read in one pass in that transaction, its own appends included. Elsewhere (SQLite) the
    events are read through the ORM as rows of values.
    """
    params = connection.settings_dict
    if (
        connection.vendor != "postgresql"
        or connection.timezone_name != "UTC"
        or params.get("DISABLE_SERVER_SIDE_CURSORS")
    ):
        return _check_chain_by_orm(chain)
    table = AuditEvent._meta.db_table
    verifier = ChainVerifier(chain)
    if connection.in_atomic_block:
        connection.ensure_connection()
        audit_scan.scan(connection.connection, table, verifier)
        _check_head(verifier, chain)
        return verifier
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        head = _head(cursor, chain)
        count = processes or VERIFY_PROCESSES
        if head is None or head[0] < PARALLEL_MIN_EVENTS or count < 2:
            audit_scan.scan(connection.connection, table, verifier)
        else:
            _check_in_parts(cursor, verifier, table, head[0], count)
        if head is not None:
            verifier.check_head(*head)
    return verifier


PARALLEL_MIN_EVENTS = 20_000
VERIFY_PROCESSES = max(1, min(os.cpu_count() or 1, 4))
_PROJECT_DIR = Path(__file__).resolve().parent.parent
# connection parameters of Django's that are not libpq's
_NOT_LIBPQ = ("cursor_factory", "context", "prepare_threshold", "server_side_binding", "pool")


def _check_in_parts(
    cursor: Any, verifier: ChainVerifier, table: str, last: int, count: int
) -> None:
    """Check seq 1..last and any after in `count` parts at once, in this transaction's snapshot."""
    cursor.execute("SELECT pg_export_snapshot()")
    snapshot = cursor.fetchone()[0]
    starts = [1 + part * last // count for part in range(1, count)]
    stops: list[int | None] = [*starts[1:], None]
    jobs = []
    for start, stop in zip(starts, stops, strict=True):
        cursor.execute(
            f"SELECT seq, hash FROM {_EVENT_TABLE} WHERE chain = %s AND seq < %s "  # noqa: S608
            "ORDER BY seq DESC LIMIT 1",
            [verifier.chain, start],
        )
        after = cursor.fetchone()
        job = {
            "chain": verifier.chain,
            "table": table,
            "start": start,
            "stop": stop,
            "after": None if after is None else [int(after[0]), str(after[1])],
            "snapshot": snapshot,
            "role": connection.settings_dict["OPTIONS"].get("assume_role"),
        }
        jobs.append((job, _start_worker(job)))
    audit_scan.scan(connection.connection, table, verifier, stop=starts[0])
    for job, worker in jobs:
        part = None if worker is None else worker.verifier()
        if part is None:  # no worker, or it failed: this part is checked here
            after = job["after"]
            part = ChainVerifier.resumed(verifier.chain, None if after is None else tuple(after))
            audit_scan.scan(connection.connection, table, part, job["start"], job["stop"])
        verifier.join(part)


class _Worker:
    """A process checking one part of a chain; its result comes through a pipe."""

    def __init__(self, pid: int, result: IO[bytes], process: subprocess.Popen[bytes] | None):
        self.pid, self.result, self.process = pid, result, process

    def verifier(self) -> ChainVerifier | None:
        """Wait for the worker; return its part's verifier, or None when it failed."""
        with self.result:
            out = self.result.read()
        if self.process is not None:
            err = self.process.stderr.read() if self.process.stderr else b""
            status = self.process.wait()
        else:
            status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            err = b""
        if status != 0:
            logger.warning(
                "audit verification worker failed (exit %s): %s; checking its part here",
                status,
                err.decode(errors="replace")[-2000:],
            )
            return None
        return ChainVerifier.from_state(json.loads(out))


def _start_worker(job: dict[str, Any]) -> _Worker | None:
    """Start a process checking the job's part: forked when this process has one thread only
    (no import to pay for), else a fresh interpreter (fork is unsafe beside other threads)."""
    params = connection.get_connection_params()
    try:
        conninfo = make_conninfo(
            "",
            **{
                key: value
                for key, value in params.items()
                if key not in _NOT_LIBPQ and isinstance(value, str | int)
            },
        )
        job = {**job, "conninfo": conninfo}
        if threading.active_count() == 1 and hasattr(os, "fork"):
            return _fork_worker(job)
        process = subprocess.Popen(
            [sys.executable, "-m", "audit.scan"],
            cwd=_PROJECT_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(job).encode())
        process.stdin.close()
    except (OSError, ValueError, psycopg.Error) as exc:
        logger.warning("audit verification: no worker process (%s); checking here", exc)
        return None
    return _Worker(process.pid, process.stdout, process)


def _fork_worker(job: dict[str, Any]) -> _Worker:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own connection; it never touches the parent's
        status = 1
        try:
            os.close(read_end)
            with os.fdopen(write_end, "wb") as out:
                out.write(json.dumps(audit_scan.run_job(job)).encode())
            status = 0
        except BaseException:  # any failure: the parent checks the part itself
            traceback.print_exc()
        finally:
            os._exit(status)  # no exit handlers: they belong to the parent
    os.close(write_end)
    return _Worker(pid, os.fdopen(read_end, "rb"), None)


def _head(cursor: Any, chain: str) -> tuple[int, str] | None:
    cursor.execute(
        f"SELECT seq, head_hash FROM {_HEAD_TABLE} WHERE chain = %s",  # noqa: S608
        [chain],
    )
    row = cursor.fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


def _check_head(verifier: ChainVerifier, chain: str) -> None:
    with connection.cursor() as cursor:
        head = _head(cursor, chain)
    if head is not None:
        verifier.check_head(*head)


def _check_chain_by_orm(chain: str) -> ChainVerifier:
    """check_chain through the ORM: rows of values, `data` decoded as the model field does."""
    verifier = ChainVerifier(chain)
    columns = [*EVENT_COLUMNS]
    columns[EVENT_COLUMNS.index("data")] = "data_text"
    stored = (
        AuditEvent.objects.filter(chain=chain)
        .order_by("seq")
        .annotate(data_text=Cast("data", output_field=TextField()))
        .values_list(*columns)
        .iterator(chunk_size=VERIFY_CHUNK)
    )
    rows = (
        (chain_, seq, time, kind, actor, action, _stored_data(data), prev_hash, digest)
        for chain_, seq, time, kind, actor, action, data, prev_hash, digest in stored
    )
    verifier.add_rows(rows)
    _check_head(verifier, chain)
    return verifier


def verify_chain(chain: str) -> list[ChainProblem]:
    """Verify one stored chain and that its head matches the last event; return every break."""
    return check_chain(chain).problems
