"""Run a sweep while this test's transaction holds a case's audit-chain head (PostgreSQL).

The deadlock the sweeps must not have: a transaction that appends to a case's chain first and
then changes the case's rows (a failing step, an edit, a cancel), against a sweep that would take
those rows first and then wait for the chain head.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connection, transaction

from audit.chain import append_event, case_chain


def _wait_until_another_session_waits_for_a_lock() -> None:
    """Poll PostgreSQL until some other session of this database waits for a lock."""
    with connection.cursor() as cursor:
        for _ in range(3000):
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # else one snapshot a transaction
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return
            threading.Event().wait(0.01)
    raise AssertionError("the sweep never waited for the case's chain")


def sweep_while_the_chain_head_is_held(
    case_id: int, action: str, sweep: Callable[[], Any], then: Callable[[], Any]
) -> list[Any]:
    """Hold the case's chain head (appending `action`), start `sweep` on a thread, wait until it
    waits for a lock, run `then` (the rows' change) and commit; return what the sweep returned.

    Raises what the sweep raised (a deadlock the database broke, say).
    """
    errors: list[BaseException] = []
    results: list[Any] = []
    head_held = threading.Event()

    def run() -> None:
        try:
            head_held.wait()
            results.append(sweep())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        with transaction.atomic():
            append_event(action, chain=case_chain(case_id))
            head_held.set()
            _wait_until_another_session_waits_for_a_lock()
            then()
    finally:
        head_held.set()
        thread.join()
    assert errors == [], errors
    return results


def race_behind_the_case_row(
    case_id: int, first: Callable[[], Any], then: Callable[[], Any]
) -> tuple[Any, Any]:
    """Hold the case's row, start `first` on a thread, wait until it waits for a lock, run `then`
    in the transaction holding the row and commit; return what each returned or raised.

    This forces the interleaving of a deadlock between a path that takes a row of the case (a
    gate) and then the case's row, and one that takes the case's row and then that row: `first`
    gets its row before `then` asks for it. Both outcomes are returned, an exception as a value,
    so a test can assert that neither is a deadlock the database broke.
    """
    from planning.models import Case

    outcomes: dict[str, Any] = {}
    case_held = threading.Event()

    def run() -> None:
        try:
            case_held.wait()
            outcomes["first"] = first()
        except BaseException as exc:
            outcomes["first"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        with transaction.atomic():
            Case.objects.select_for_update().get(pk=case_id)
            case_held.set()
            _wait_until_another_session_waits_for_a_lock()
            try:
                outcomes["then"] = then()
            except BaseException as exc:
                outcomes["then"] = exc
    except BaseException as exc:  # the commit itself (a deadlock breaks it there too)
        outcomes["then"] = exc
    finally:
        case_held.set()
        thread.join()
    return outcomes.get("first"), outcomes.get("then")
