from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from oversight.audit import (
    GENESIS_HASH,
    SYSTEM_CHAIN,
    append_event,
    case_chain,
    verify_chain,
)
from oversight.models import AuditChainHead, AuditEvent
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
