"""Append and verify hash-chained audit events.

This module imports nothing else of the apps, so every app may write its events through it
without an import running back up (STYLE: dependencies point one way). The chain rules
themselves (canonical JSON, the event hash, verification) are those of `casehub_verify.py`, the
standalone verifier auditors run, so there is one implementation of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Field, TextField
from django.db.models.functions import Cast
from django.utils import timezone

import casehub_verify
from casehub_verify import (
    GENESIS_HASH,
    ChainProblem,
    ChainVerifier,
    canonical_json,
    event_hash,
    format_time,
)
from oversight.models import ActorKind, AuditChainHead, AuditEvent

__all__ = [
    "GENESIS_HASH",
    "SYSTEM_CHAIN",
    "Actor",
    "ChainProblem",
    "append_event",
    "canonical_json",
    "case_chain",
    "check_chain",
    "event_hash",
    "event_record",
    "verify_chain",
    "verify_events",
]

SYSTEM_CHAIN = "system"


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
    loaded = json.loads(json.dumps(dict(data or {}), cls=DjangoJSONEncoder, allow_nan=False))
    normalised = _integral_floats_as_ints(loaded)
    assert isinstance(normalised, dict)
    return normalised


def _integral_floats_as_ints(value: Any) -> Any:
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {key: _integral_floats_as_ints(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral_floats_as_ints(item) for item in value]
    return value


@transaction.atomic
def append_event(
    action: str,
    *,
    actor: Actor | AbstractBaseUser | AnonymousUser | str | None = None,
    chain: str = SYSTEM_CHAIN,
    data: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """Append an event to a chain inside the caller's transaction.

    Appends to one chain are serialised by a row lock on the chain's head (a write lock on SQLite),
    so concurrent writers never fork a chain. Raises ValueError for an action that is not dotted.
    """
    if action.count(".") < 1 or not all(action.split(".")):
        raise ValueError(
            f"audit action codes are dotted, like 'oversight.gate.approved': {action!r}"
        )
    who = actor if isinstance(actor, Actor) else Actor.of(actor)
    # Three statements on one cursor: the head locked, the event inserted, the head moved on.
    # (Through the ORM the same append costs twice as long, most of it building objects.)
    with connection.cursor() as cursor:
        head = _locked_head(cursor, chain)
        if head is None:
            # A new chain: create its head unless a concurrent first append just did, then lock it.
            AuditChainHead.objects.bulk_create(
                [AuditChainHead(chain=chain, seq=0, head_hash=GENESIS_HASH)], ignore_conflicts=True
            )
            head = _locked_head(cursor, chain)
            assert head is not None
        seq, prev_hash = head[0] + 1, head[1]
        now = timezone.now()
        payload = _json_safe(data)
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
        event = AuditEvent(
            chain=chain,
            seq=seq,
            time=now,
            actor_kind=who.kind,
            actor_label=who.label,
            actor_user=who.user,
            action=action,
            data=payload,
            prev_hash=prev_hash,
            hash=digest,
        )
        event.pk = _insert(cursor, event)
        event._state.adding = False
        event._state.db = connection.alias
        cursor.execute(
            f"UPDATE {_HEAD_TABLE} SET seq = %s, head_hash = %s WHERE chain = %s",  # noqa: S608
            [seq, digest, chain],
        )
    return event


_HEAD_TABLE = connection.ops.quote_name(AuditChainHead._meta.db_table)
_EVENT_TABLE = connection.ops.quote_name(AuditEvent._meta.db_table)
# Every column but the primary key, which the database assigns.
_EVENT_FIELDS: list[Field[Any, Any]] = [
    field for field in AuditEvent._meta.concrete_fields if not field.primary_key
]


def _locked_head(cursor: Any, chain: str) -> tuple[int, str] | None:
    # SQLite has no FOR UPDATE: its transactions start with BEGIN IMMEDIATE (the write lock).
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    query = f"SELECT seq, head_hash FROM {_HEAD_TABLE} WHERE chain = %s{lock}"  # noqa: S608
    cursor.execute(query, [chain])
    row = cursor.fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


def _insert(cursor: Any, event: AuditEvent) -> int:
    """Insert the event's row and return its primary key."""
    columns = ", ".join(connection.ops.quote_name(str(f.column)) for f in _EVENT_FIELDS)
    values = [f.get_db_prep_save(f.pre_save(event, True), connection) for f in _EVENT_FIELDS]
    marks = ", ".join(["%s"] * len(values))
    # Table and column names come from the model, values are parameters.
    sql = f"INSERT INTO {_EVENT_TABLE} ({columns}) VALUES ({marks})"  # noqa: S608
    if connection.features.can_return_columns_from_insert:
        cursor.execute(f"{sql} RETURNING id", values)
        return int(cursor.fetchone()[0])
    cursor.execute(sql, values)
    return int(connection.ops.last_insert_id(cursor, AuditEvent._meta.db_table, "id"))


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


def check_chain(chain: str) -> ChainVerifier:
    """Check one stored chain event by event and against its head; return what was found.

    The events are read as rows of values, not model instances: the same values (the same
    column conversions, the JSON of `data` decoded as the model field decodes it), streamed
    through a server-side cursor where the database has one.
    """
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
    head = AuditChainHead.objects.filter(chain=chain).first()
    if head is not None:
        verifier.check_head(head.seq, head.head_hash)
    return verifier


def verify_chain(chain: str) -> list[ChainProblem]:
    """Verify one stored chain and that its head matches the last event; return every break."""
    return check_chain(chain).problems
