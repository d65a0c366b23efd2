"""The fast ways of verifying a chain give what the plain ways give, on hostile data too.

`casehub_verify.event_text` writes an event's canonical JSON out field by field, and
`ChainVerifier.add_rows` checks a run of in-order events by their hashes alone; `check_chain`
reads rows of values instead of model instances. Each is held here to the rule it replaces: the
event hash as the SHA-256 of `json.dumps` of the whole body (written out below, as it was before),
add_row one event at a time, and the model instances of the stored events.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import casehub_verify
from audit.chain import append_event, case_chain, check_chain, verify_chain, verify_events
from audit.models import AuditEvent
from casehub_verify import EVENT_FIELDS, GENESIS_HASH, ChainVerifier, event_hash, event_text
from tests.audit_triggers import audit_triggers_suspended


def _reference_text(
    chain: Any, seq: Any, time: Any, actor_kind: Any, actor: Any, action: Any, data: Any, prev: Any
) -> str:
    # The rule as it stood: json.dumps of the body, sorted keys, no spaces, UTF-8 kept.
    body = {
        "chain": chain,
        "seq": seq,
        "time": time if isinstance(time, str) else time.isoformat(timespec="microseconds"),
        "actor_kind": actor_kind,
        "actor": actor,
        "action": action,
        "data": data,
        "prev_hash": prev,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _reference_hash(*fields: Any) -> str:
    return hashlib.sha256(_reference_text(*fields).encode()).hexdigest()


HOSTILE_STRINGS = [
    "",
    "plain",
    'quote " and backslash \\ and slash /',
    "".join(chr(c) for c in range(1, 0x20)) + "\x7f",  # every control character but NUL, DEL
    "line\u2028separator\u2029paragraph",
    "Prüfung ÄÖÜ ß — “quotes” € ½",
    "emoji 😀 and astral 𝄞 and flags 🇩🇪",
    "rtl \u202eevil\u202c and zero width \u200b\ufeff",
    "combining e\u0301 vs é",
    "lone surrogate \ud800 and \udfff",
    '=HYPERLINK("http://x")',
    "+1+1",
    "-2-2",
    "@SUM(A1)",
    "\t=tab formula",
    "\r\n=crlf",
    "</script><script>alert(1)</script>",
    "null",
    "\x00nul",
]
HOSTILE_NUMBERS: list[Any] = [
    0,
    -1,
    2**53 + 1,
    -(2**63) - 1,
    10**300,
    0.1,
    -0.0,
    1e300,
    5e-324,
    1.7976931348623157e308,
    1e16,
    123456789.123456789,
    math.inf,
    -math.inf,
    math.nan,
    True,
    False,
    None,
]
HOSTILE_DATA: list[Any] = [
    {},
    [],
    "a bare string",
    42,
    2.5,
    None,
    {"z": 1, "a": 2, "A": 3, "ä": 4, "": 5, "10": 6, "9": 7, "a\x00": 8, "😀": 9, "\u00e9": 10},
    {"strings": HOSTILE_STRINGS, "numbers": HOSTILE_NUMBERS},
    {s: s for s in HOSTILE_STRINGS},
    {"deep": [[[{"x": [{"y": {"z": [1, [2, [3, {"": None}]]]}}]}]]]},
    [{"b": 1, "a": [True, False, None]}, {"a": {"d": {}, "c": []}}],
    {"formula": ["=1+1", "+cmd|' /C calc'!A0", "-1", "@x"], "amount": "10.50"},
    {"big": 10**4000, "neg": -(10**4000)},
    {"too big to print": 10**5000},
    {1: "int key", 2.5: "float key", None: "none key", False: "bool key"},
    {1: "int keys", 2: "sort"},
]
TIMES: list[Any] = [
    datetime(2026, 12, 1, 9, 0, 0, 5, tzinfo=UTC),
    datetime(2026, 12, 1, 9, 0, 0, 0, tzinfo=UTC),
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-3, minutes=-30))),
    datetime(2026, 3, 29, 2, 30),  # naive: no offset, hashed as such
    "2026-12-01T09:00:00.000001+00:00",
    "not a time at all \u2028",
]


class _Str(str):
    pass


class _Seq(enum.IntEnum):
    ONE = 1


def _agree(*fields: Any) -> None:
    try:
        expected = _reference_text(*fields)
    except (TypeError, ValueError) as exc:  # unsortable keys, an int too long to print
        with pytest.raises(type(exc)):
            event_text(*fields)
        return
    assert event_text(*fields) == expected
    names = ("chain", "seq", "time", "actor_kind", "actor", "action", "data", "prev_hash")
    try:
        expected_hash = hashlib.sha256(expected.encode()).hexdigest()
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8
        with pytest.raises(UnicodeEncodeError):
            event_hash(**dict(zip(names, fields, strict=True)))
        return
    assert event_hash(**dict(zip(names, fields, strict=True))) == expected_hash


def test_data_is_written_by_the_reused_encoder_as_json_dumps_writes_it() -> None:
    # the C encoder is in use here (CPython), and agrees with the plain one on every value
    assert casehub_verify._canonical_value is not casehub_verify.canonical_json
    for data in [*HOSTILE_DATA, *HOSTILE_STRINGS, *HOSTILE_NUMBERS]:
        try:
            expected = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            with pytest.raises(type(exc)):
                casehub_verify._canonical_value(data)
            continue
        assert casehub_verify._canonical_value(data) == expected
        assert casehub_verify.canonical_json(data) == expected


def test_without_the_c_encoder_the_plain_one_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    assert casehub_verify._reused_c_encoder() is casehub_verify.canonical_json

    def built_differently(*args: Any) -> Any:
        return lambda value, level: ("[]",)

    monkeypatch.setattr(json.encoder, "c_make_encoder", built_differently)
    assert casehub_verify._reused_c_encoder() is casehub_verify.canonical_json


@pytest.mark.parametrize("data", HOSTILE_DATA, ids=range(len(HOSTILE_DATA)))
def test_the_event_text_is_the_canonical_json_of_the_body_for_hostile_data(data: Any) -> None:
    for time in TIMES:
        _agree("case:1", 7, time, "user", "ana", "case.step", data, GENESIS_HASH)


@pytest.mark.parametrize("text", HOSTILE_STRINGS, ids=range(len(HOSTILE_STRINGS)))
def test_the_event_text_is_the_canonical_json_of_the_body_for_hostile_fields(text: str) -> None:
    for position in (0, 2, 3, 4, 5, 7):  # every string field, one at a time
        fields: list[Any] = ["case:1", 3, TIMES[0], "agent", "erp", "tool.called", {"k": text}, "f"]
        fields[position] = text
        _agree(*fields)
    for seq in (1, 2**62, 10**40, 10**5000, -5, 0):
        _agree(text, seq, text, text, text, text, text, text)


def test_fields_of_other_types_take_the_slow_way_and_hash_as_before() -> None:
    base: list[Any] = ["case:1", 1, TIMES[0], "user", "ana", "case.step", {"n": 1}, GENESIS_HASH]
    odd: list[tuple[int, Any]] = [
        (0, _Str("case:1")),
        (1, True),
        (1, _Seq.ONE),
        (1, 1.0),
        (1, "1"),
        (1, None),
        (2, _Str("2026-12-01T09:00:00.000001+00:00")),
        (3, None),
        (4, 5),
        (5, ["a", "list"]),
        (7, _Str(GENESIS_HASH)),
    ]
    for position, value in odd:
        fields = list(base)
        fields[position] = value
        _agree(*fields)
    # the slow way is taken, and it is not the template: a bool seq is "true", not "1"
    assert '"seq":true' in event_text("c", True, "t", "k", "a", "x.y", {}, "p")
    assert '"seq":1,' in event_text("c", _Seq.ONE, "t", "k", "a", "x.y", {}, "p")


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fields=st.tuples(st.text(), st.text(), st.text(), st.text(), st.text(), st.text()),
    seq=st.integers(),
    data=JSON_VALUES,
    time=st.datetimes(timezones=st.none() | st.timezones()) | st.text(),
)
def test_the_event_text_agrees_with_the_body_on_generated_events(
    fields: tuple[str, ...], seq: int, data: Any, time: Any
) -> None:
    chain, actor_kind, actor, action, prev_hash, _ = fields
    _agree(chain, seq, time, actor_kind, actor, action, data, prev_hash)


# The verifier: add_rows against add_row, one event at a time --------------------------------


def _rows(n: int, chain: str = "case:1", start: int = 1) -> list[list[Any]]:
    rows: list[list[Any]] = []
    prev = GENESIS_HASH
    for seq in range(start, start + n):
        time = datetime(2026, 12, 1, tzinfo=UTC) + timedelta(microseconds=seq * 977)
        data = {"n": seq, "text": STORED_STRINGS[seq % len(STORED_STRINGS)]}
        digest = _reference_hash(chain, seq, time, "user", "ana", "case.step", data, prev)
        rows.append([chain, seq, time, "user", "ana", "case.step", data, prev, digest])
        prev = digest
    return rows


def _state(verifier: ChainVerifier) -> tuple[Any, ...]:
    return (
        verifier.problems,
        verifier.count,
        verifier.first_seq,
        verifier.last_seq,
        verifier.last_hash,
    )


def _one_by_one(rows: list[list[Any]], chain: str = "case:1") -> ChainVerifier:
    verifier = ChainVerifier(chain)
    for row in rows:
        verifier.add_row(row)
    return verifier


def _in_bulk(rows: list[list[Any]], chain: str = "case:1") -> ChainVerifier:
    verifier = ChainVerifier(chain)
    verifier.add_rows(iter(rows))
    return verifier


def _tamper(rows: list[list[Any]], rng: random.Random) -> list[list[Any]]:
    rows = [list(row) for row in rows]
    for _ in range(rng.randint(1, 4)):
        if not rows:
            break
        i = rng.randrange(len(rows))
        kind = rng.choice(
            ["data", "hash", "prev", "delete", "swap", "duplicate", "foreign", "seq", "time"]
        )
        if kind == "data":
            rows[i][6] = {"n": "changed"}
        elif kind == "hash":
            rows[i][8] = "f" * 64
        elif kind == "prev":
            rows[i][7] = GENESIS_HASH
        elif kind == "delete":
            del rows[i]
        elif kind == "swap" and i + 1 < len(rows):
            rows[i], rows[i + 1] = rows[i + 1], rows[i]
        elif kind == "duplicate":
            rows.insert(i, list(rows[i]))
        elif kind == "foreign":
            rows[i][0] = "case:2"
        elif kind == "seq":
            rows[i][1] = rng.choice([rows[i][1] + 5, rows[i][1] - 1, 0, True])
        elif kind == "time":
            rows[i][2] = rows[i][2] + timedelta(microseconds=1)
    return rows


def test_add_rows_finds_exactly_what_add_row_finds_on_tampered_chains() -> None:
    rng = random.Random(20261201)
    intact = _rows(40)
    assert _state(_in_bulk(intact)) == _state(_one_by_one(intact))
    assert _in_bulk(intact).problems == []
    assert (_in_bulk(intact).count, _in_bulk(intact).last_hash) == (40, intact[-1][8])
    kinds_seen: set[str] = set()
    for _ in range(300):
        rows = _tamper(intact, rng)
        expected = _one_by_one(rows)
        assert _state(_in_bulk(rows)) == _state(expected)
        kinds_seen |= {problem.problem.split(":")[0] for problem in expected.problems}
    # the tampering above reached every kind of break the rules name, so the comparison bit
    assert kinds_seen >= {"changed", "missing", "reordered", "unlinked", "foreign"}


def test_add_rows_continues_a_verifier_and_names_the_same_breaks_as_records() -> None:
    rows = _rows(12)
    rows[5][6] = {"n": "changed"}
    del rows[8]
    split = ChainVerifier("case:1")
    split.add_rows(rows[:4])
    for row in rows[4:7]:
        split.add_row(row)
    split.add_rows(rows[7:])
    records = [dict(zip(EVENT_FIELDS, row, strict=True)) for row in rows]
    assert _state(split) == _state(_one_by_one(rows))
    assert casehub_verify.verify_events(records, "case:1") == split.problems
    assert [(p.seq, p.problem.split(":")[0]) for p in split.problems] == [
        (6, "changed"),
        (10, "missing"),
        (10, "unlinked"),
    ]


def test_a_chain_that_does_not_start_at_one_is_missing_its_start() -> None:
    rows = _rows(3, start=4)
    verifier = _in_bulk(rows)
    assert _state(verifier) == _state(_one_by_one(rows))
    assert [(p.seq, p.problem) for p in verifier.problems] == [
        (4, "missing: seq 1-3 should come before it"),
    ]
    assert (verifier.first_seq, verifier.last_seq, verifier.count) == (4, 6, 3)


# The stored chain: rows of values against model instances ---------------------------------


def _storable(data: Any) -> bool:
    # what a JSON column holds: finite numbers, string keys, no NUL, no lone surrogates
    try:
        text = json.dumps(data, allow_nan=False, ensure_ascii=False)
        text.encode()
    except (TypeError, ValueError):
        return False
    return (
        "\\u0000" not in text
        and "\x00" not in text
        and not any(not isinstance(key, str) for key in (data if isinstance(data, dict) else {}))
    )


STORED_STRINGS = [s for s in HOSTILE_STRINGS if _storable(s)]
# Floats that a PostgreSQL jsonb column gives back as they went in (it keeps numbers as numeric,
# so 1e300 or -0.0 come back as the int 10**300 or 0).
STORED_NUMBERS = [0, -1, 2**53 + 1, -(2**63) - 1, 10**300, 0.1, 2.5, 123456789.12345679, True]
STORED_DATA = [
    *(
        data if isinstance(data, dict) else {"value": data}
        for data in HOSTILE_DATA
        if _storable(data) and data != HOSTILE_DATA[7]
    ),
    {"strings": STORED_STRINGS, "numbers": STORED_NUMBERS, "nested": HOSTILE_DATA[9]},
    {s: [s, {s: s}] for s in STORED_STRINGS},
]


@pytest.mark.django_db
def test_stored_hostile_events_verify_and_hash_as_the_body_always_did() -> None:
    chain = case_chain(61)
    assert len(STORED_DATA) >= 12 and len(STORED_STRINGS) >= 15
    for i, data in enumerate(STORED_DATA):
        actor = STORED_STRINGS[i % len(STORED_STRINGS)] or "x"
        append_event(f"x.hostile{i}", actor=actor, chain=chain, data=data)
    events = list(AuditEvent.objects.filter(chain=chain).order_by("seq"))
    assert len(events) == len(STORED_DATA)
    for event in events:
        fields = (event.chain, event.seq, event.time, event.actor_kind, event.actor_label)
        assert event.hash == _reference_hash(*fields, event.action, event.data, event.prev_hash)
    verifier = check_chain(chain)
    assert verifier.problems == []
    assert (verifier.count, verifier.last_hash) == (len(events), events[-1].hash)
    assert verify_chain(chain) == [] == verify_events(events, chain)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        '{"a":1}',
        "[1, 2]",
        '"s"',
        "1e300",
        " {}",
        "{} ",
        "\ufeff{}",
        "not json",
        "",
        "{",
    ],
)
def test_stored_data_decodes_as_the_model_field_decodes_it(text: str) -> None:
    from django.db import connection

    from audit.chain import _stored_data

    field = AuditEvent._meta.get_field("data")
    expected = field.from_db_value(text, field.cached_col, connection)
    assert _stored_data(text) == expected
    assert type(_stored_data(text)) is type(expected)


@pytest.mark.django_db
def test_check_chain_names_the_same_breaks_as_the_model_instances() -> None:
    chain = case_chain(62)
    for n in range(10):
        append_event("x.step", chain=chain, data={"n": n, "s": STORED_STRINGS[n]})
    with transaction.atomic(), audit_triggers_suspended():  # a superuser's tampering
        AuditEvent.objects.filter(chain=chain, seq=3).update(data={"n": 99})
        AuditEvent.objects.filter(chain=chain, seq=6).delete()
        AuditEvent.objects.filter(chain=chain, seq=8).update(actor_label="mallory")
        AuditEvent.objects.filter(chain=chain, seq=10).delete()
    instances = AuditEvent.objects.filter(chain=chain).order_by("seq")
    verifier = check_chain(chain)
    by_instances = verify_events(instances, chain)
    assert verifier.problems[: len(by_instances)] == by_instances
    assert [(p.seq, p.problem.split(":")[0]) for p in verifier.problems] == [
        (3, "changed"),
        (7, "missing"),
        (7, "unlinked"),
        (8, "changed"),
        (10, "head"),
    ]
    assert (verifier.count, verifier.first_seq, verifier.last_seq) == (8, 1, 9)
