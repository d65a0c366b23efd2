"""Access denials (403, 404 on another user's object, bad tokens) are audited, aggregated per
client, user, kind and minute so that a flood of refused requests cannot flood the chain."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.test import Client, RequestFactory

from accounts import tokens as api_tokens
from accounts.denials import DENIED, SUMMARY, flush_denials, record_denial
from accounts.models import AccessDenial
from audit.chain import SYSTEM_CHAIN, verify_chain
from audit.models import ActorKind, AuditEvent
from tests import personas
from tests.planning.factories import make_case, make_plan

pytestmark = pytest.mark.django_db

MINUTE = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


def _events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain=SYSTEM_CHAIN, action=action).order_by("seq"))


def _session(user: Any, address: str = "127.0.0.1") -> Client:
    client = Client(REMOTE_ADDR=address)
    client.force_login(user)
    return client


def _bearer(user: Any) -> Client:
    return Client(headers={"Authorization": f"Bearer {api_tokens.issue_api_token(user)}"})


@pytest.fixture
def bobs_case(db: None) -> Any:
    bob = personas.analyst("bob")
    case = make_case(bob)
    make_plan(case, leaves=2)
    return case


@pytest.mark.scenario("W4")
@pytest.mark.parametrize(
    ("url", "open_as"),
    [("/cases/{id}/", _session), ("/api/cases/{id}/plan", _bearer), ("/api/cases/{id}", _bearer)],
)
def test_another_analysts_case_by_id_is_404_and_the_attempt_audited(
    url: str, open_as: Any, bobs_case: Any
) -> None:
    path = url.format(id=bobs_case.pk)
    # The owner reads it, and that is no denial.
    assert open_as(bobs_case.submitter).get(path).status_code == 200
    assert not _events(DENIED)

    ana = personas.analyst("ana")
    assert open_as(ana).get(path).status_code == 404

    (event,) = _events(DENIED)
    assert event.actor_kind == ActorKind.USER
    assert event.actor_user_id == ana.pk
    assert event.data == {
        "source": "127.0.0.1",
        "user": "ana",
        "user_id": ana.pk,
        "kind": "not_found",
        "path": path,
        "method": "GET",
    }
    assert verify_chain(SYSTEM_CHAIN) == []


@pytest.mark.scenario("W4")
def test_an_id_scan_counts_in_one_row_and_is_summarised_once(bobs_case: Any) -> None:
    ana = _bearer(personas.analyst("ana"))
    scanned = [bobs_case.pk, *range(bobs_case.pk + 1, bobs_case.pk + 20)]
    for case_id in scanned:
        assert ana.get(f"/api/cases/{case_id}").status_code == 404
    assert len(_events(DENIED)) == 1
    (row,) = AccessDenial.objects.all()
    assert (row.count, row.kind) == (len(scanned), AccessDenial.Kind.NOT_FOUND)
    assert row.first_path == f"/api/cases/{scanned[0]}"
    assert row.last_path == f"/api/cases/{scanned[-1]}"

    flush_denials(now=row.minute + timedelta(minutes=2))
    (summary,) = _events(SUMMARY)
    assert summary.data["count"] == len(scanned)
    assert summary.data["user"] == "ana"
    assert summary.data["last_path"] == f"/api/cases/{scanned[-1]}"


@pytest.mark.scenario("A8")
def test_a_hundred_bad_tokens_in_a_minute_are_one_event_and_one_summary() -> None:
    factory = RequestFactory(REMOTE_ADDR="198.51.100.9")
    client = Client(REMOTE_ADDR="198.51.100.9", headers={"Authorization": "Bearer not-a-token"})
    response = client.get("/api/cases")
    assert response.status_code == 401
    (row,) = AccessDenial.objects.all()
    # The minute is frozen from here on: the rest of the hundred are counted in that minute.
    for _ in range(99):
        record_denial(factory.get("/api/cases"), AccessDenial.Kind.BAD_TOKEN, now=row.minute)

    (event,) = _events(DENIED)
    assert event.actor_kind == ActorKind.ANONYMOUS
    assert event.data["kind"] == "bad_token"
    assert event.data["source"] == "198.51.100.9"
    assert event.data["path"] == "/api/cases"
    assert event.data["user"] is None
    row.refresh_from_db()
    assert row.count == 100

    assert flush_denials(now=row.minute + timedelta(minutes=2)) == {"summaries": 1, "flushed": 1}
    (summary,) = _events(SUMMARY)
    assert summary.actor_kind == ActorKind.SYSTEM
    assert summary.data["count"] == 100
    assert summary.data["source"] == "198.51.100.9"
    assert summary.data["kind"] == "bad_token"
    assert AuditEvent.objects.filter(chain=SYSTEM_CHAIN, action__startswith=DENIED).count() == 2
    assert verify_chain(SYSTEM_CHAIN) == []


def test_a_hundred_bad_tokens_over_http_add_one_event() -> None:
    client = Client(REMOTE_ADDR="198.51.100.10", headers={"Authorization": "Bearer nope"})
    for _ in range(100):
        assert client.get("/api/cases").status_code == 401
    rows = list(AccessDenial.objects.values_list("count", flat=True))
    # One row, or two if the requests straddled a minute; one event a row.
    assert sum(rows) == 100
    assert len(rows) in (1, 2)
    assert len(_events(DENIED)) == len(rows)


def test_a_flush_run_twice_writes_the_summary_once() -> None:
    request = RequestFactory(REMOTE_ADDR="192.0.2.1").get("/nowhere")
    for _ in range(3):
        record_denial(request, AccessDenial.Kind.NOT_FOUND, now=MINUTE)
    later = MINUTE + timedelta(minutes=2)
    assert flush_denials(now=later) == {"summaries": 1, "flushed": 1}
    assert flush_denials(now=later) == {"summaries": 0, "flushed": 0}
    assert flush_denials(now=later + timedelta(minutes=5)) == {"summaries": 0, "flushed": 0}
    (summary,) = _events(SUMMARY)
    assert summary.data["count"] == 3
    assert summary.data["minute"] == "2026-12-01T09:30:00Z"
    assert AccessDenial.objects.get().flushed


def test_the_current_minute_and_single_denials_are_not_summarised() -> None:
    factory = RequestFactory(REMOTE_ADDR="192.0.2.2")
    record_denial(factory.get("/once"), AccessDenial.Kind.NOT_FOUND, now=MINUTE)
    for _ in range(2):
        record_denial(factory.get("/twice"), AccessDenial.Kind.FORBIDDEN, now=MINUTE)
    # The minute is not over (nor its grace period): nothing is flushed.
    assert flush_denials(now=MINUTE + timedelta(seconds=62)) == {"summaries": 0, "flushed": 0}
    # Once it is, the single denial needs no summary (its event says it all), the pair gets one.
    assert flush_denials(now=MINUTE + timedelta(minutes=2)) == {"summaries": 1, "flushed": 2}
    (summary,) = _events(SUMMARY)
    assert (summary.data["kind"], summary.data["count"]) == ("forbidden", 2)
    assert len(_events(DENIED)) == 2


def test_each_source_user_kind_and_minute_has_its_own_first_event() -> None:
    ana = personas.analyst("ana")
    factory = RequestFactory()
    anonymous = factory.get("/x", REMOTE_ADDR="192.0.2.3")
    signed_in = factory.get("/x", REMOTE_ADDR="192.0.2.3")
    signed_in.user = ana  # type: ignore[assignment]
    other_source = factory.get("/x", REMOTE_ADDR="192.0.2.4")
    firsts = [
        record_denial(anonymous, AccessDenial.Kind.NOT_FOUND, now=MINUTE),
        record_denial(anonymous, AccessDenial.Kind.NOT_FOUND, now=MINUTE),  # counted only
        record_denial(anonymous, AccessDenial.Kind.FORBIDDEN, now=MINUTE),
        record_denial(signed_in, AccessDenial.Kind.NOT_FOUND, now=MINUTE),
        record_denial(other_source, AccessDenial.Kind.NOT_FOUND, now=MINUTE),
        record_denial(anonymous, AccessDenial.Kind.NOT_FOUND, now=MINUTE + timedelta(seconds=60)),
    ]
    assert firsts == [True, False, True, True, True, True]
    assert len(_events(DENIED)) == 5
    anonymous_row = AccessDenial.objects.get(
        source="192.0.2.3", user=None, kind="not_found", minute=MINUTE
    )
    assert anonymous_row.count == 2


def test_a_forbidden_page_for_an_analyst_is_recorded() -> None:
    ana = personas.analyst("ana")
    client = _session(ana, "203.0.113.5")
    # The verifier download is for auditors and admins only.
    assert client.get("/audit/verifier/casehub_verify.py").status_code == 403
    assert client.get("/audit/", headers={"HX-Request": "true"}).status_code == 403
    (event,) = _events(DENIED)
    assert event.data["kind"] == "forbidden"
    assert event.data["path"] == "/audit/verifier/casehub_verify.py"
    assert event.data["user"] == "ana"
    assert event.data["source"] == "203.0.113.5"
    row = AccessDenial.objects.get()
    assert (row.count, row.last_path) == (2, "/audit/")
    assert verify_chain(SYSTEM_CHAIN) == []


def test_a_path_matching_no_route_is_recorded_for_an_anonymous_caller() -> None:
    client = Client(REMOTE_ADDR="203.0.113.6")
    assert client.get("/wp-login.php").status_code == 404
    assert client.get("/.env").status_code == 404
    assert client.get("/api/no/such/endpoint").status_code == 404
    (event,) = _events(DENIED)
    assert event.actor_kind == ActorKind.ANONYMOUS
    assert event.data["path"] == "/wp-login.php"
    assert AccessDenial.objects.get().count == 3


def test_missing_static_files_are_not_recorded() -> None:
    client = _session(personas.analyst("ana"))
    assert client.get("/static/casehub/no-such-file.css").status_code == 404
    assert not AccessDenial.objects.exists()
    assert not _events(DENIED)


def test_paths_that_cannot_be_stored_are_cleaned_and_bounded() -> None:
    client = Client(REMOTE_ADDR="203.0.113.7")
    assert client.get("/a%00b/" + "x" * 500).status_code == 404
    (event,) = _events(DENIED)
    assert "\x00" not in event.data["path"]
    assert event.data["path"].startswith("/a\\x00b/")
    assert len(event.data["path"]) == AccessDenial.PATH_LENGTH
    assert verify_chain(SYSTEM_CHAIN) == []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks need PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_two_flushers_at_once_write_each_summary_once() -> None:
    request = RequestFactory(REMOTE_ADDR="192.0.2.10").get("/x")
    for n in range(5):
        for _ in range(3):
            record_denial(request, AccessDenial.Kind.NOT_FOUND, now=MINUTE + timedelta(minutes=n))
    results: list[dict[str, int]] = []
    barrier = threading.Barrier(2)

    def flush() -> None:
        try:
            barrier.wait()
            results.append(flush_denials(now=MINUTE + timedelta(minutes=10)))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=flush) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(result["summaries"] for result in results) == 5
    assert len(_events(SUMMARY)) == 5
    assert verify_chain(SYSTEM_CHAIN) == []


def test_one_anonymous_source_cannot_have_two_rows_for_a_minute() -> None:
    # The unique index holds COALESCE(user, 0): NULL users collide like any other.
    from django.db import IntegrityError, transaction

    key = {"source": "192.0.2.11", "user": None, "kind": "not_found", "minute": MINUTE}
    AccessDenial.objects.create(**key, first_path="/a", last_path="/a")
    with pytest.raises(IntegrityError), transaction.atomic():
        AccessDenial.objects.create(**key, first_path="/b", last_path="/b")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent writers need PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_concurrent_first_denials_write_one_event() -> None:
    threads_count = 4
    barrier = threading.Barrier(threads_count)
    firsts: list[bool] = []

    def deny() -> None:
        try:
            request = RequestFactory(REMOTE_ADDR="192.0.2.12").get("/race")
            barrier.wait()
            firsts.append(record_denial(request, AccessDenial.Kind.NOT_FOUND, now=MINUTE))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=deny) for _ in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(firsts) == [False] * (threads_count - 1) + [True]
    assert AccessDenial.objects.get().count == threads_count
    assert len(_events(DENIED)) == 1


def test_a_bad_token_is_anonymous_even_with_a_session() -> None:
    # The API ignores sessions: whoever is signed in, a bad token names no user.
    client = _session(personas.analyst("ana"))
    response = client.get("/api/cases", headers={"Authorization": "Bearer forged"})
    assert response.status_code == 401
    (event,) = _events(DENIED)
    assert (event.actor_kind, event.data["user"]) == (ActorKind.ANONYMOUS, None)
    assert AccessDenial.objects.get().user_id is None
