"""Append and verify hash-chained audit events.

This module imports nothing else of the apps, so every app may write its events through it
without an import running back up (STYLE: dependencies point one way).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from oversight.models import ActorKind, AuditChainHead, AuditEvent

GENESIS_HASH = "0" * 64
SYSTEM_CHAIN = "system"


def case_chain(case_id: int) -> str:
    """Return the name of the audit chain of one case."""
    return f"case:{case_id}"


def canonical_json(value: Any) -> str:
    """Serialise a JSON value canonically: sorted keys, no spaces, UTF-8 kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def event_hash(
    *,
    chain: str,
    seq: int,
    time: datetime,
    actor_kind: str,
    actor: str,
    action: str,
    data: Any,
    prev_hash: str,
) -> str:
    """Return the SHA-256 over the canonical JSON of an event and its predecessor's hash."""
    body = {
        "chain": chain,
        "seq": seq,
        "time": time.isoformat(timespec="microseconds"),
        "actor_kind": actor_kind,
        "actor": actor,
        "action": action,
        "data": data,
        "prev_hash": prev_hash,
    }
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


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
    # Round-trip once so the stored data is exactly what was hashed (dates, decimals as text).
    return json.loads(json.dumps(dict(data or {}), cls=DjangoJSONEncoder))


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
    AuditChainHead.objects.bulk_create(
        [AuditChainHead(chain=chain, seq=0, head_hash=GENESIS_HASH)], ignore_conflicts=True
    )
    head = AuditChainHead.objects.select_for_update().get(chain=chain)
    seq = head.seq + 1
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
        prev_hash=head.head_hash,
    )
    event = AuditEvent.objects.create(
        chain=chain,
        seq=seq,
        time=now,
        actor_kind=who.kind,
        actor_label=who.label,
        actor_user=who.user,
        action=action,
        data=payload,
        prev_hash=head.head_hash,
        hash=digest,
    )
    AuditChainHead.objects.filter(chain=chain).update(seq=seq, head_hash=digest)
    return event


@dataclass(frozen=True, slots=True)
class ChainProblem:
    """One break in a chain: the sequence number where it shows and what is wrong."""

    seq: int
    problem: str


def verify_events(events: Iterable[AuditEvent], chain: str) -> list[ChainProblem]:
    """Check that events form one unbroken chain from the genesis hash; return every break."""
    problems: list[ChainProblem] = []
    expected_seq = 1
    prev_hash = GENESIS_HASH
    for event in events:
        if event.chain != chain:
            problems.append(ChainProblem(event.seq, f"belongs to chain {event.chain!r}"))
            continue
        if event.seq != expected_seq:
            problems.append(ChainProblem(event.seq, f"expected sequence {expected_seq}"))
        if event.prev_hash != prev_hash:
            problems.append(ChainProblem(event.seq, "prev_hash does not match the previous event"))
        recomputed = event_hash(
            chain=event.chain,
            seq=event.seq,
            time=event.time,
            actor_kind=event.actor_kind,
            actor=event.actor_label,
            action=event.action,
            data=event.data,
            prev_hash=event.prev_hash,
        )
        if recomputed != event.hash:
            problems.append(ChainProblem(event.seq, "hash does not match the event's content"))
        expected_seq = event.seq + 1
        prev_hash = event.hash
    return problems


def verify_chain(chain: str) -> list[ChainProblem]:
    """Verify one stored chain, including that its head matches the last event."""
    events = AuditEvent.objects.filter(chain=chain).order_by("seq")
    problems = verify_events(events.iterator(), chain)
    head = AuditChainHead.objects.filter(chain=chain).first()
    last = events.last()
    if head is not None and (last is None or head.head_hash != last.hash or head.seq != last.seq):
        problems.append(ChainProblem(head.seq, "chain head does not match the last event"))
    return problems
