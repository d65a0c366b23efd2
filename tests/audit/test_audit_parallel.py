"""The fast ways of reading a stored chain find what one plain pass finds.

`ChainVerifier.add_stored_rows` checks rows as PostgreSQL gives them (`data` as JSON text, no
chain column) and is held to `add_rows`; a verifier `resumed` after a stored event and `join`ed
to the one before it is held to one pass over all the rows; on PostgreSQL, `check_chain` in
parts (worker processes, forked or started fresh, reading one snapshot) is held to
`check_chain` in one pass and to the model instances, on tampered chains.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connection, transaction

import casehub_verify
from audit import chain as audit
from audit.chain import append_event, case_chain, check_chain, verify_events
from audit.models import AuditChainHead, AuditEvent
from casehub_verify import GENESIS_HASH, ChainVerifier, event_hash, format_time
from tests.audit.test_audit_verify_fast import (
    STORED_DATA,
    _one_by_one,
    _rows,
    _state,
    _tamper,
)
from tests.audit_triggers import audit_triggers_suspended

# Stored rows: (seq, time, actor_kind, actor, action, data as JSON text, prev_hash, hash) -----


def _stored(row: list[Any], data_text: str | None = None) -> tuple[Any, ...]:
    _chain, seq, time, kind, actor, action, data, prev_hash, digest = row
    time = format_time(time) if isinstance(time, datetime) else time
    text = json.dumps(data) if data_text is None else data_text
    return (seq, time, kind, actor, action, text, prev_hash, digest)


def _decoded(text: str) -> Any:
    # how Django's JSONField gives a stored text back: json.loads, else the text itself
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _by_add_rows(stored: list[tuple[Any, ...]], chain: str = "case:1") -> ChainVerifier:
    verifier = ChainVerifier(chain)
    verifier.add_rows(
        (chain, seq, time, kind, actor, action, _decoded(text), prev_hash, digest)
        for seq, time, kind, actor, action, text, prev_hash, digest in stored
    )
    return verifier


def _by_stored_rows(stored: list[tuple[Any, ...]], chain: str = "case:1") -> ChainVerifier:
    verifier = ChainVerifier(chain)
    verifier.add_stored_rows(iter(stored))
    return verifier


def test_add_stored_rows_finds_exactly_what_add_rows_finds_on_tampered_chains() -> None:
    rng = random.Random(20261202)
    intact = _rows(40)
    assert _state(_by_stored_rows([_stored(r) for r in intact])) == _state(_one_by_one(intact))
    assert _by_stored_rows([_stored(r) for r in intact]).problems == []
    kinds: set[str] = set()
    for _ in range(300):
        # a stored chain has no rows of other chains: every row is read by its chain
        rows = [row for row in _tamper(intact, rng) if row[0] == "case:1"]
        stored = [_stored(row) for row in rows]
        expected = _by_add_rows(stored)
        assert _state(_by_stored_rows(stored)) == _state(expected)
        kinds |= {problem.problem.split(":")[0] for problem in expected.problems}
    assert kinds >= {"changed", "missing", "reordered", "unlinked"}


@pytest.mark.parametrize(
    "text",
    ['{"n": 1}', '{"n":1}', " {}", "{} ", "\ufeff{}", "not json", "", "{", "[1, 2]", "1e300"],
)
def test_add_stored_rows_decodes_data_as_the_json_field_does(text: str) -> None:
    rows = _rows(3)
    rows[1][6] = _decoded(text)  # the event as hashed: with the data the field gives back
    prev = rows[0][8]
    fields = (*rows[1][:6], rows[1][6], prev)
    rows[1][7] = prev
    rows[1][8] = event_hash(**dict(zip(casehub_verify.EVENT_FIELDS[:8], fields, strict=True)))
    rows[2][7] = rows[1][8]
    rows[2][8] = "f" * 64
    stored = [_stored(rows[0]), _stored(rows[1], text), _stored(rows[2])]
    assert _state(_by_stored_rows(stored)) == _state(_by_add_rows(stored))
    assert [p.seq for p in _by_stored_rows(stored).problems] == [3]


def _resumed_at(rows: list[list[Any]], cut: int) -> ChainVerifier:
    first = ChainVerifier("case:1")
    first.add_rows(rows[:cut])
    after = None if cut == 0 else (rows[cut - 1][1], rows[cut - 1][8])
    later = ChainVerifier.resumed("case:1", after)
    later.add_rows(rows[cut:])
    # through JSON, as a worker process hands it over
    first.join(ChainVerifier.from_state(json.loads(json.dumps(later.state()))))
    return first


def test_a_chain_checked_in_two_parts_finds_what_one_pass_finds_wherever_it_is_cut() -> None:
    rng = random.Random(20261203)
    intact = _rows(30)
    for _ in range(60):
        # as the database gives them: one chain, each seq once, in seq order
        tampered = [row for row in _tamper(intact, rng) if row[0] == "case:1"]
        rows = sorted({row[1]: row for row in tampered if type(row[1]) is int}.values(),
                      key=lambda row: row[1])  # fmt: skip
        expected = _state(_one_by_one(rows))
        for cut in range(len(rows) + 1):
            assert _state(_resumed_at(rows, cut)) == expected, cut


def test_a_part_that_follows_an_empty_one_starts_the_chain() -> None:
    rows = _rows(5)
    verifier = _resumed_at(rows, 0)
    assert (verifier.first_seq, verifier.count, verifier.problems) == (1, 5, [])
    verifier = _resumed_at(rows[2:], 0)
    assert _state(verifier) == _state(_one_by_one(rows[2:]))
    assert [p.problem.split(":")[0] for p in verifier.problems] == ["missing", "unlinked"]


# check_chain on PostgreSQL: in parts, one snapshot --------------------------------------------

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="worker processes read PostgreSQL snapshots"
)


@pytest.fixture
def in_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Check any chain of more than a handful of events in parts."""
    monkeypatch.setattr(audit, "PARALLEL_MIN_EVENTS", 4)


