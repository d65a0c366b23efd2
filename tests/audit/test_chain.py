from __future__ import annotations

import json
import threading

import pytest
from django.db import connection, transaction
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.chain import (
    GENESIS_HASH,
    INSERT_BATCH,
    SYSTEM_CHAIN,
    NewEvent,
    append_event,
    append_events,
    case_chain,
    verify_chain,
)
from audit.models import ActorKind, AuditChainHead, AuditEvent
from tests import personas
from tests.audit_triggers import audit_triggers_suspended


@pytest.mark.django_db
def test_first_event_of_a_chain_links_to_genesis_and_the_next_to_it() -> None:
    first = append_event("case.created", chain=case_chain(1), data={"title": "x"})
    second = append_event("case.updated", chain=case_chain(1), data={"title": "y"})
    assert (first.seq, first.prev_hash) == (1, GENESIS_HASH)
    assert (second.seq, second.prev_hash) == (2, first.hash)
    assert verify_chain(case_chain(1)) == []


@pytest.mark.django_db
def test_chains_are_numbered_independently() -> None:
    append_event("case.created", chain=case_chain(1))
    other = append_event("case.created", chain=case_chain(2))
    assert other.seq == 1


@pytest.mark.django_db
def test_event_records_the_user_as_actor() -> None:
    user = personas.analyst()
    event = append_event("case.created", actor=user, chain=case_chain(3))
    assert (event.actor_kind, event.actor_label, event.actor_user) == ("user", "ana", user)


@pytest.mark.django_db
def test_agent_slug_and_system_actors() -> None:
    by_agent = append_event("tool.called", actor="erp-lookup", chain=case_chain(4))
    by_system = append_event("case.planned", chain=case_chain(4))
    assert (by_agent.actor_kind, by_agent.actor_label) == ("agent", "erp-lookup")
    assert (by_system.actor_kind, by_system.actor_label) == ("system", "system")


@pytest.mark.django_db
def test_data_is_stored_as_hashed_even_for_non_json_types() -> None:
    from datetime import date
    from decimal import Decimal

    event = append_event("x.y", data={"amount": Decimal("10.50"), "on": date(2026, 1, 2)})
    event.refresh_from_db()
    assert event.data == {"amount": "10.50", "on": "2026-01-02"}
    assert verify_chain(SYSTEM_CHAIN) == []


@pytest.mark.django_db
def test_undotted_action_codes_are_refused() -> None:
    with pytest.raises(ValueError, match="dotted"):
        append_event("created")


@pytest.mark.django_db
def test_verification_names_the_changed_event() -> None:
    for n in range(5):
        append_event("x.step", chain=case_chain(9), data={"n": n})
    with transaction.atomic(), audit_triggers_suspended():  # a superuser's tampering
        AuditEvent.objects.filter(chain=case_chain(9), seq=3).update(data={"n": 99})
    problems = verify_chain(case_chain(9))
    assert [p.seq for p in problems] == [3]
    assert "content" in problems[0].problem


@pytest.mark.django_db
def test_verification_notices_a_removed_last_event() -> None:
    for n in range(3):
        append_event("x.step", chain=case_chain(8), data={"n": n})
    with transaction.atomic(), audit_triggers_suspended():
        AuditEvent.objects.filter(chain=case_chain(8), seq=3).delete()
    assert [p.seq for p in verify_chain(case_chain(8))] == [3]


