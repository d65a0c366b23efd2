"""Writes of a caller's that an audit append runs in its own statement (PostgreSQL).

A transaction that changes rows and records the change in an audit event can have the changes
made by the statement that appends the event (`audit.chain.append_events`, `along`): one round
trip for both. This module holds how those writes are given and combined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from web.db import prepared_cursor

__all__ = ["Along", "Writes", "run_along"]


@dataclass(slots=True, kw_only=True)
class Along:
    """A caller's writes that an append runs in its own statement (PostgreSQL): one round trip
    for both, in the caller's transaction.

    `ctes` are data-modifying common table expressions (`name AS (UPDATE … RETURNING 1)`) with
    named parameters (`%(name)s`, not clashing with the append's: chain, before, between,
    after, time, kind, label, user, action, data). `first` names the one whose rows are written
    before the chain's head is locked (the caller's lock order); the others run when the
    statement ends. After the append, `count` is the number of rows `first` returned.
    """

    ctes: Sequence[str]
    params: Mapping[str, Any]
    first: str
    count: int | None = field(default=None)


@dataclass(frozen=True, slots=True)
class Writes:
    """Several callers' `Along` writes run in one statement: each one's `first` is written before
    the chain's head is locked, and each one's `count` is set after."""

    sets: Sequence[Along]
    ctes: str
    params: Mapping[str, Any]
    # SQL: true once every `first` was written (forces them before what follows in the statement)
    written: str
    # SQL: the row count of each `first`, in the order of `sets`
    counts: str

    @classmethod
    def of(cls, sets: Sequence[Along]) -> Writes:
        params: dict[str, Any] = {}
        for writes in sets:
            if writes.params.keys() & params.keys():
                raise ValueError(
                    "parameters of writes along an append clash: "
                    f"{writes.params.keys() & params.keys()}"
                )
            params.update(writes.params)
        counts = [f"(SELECT count(*) FROM {writes.first})" for writes in sets]  # noqa: S608
        return cls(
            sets=sets,
            ctes=", ".join(cte for writes in sets for cte in writes.ctes),
            params=params,
            written=" AND ".join(f"{count} >= 0" for count in counts),
            counts=", ".join(counts),
        )

    def done(self, counts: Sequence[Any]) -> None:
        """Set each set's `count` from the statement's counts (in `counts`' order)."""
        for writes, count in zip(self.sets, counts, strict=True):
            writes.count = int(count)


def run_along(along: Writes) -> None:
    """Run `along`'s writes in a statement of their own (when they are not run with an append)."""
    with prepared_cursor() as cursor:
        cursor.execute(f"WITH {along.ctes} SELECT {along.counts}", along.params)
        along.done(cursor.fetchone())