@pytest.fixture
def another_thread() -> Iterator[None]:
    """A second live thread: the workers are then fresh interpreters, not forks."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


def _tampered_chain(chain: str, n: int = 40) -> None:
    for i in range(n):
        append_event("x.step", actor="erp", chain=chain, data={"i": i, "s": "\u2028=1+1"})
    with transaction.atomic(), audit_triggers_suspended():  # a superuser's tampering
        events = AuditEvent.objects.filter(chain=chain)
        events.filter(seq=5).update(data={"i": "changed"})
        events.filter(seq__in=[13, 14]).delete()  # at the first cut of three parts, 1 + 40 // 3
        events.filter(seq=21).delete()  # the first event of the second half
        events.filter(seq=30).update(actor_label="mallory")
        events.filter(seq__gte=38).delete()  # the tail, the head left as it was


def _problems(verifier: ChainVerifier) -> list[tuple[int, str]]:
    return [(p.seq, p.problem.split(":")[0]) for p in verifier.problems]


EXPECTED_BREAKS = [
    (5, "changed"),
    (15, "missing"),
    (15, "unlinked"),
    (22, "missing"),
    (22, "unlinked"),
    (30, "changed"),
    (40, "head"),
]


# Run in a process of its own: forks are only taken in a process with one thread, and the test
# process may have others (a browser test's event loop) by the time this runs.
_FORKED_CHECK = """
import json, sys, threading
import django
django.setup()
from django.db import connection
connection.settings_dict["NAME"] = sys.argv[1]
from audit import chain as audit
audit.PARALLEL_MIN_EVENTS = 4
assert threading.active_count() == 1, threading.enumerate()
verifier = audit.check_chain(sys.argv[2], processes=int(sys.argv[3]))
print(json.dumps({"problems": [[p.seq, p.problem] for p in verifier.problems],
                  "count": verifier.count, "first": verifier.first_seq, "last": verifier.last_seq,
                  "hash": verifier.last_hash}))