@pytest.mark.django_db
def test_verification_notices_a_removed_middle_event() -> None:
    for n in range(4):
        append_event("x.step", chain=case_chain(7), data={"n": n})
    with transaction.atomic(), audit_triggers_suspended():
        AuditEvent.objects.filter(chain=case_chain(7), seq=2).delete()
    assert {p.seq for p in verify_chain(case_chain(7))} == {3}


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_from_many_threads_form_one_unbroken_chain() -> None:
    threads_n, per_thread = 6, 15
    errors: list[BaseException] = []
    start = threading.Barrier(threads_n)

    def writer(n: int) -> None:
        try:
            start.wait()
            for i in range(per_thread):
                append_event("x.concurrent", chain=case_chain(42), data={"thread": n, "i": i})
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    seqs = list(
        AuditEvent.objects.filter(chain=case_chain(42))
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    assert seqs == list(range(1, threads_n * per_thread + 1))
    assert verify_chain(case_chain(42)) == []
    assert AuditChainHead.objects.get(chain=case_chain(42)).seq == threads_n * per_thread


@pytest.mark.django_db
@pytest.mark.parametrize("number", [1e16, 1e300, -0.0, 2.0**53, 0.1, 1.5e-7, -3.25, 12345.678])
def test_floats_in_event_data_verify_after_the_database_round_trip(number: float) -> None:
    # jsonb gives 1e16 back as 10000000000000000 and -0.0 as 0: the hash must be of that.
    append_event("tests.number.stored", chain="case:9", data={"n": number, "nested": [number]})
    assert verify_chain("case:9") == []


@pytest.mark.django_db
def test_nan_and_infinity_are_refused_in_event_data() -> None:
    for number in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            append_event("tests.number.stored", chain="case:9", data={"n": number})
    assert not AuditEvent.objects.filter(chain="case:9").exists()


# Several events in one go ----------------------------------------------------------------------


@pytest.mark.django_db
def test_append_events_writes_what_as_many_append_event_calls_write() -> None:
    user = personas.analyst()
    before = append_event("case.created", chain=case_chain(20), data={"n": 0})
    written = append_events(
        [
            NewEvent("case.step", actor=user, data={"n": 1}),
            NewEvent("tool.called", actor="erp-lookup", data={"n": 2.0, "on": "x"}),
            NewEvent("case.planned"),
        ],
        chain=case_chain(20),
    )
    assert [e.seq for e in written] == [2, 3, 4]
    assert [e.prev_hash for e in written] == [before.hash, written[0].hash, written[1].hash]
    assert [(e.actor_kind, e.actor_label) for e in written] == [
        ("user", "ana"),
        ("agent", "erp-lookup"),
        ("system", "system"),
    ]
    assert written[0].actor_user == user and written[1].data == {"n": 2, "on": "x"}
    stored = list(AuditEvent.objects.filter(chain=case_chain(20)).order_by("seq"))
    assert [(e.pk, e.hash) for e in stored[1:]] == [(e.pk, e.hash) for e in written]
    assert AuditChainHead.objects.get(chain=case_chain(20)).head_hash == written[-1].hash
    assert verify_chain(case_chain(20)) == []
    after = append_event("case.closed", chain=case_chain(20))
    assert (after.seq, after.prev_hash) == (5, written[-1].hash)


@pytest.mark.django_db
def test_a_new_chain_of_more_events_than_one_statement_inserts_is_gapless() -> None:
    count = 2 * INSERT_BATCH + 3
    written = append_events(
        [NewEvent("x.bulk", data={"i": i}) for i in range(count)], chain=case_chain(21)
    )
    assert [e.seq for e in written] == list(range(1, count + 1))
    assert written[0].prev_hash == GENESIS_HASH
    assert AuditEvent.objects.filter(chain=case_chain(21)).count() == count
    assert len({e.pk for e in written}) == count
    assert verify_chain(case_chain(21)) == []
    assert AuditChainHead.objects.get(chain=case_chain(21)).seq == count


@pytest.mark.django_db
def test_append_events_refuses_a_bad_event_before_writing_any() -> None:
    append_event("case.created", chain=case_chain(22))
    system_events = AuditEvent.objects.filter(chain=SYSTEM_CHAIN).count()
    with transaction.atomic():
        with pytest.raises(ValueError, match="dotted"):
            append_events([NewEvent("x.ok"), NewEvent("undotted")], chain=case_chain(22))
        with pytest.raises(ValueError):
            append_events([NewEvent("x.ok"), NewEvent("x.nan", data={"n": float("nan")})])
        # nothing was written, and the transaction goes on
        assert append_events([], chain=case_chain(22)) == []
        assert append_event("case.updated", chain=case_chain(22)).seq == 2
    assert AuditEvent.objects.filter(chain=SYSTEM_CHAIN).count() == system_events
    assert verify_chain(case_chain(22)) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite does not limit lengths")
def test_an_append_the_database_refuses_rolls_its_transaction_back() -> None:
    from django.db import DataError

    append_event("case.created", chain=case_chain(23))
    with transaction.atomic():
        append_event("case.step", chain=case_chain(23))
        with pytest.raises(DataError):  # too long for the column: after the head moved on
            append_event("case.step", actor="x" * 151, chain=case_chain(23))
        assert transaction.get_rollback()  # no savepoint to go back to: all of it rolls back
    assert AuditChainHead.objects.get(chain=case_chain(23)).seq == 1
    assert AuditEvent.objects.filter(chain=case_chain(23)).count() == 1
    assert verify_chain(case_chain(23)) == []


@pytest.mark.parametrize(
    "data",
    [{}, {"note": "Zahlung für Rechnung — ✓", "n": [1, 2.5, None, True]}, {"b": {"a": "\u0000"}}],
)
def test_the_text_around_prev_hash_and_seq_is_the_event_text(data: dict[str, object]) -> None:
    from django.utils import timezone

    import casehub_verify

    now = timezone.now()
    prev = "ab" * 32
    before, between, after = casehub_verify.event_text_around(
        "case:7", now, "user", "ann", "case.created", data
    )
    assert before + prev + between + "41" + after == casehub_verify.event_text(
        "case:7", 41, now, "user", "ann", "case.created", data, prev
    )


def _statements(queries: object) -> list[str]:
    """Return the opening of each captured statement (a prepared one is logged as QUERY = '…')."""
    sqls = [q["sql"].removeprefix("QUERY = '") for q in queries.captured_queries]  # type: ignore[attr-defined]
    return [" ".join(sql.split()[:3]) for sql in sqls]


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement append")
def test_one_event_on_postgresql_is_one_statement_hashed_as_the_verifier_hashes() -> None:
    from django.test.utils import CaptureQueriesContext

    chain = case_chain(9)
    append_event("case.created", chain=chain)  # the chain's head exists from here on
    user = personas.officer()
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        event = append_event(
            "oversight.gate.approved", actor=user, chain=chain, data={"why": "geprüft ✓"}
        )
    assert _statements(queries) == ["WITH head AS"]
    stored = AuditEvent.objects.get(pk=event.pk)
    assert (stored.seq, stored.hash, stored.actor_user_id) == (2, event.hash, user.pk)
    assert AuditChainHead.objects.get(chain=chain).head_hash == event.hash
    assert verify_chain(chain) == []


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements")
def test_the_one_statement_append_is_prepared_once_per_connection() -> None:
    """Django turns psycopg's prepared statements off; the settings turn them on for the append."""
    chain = case_chain(31)
    append_event("case.created", chain=chain)

    def prepared() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            return [row[0] for row in cursor.fetchall() if "sha256" in row[0]]

    before = prepared()
    append_event("case.updated", chain=chain)
    append_event("case.updated", chain=chain)
    assert len(before) == 1 and prepared() == before  # prepared by the first, reused after
    assert verify_chain(chain) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="the one-statement append")