"""


@postgresql_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("processes", [2, 3, 4])
def test_a_chain_checked_in_parts_by_forked_workers_finds_what_one_pass_finds(
    in_parts: None, processes: int
) -> None:
    chain = case_chain(71)
    _tampered_chain(chain)
    one_pass = check_chain(chain, processes=1)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "casehub.settings"}
    done = subprocess.run(
        [sys.executable, "-c", _FORKED_CHECK, connection.settings_dict["NAME"], chain,
         str(processes)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "worker" not in done.stderr  # every part was checked by its (forked) worker
    in_parts_ = json.loads(done.stdout.strip().splitlines()[-1])
    assert _problems(one_pass) == EXPECTED_BREAKS
    assert in_parts_ == {
        "problems": [[p.seq, p.problem] for p in one_pass.problems],
        "count": one_pass.count,
        "first": one_pass.first_seq,
        "last": one_pass.last_seq,
        "hash": one_pass.last_hash,
    }
    instances = AuditEvent.objects.filter(chain=chain).order_by("seq")
    assert verify_events(instances, chain) == one_pass.problems[:-1]  # all but the head's


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_chain_checked_in_parts_by_fresh_interpreters_finds_what_one_pass_finds(
    in_parts: None, another_thread: None, caplog: Any
) -> None:
    chain = case_chain(72)
    _tampered_chain(chain)
    assert threading.active_count() > 1
    assert _state(check_chain(chain, processes=3)) == _state(check_chain(chain, processes=1))
    assert _problems(check_chain(chain, processes=3)) == EXPECTED_BREAKS
    assert "worker" not in caplog.text


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_part_whose_worker_cannot_start_is_checked_here(
    in_parts: None, another_thread: None, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    chain = case_chain(73)
    _tampered_chain(chain)
    one_pass = check_chain(chain, processes=1)
    monkeypatch.setattr(audit.sys, "executable", "/nonexistent/python")
    assert _state(check_chain(chain, processes=2)) == _state(one_pass)
    assert "no worker process" in caplog.text


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_worker_that_fails_has_its_part_checked_here(
    in_parts: None, another_thread: None, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    chain = case_chain(74)
    _tampered_chain(chain)
    one_pass = check_chain(chain, processes=1)
    # a worker that runs and fails: its connection names a database that is not there
    real = connection.get_connection_params

    def elsewhere() -> dict[str, Any]:
        return {**real(), "dbname": "casehub_no_such_database"}

    monkeypatch.setattr(connection, "get_connection_params", elsewhere)
    assert _state(check_chain(chain, processes=2)) == _state(one_pass)
    assert "worker failed" in caplog.text


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_an_intact_long_chain_checked_in_parts_is_intact(in_parts: None) -> None:
    chain = case_chain(75)
    for i in range(60):
        append_event("x.step", chain=chain, data=STORED_DATA[i % len(STORED_DATA)])
    verifier = check_chain(chain, processes=3)
    head = AuditChainHead.objects.get(chain=chain)
    assert verifier.problems == []
    assert (verifier.count, verifier.first_seq, verifier.last_seq) == (60, 1, 60)
    assert verifier.last_hash == head.head_hash


# Times as the server writes them: the form format_time gives, every stored time -----------------

EDGE_TIMES = [
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(999, 3, 4, 1, 2, 3, 1, tzinfo=UTC),
    datetime(2026, 12, 1, 9, 0, 0, 0, tzinfo=UTC),
    datetime(2026, 12, 1, 9, 0, 0, 500000, tzinfo=UTC),
    datetime(2026, 3, 29, 2, 30, 0, 7, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
]


@postgresql_only
@pytest.mark.django_db
def test_the_servers_time_text_is_format_time_of_the_stored_time() -> None:
    chain = case_chain(76)
    prev = GENESIS_HASH
    events = []
    for seq, time in enumerate(EDGE_TIMES, start=1):
        utc = time.astimezone(UTC)  # as the database gives it back
        digest = event_hash(
            chain=chain,
            seq=seq,
            time=utc,
            actor_kind="system",
            actor="system",
            action="x.time",
            data={},
            prev_hash=prev,
        )
        events.append(
            AuditEvent(
                chain=chain,
                seq=seq,
                time=time,
                actor_kind="system",
                actor_label="system",
                action="x.time",
                data={},
                prev_hash=prev,
                hash=digest,
            )
        )
        prev = digest
    AuditEvent.objects.bulk_create(events)
    AuditChainHead.objects.create(chain=chain, seq=len(events), head_hash=prev)
    stored = list(AuditEvent.objects.filter(chain=chain).order_by("seq"))
    assert [format_time(e.time) for e in stored] == [
        format_time(t.astimezone(UTC)) for t in EDGE_TIMES
    ]
    assert verify_events(stored, chain) == []
    assert check_chain(chain).problems == []  # in this transaction: one pass by audit_scan
    # and a time moved by one microsecond is a changed event
    with audit_triggers_suspended():
        AuditEvent.objects.filter(chain=chain, seq=4).update(
            time=EDGE_TIMES[3] + timedelta(microseconds=1)
        )
    assert _problems(check_chain(chain)) == [(4, "changed")]