def test_an_append_outside_a_transaction_is_one_statement_and_its_own_transaction() -> None:
    from django.db import DataError
    from django.test.utils import CaptureQueriesContext

    chain = case_chain(32)
    append_event("case.created", chain=chain)
    assert connection.get_autocommit() and not connection.in_atomic_block
    with CaptureQueriesContext(connection) as queries:
        event = append_event("case.updated", chain=chain, data={"n": 1})
    # no BEGIN or COMMIT around it: the statement commits by itself
    assert _statements(queries) == ["WITH head AS"]
    assert AuditEvent.objects.get(pk=event.pk).hash == event.hash
    with pytest.raises(DataError):  # refused whole: the head did not move on
        append_event("case.step", actor="x" * 151, chain=chain)
    assert AuditChainHead.objects.get(chain=chain).seq == 2
    assert append_event("case.step", chain=chain).seq == 3
    assert verify_chain(chain) == []


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="writes along an append")
def test_writes_along_an_append_run_in_its_statement_with_their_row_count() -> None:
    """A caller's writes ride with one event's append (one statement): they are done, their
    count comes back, and the chain stays whole; for a chain with no head yet they run once."""
    from django.test.utils import CaptureQueriesContext

    from audit.chain import Along
    from audit.transitions import audited

    def bump(name: str, chain: str) -> Along:
        # a write on the heads table itself: the other chain's head, one row
        sql = (
            f'"{name}" AS (UPDATE "{AuditChainHead._meta.db_table}" SET seq = seq '  # noqa: S608
            f"WHERE chain = %({name}_chain)s RETURNING 1)"
        )
        return Along(ctes=[sql], params={f"{name}_chain": chain}, first=name)

    other = case_chain(41)
    append_event("case.created", chain=other)
    chain = case_chain(40)
    append_event("case.created", chain=chain)
    writes = bump("b", other)
    with CaptureQueriesContext(connection) as queries, audited(chain=chain) as audit:
        audit.along(writes)
        audit.add(NewEvent("case.updated", None, {"n": 1}))
    assert writes.count == 1
    assert [q["sql"][:10] for q in queries.captured_queries] == ['WITH "b" A']
    assert AuditChainHead.objects.get(chain=chain).seq == 2
    # a chain with no head: the writes run once, then the head is made and the event appended
    fresh = case_chain(42)
    missing = bump("m", case_chain(43))
    with audited(chain=fresh) as audit:
        audit.along(missing)
        audit.add(NewEvent("case.created", None, {}))
    assert missing.count == 0
    # several events: the writes run first, in a statement of their own
    many = bump("x", other)
    with audited(chain=chain) as audit:
        audit.along(many)
        audit.add(NewEvent("case.a", None, {}), NewEvent("case.b", None, {}))
    assert many.count == 1
    with pytest.raises(ValueError, match="clash"), transaction.atomic():
        clash = Along(
            ctes=[bump("c", other).ctes[0]], params={"c_chain": other, "data": 1}, first="c"
        )
        with audited(chain=chain) as audit:
            audit.along(clash)
            audit.add(NewEvent("case.c", None, {}))
    # several callers' writes: one statement still, each with its own count
    both = [bump("y", other), bump("z", case_chain(44))]
    with CaptureQueriesContext(connection) as queries, audited(chain=chain) as audit:
        for writes in both:
            audit.along(writes)
        audit.add(NewEvent("case.d", None, {}))
    assert [w.count for w in both] == [1, 0]
    assert [q["sql"][:10] for q in queries.captured_queries] == ['WITH "y" A']
    for name in (chain, fresh, other):
        assert verify_chain(name) == []
    assert AuditChainHead.objects.get(chain=chain).seq == 5
    assert AuditChainHead.objects.get(chain=fresh).seq == 1


_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.dates()
    | st.decimals(allow_nan=False, allow_infinity=False, places=3)
)
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5) | st.integers(0, 9), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(data=st.dictionaries(st.text(max_size=5) | st.integers(0, 9), _JSON_VALUES, max_size=5))
@settings(max_examples=300, deadline=None)
def test_event_data_without_the_json_round_trip_is_what_the_round_trip_gives(
    data: dict[object, object],
) -> None:
    """Plain data (str keys; str, int, bool, None, lists, dicts) skips the JSON round trip: it must
    come out exactly as the round trip gives it, types included, and as a copy."""
    from django.core.serializers.json import DjangoJSONEncoder

    from audit.chain import _integral_floats_as_ints, _json_safe

    expected = _integral_floats_as_ints(json.loads(json.dumps(data, cls=DjangoJSONEncoder)))
    got = _json_safe(data)
    assert got == expected
    assert json.dumps(got) == json.dumps(expected)  # 1 and True, 1.0 and 1 told apart
    assert got is not data


def test_plain_data_is_copied_and_other_data_takes_the_round_trip() -> None:
    from audit.chain import _json_safe

    nested = {"a": [1, {"b": "c"}]}
    safe = _json_safe(nested)
    nested["a"][1]["b"] = "changed"  # type: ignore[index]
    assert safe == {"a": [1, {"b": "c"}]}
    # a str subclass, a tuple, an int key and an integral float all come back as JSON gives them
    assert _json_safe({"kind": ActorKind.USER, "t": (1, 2), 3: 2.0}) == {
        "kind": "user",
        "t": [1, 2],
        "3": 2,
    }
    assert type(_json_safe({"kind": ActorKind.USER})["kind"]) is str


@pytest.mark.django_db
def test_the_returned_event_is_the_stored_row() -> None:
    user = personas.officer()
    chain = case_chain(33)
    append_event("case.created", chain=chain)
    for actor in (user, "fraud-bot", None):
        event = append_event("case.updated", actor=actor, chain=chain, data={"n": [1, "x"]})
        stored = AuditEvent.objects.get(pk=event.pk)
        fields = [field.attname for field in AuditEvent._meta.concrete_fields]
        assert [getattr(event, name) for name in fields] == [
            getattr(stored, name) for name in fields
        ]
        assert not event._state.adding and event._state.db == "default"
        assert event.actor_user == stored.actor_user


@pytest.mark.django_db
def test_the_head_keeps_the_hash_its_last_event_follows() -> None:
    """A one-event append reads its predecessor's hash from the head's own update (prev_hash is
    moved there from head_hash); a batched append leaves the head as the batch's last event."""
    chain = case_chain(31)
    first = append_event("case.created", chain=chain)
    second = append_event("case.planned", chain=chain, data={"n": 2})
    head = AuditChainHead.objects.get(chain=chain)
    assert (head.seq, head.head_hash, head.prev_hash) == (2, second.hash, first.hash)
    assert second.prev_hash == first.hash
    with transaction.atomic():
        batch = append_events(
            [NewEvent("case.step.one", None, {}), NewEvent("case.step.two", None, {})],
            chain=chain,
        )
    head.refresh_from_db()
    assert (head.seq, head.head_hash, head.prev_hash) == (4, batch[1].hash, batch[0].hash)
    after = append_event("case.closed", chain=chain)
    assert after.prev_hash == batch[1].hash
    assert verify_chain(chain) == []
