"""The database itself refuses to change or remove audit events (A1 to A3).

PostgreSQL: the application's role lacks the privileges, and triggers (ENABLE ALWAYS) refuse the
table's owner and a superuser in replica mode. SQLite: triggers refuse every connection. Each test
runs the checks of the database the suite runs on, so nothing is skipped on either.
"""

from __future__ import annotations

import importlib
import os
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from audit.chain import append_event, case_chain, verify_chain
from audit.models import AuditChainHead, AuditEvent
from tests.audit_triggers import audit_trigger_states

pytestmark = pytest.mark.django_db(transaction=True)

CHAIN = case_chain(7001)
REFUSED = "audit events are append-only"
# Django's errors, and those of the raw connections that play other roles than the app's.
RAW_ERRORS: tuple[type[Exception], ...] = (DatabaseError, sqlite3.DatabaseError)
try:
    import psycopg

    RAW_ERRORS += (psycopg.Error,)
except ImportError:  # SQLite only
    pass
MIGRATION = importlib.import_module("oversight.migrations.0002_audit_events_append_only")
# Every statement that would change stored events, on PostgreSQL; each is refused on its own.
PG_TAMPERING = {
    "update": "UPDATE oversight_auditevent SET data = '{\"n\": 99}' WHERE chain = %(chain)s",
    "delete": "DELETE FROM oversight_auditevent WHERE chain = %(chain)s AND seq = 2",
    "truncate": "TRUNCATE oversight_auditevent",
    "upsert": (
        "INSERT INTO oversight_auditevent SELECT * FROM oversight_auditevent"
        " WHERE chain = %(chain)s ON CONFLICT (id) DO UPDATE SET action = 'tampered.event'"
    ),
}
# The same on SQLite, which has no TRUNCATE but deletes quietly on INSERT OR REPLACE.
SQLITE_TAMPERING = {
    "update": "UPDATE oversight_auditevent SET data = '{\"n\": 99}' WHERE chain = %(chain)s",
    "delete": "DELETE FROM oversight_auditevent WHERE chain = %(chain)s AND seq = 2",
    "delete all": "DELETE FROM oversight_auditevent",
    "replace": (
        "INSERT OR REPLACE INTO oversight_auditevent SELECT * FROM oversight_auditevent"
        " WHERE chain = %(chain)s"
    ),
    "upsert": (
        "INSERT INTO oversight_auditevent SELECT * FROM oversight_auditevent"
        " WHERE chain = %(chain)s AND true ON CONFLICT (id) DO UPDATE SET action = 'tampered.event'"
    ),
}


def _execute(sql: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, {"chain": CHAIN})


def _events() -> list[dict[str, Any]]:
    return list(AuditEvent.objects.order_by("id").values())


def _append_three() -> list[dict[str, Any]]:
    for n in range(3):
        append_event("tests.step", chain=CHAIN, data={"n": n})
    return _events()


def _assert_untouched(before: list[dict[str, Any]]) -> None:
    assert _events() == before
    assert verify_chain(CHAIN) == []
    assert AuditChainHead.objects.get(chain=CHAIN).seq == 3


def _each_refused(execute: Callable[[str], None], statements: dict[str, str]) -> dict[str, str]:
    """Run every statement; return each one's error message (a statement that passes fails)."""
    messages: dict[str, str] = {}
    for name, sql in statements.items():
        with pytest.raises(RAW_ERRORS) as refused:
            execute(sql)
        messages[name] = str(refused.value)
    return messages


def _is_superuser() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        return bool(cursor.fetchone()[0])


# The application's role (A1) --------------------------------------------------------------------


@pytest.fixture
def app_role() -> Iterator[str]:
    """The application's PostgreSQL role, as the migration left it in the test database.

    CI names it in CASEHUB_DB_APP_ROLE, creates it and migrates with it; elsewhere the fixture
    creates it (when the test user may) and grants what the migration would have.
    """
    role = settings.CASEHUB_DB_APP_ROLE or "casehub_app"
    quoted = connection.ops.quote_name(role)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        exists = cursor.fetchone() is not None
        if not exists:
            cursor.execute(
                "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
            )
            if not cursor.fetchone()[0]:
                pytest.skip(f"no role {role} and the test user may not create one")
            cursor.execute(f"CREATE ROLE {quoted} LOGIN")
    if not settings.CASEHUB_DB_APP_ROLE:
        with connection.schema_editor() as editor:
            # As the owner's default privileges grant it (scripts/setup-postgres-roles.sql).
            editor.execute(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON oversight_auditevent TO {quoted}"
            )
            MIGRATION.restrict_app_role(editor, role)
    try:
        yield role
    finally:
        if not exists:
            with connection.cursor() as cursor:
                cursor.execute(f"DROP OWNED BY {quoted}")
                cursor.execute(f"DROP ROLE {quoted}")


def _connect_as(role: str) -> Any:
    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"] or "localhost",
        port=db["PORT"] or 5432,
        dbname=db["NAME"],
        user=role,
        password=os.environ.get("CASEHUB_TEST_APP_ROLE_PASSWORD") or None,
        autocommit=True,
    )


@pytest.mark.scenario("A1")
def test_the_app_cannot_update_delete_or_truncate_audit_events(
    request: pytest.FixtureRequest,
) -> None:
    before = _append_three()
    if connection.vendor == "postgresql":
        role = request.getfixturevalue("app_role")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT privilege_type FROM information_schema.role_table_grants"
                " WHERE grantee = %s AND table_name = 'oversight_auditevent'",
                [role],
            )
            assert {row[0] for row in cursor.fetchall()} == {"INSERT", "SELECT"}
        with _connect_as(role) as app:
            count = "SELECT count(*) FROM oversight_auditevent WHERE chain = %s"
            assert app.execute(count, [CHAIN]).fetchone() == (3,)
            messages = _each_refused(lambda sql: app.execute(sql, {"chain": CHAIN}), PG_TAMPERING)
            assert all("permission denied" in m for m in messages.values()), messages
    else:
        messages = _each_refused(_execute, SQLITE_TAMPERING)
        assert all(REFUSED in m for m in messages.values()), messages
        with pytest.raises(DatabaseError, match=REFUSED):
            AuditEvent.objects.filter(chain=CHAIN).update(action="tampered.event")
    _assert_untouched(before)


# The table's owner (A2) ----------------------------------------------------------------------


@pytest.mark.scenario("A2")
def test_the_table_owner_is_refused_by_the_triggers() -> None:
    before = _append_three()
    if connection.vendor == "postgresql":
        if not _is_superuser():
            pytest.skip("giving the audit table to another owner needs a superuser")
        owner = f"casehub_test_owner_{os.getpid()}"
        with transaction.atomic(), connection.cursor() as cursor:
            # Roles and ownership are transactional: all of it is rolled back at the end.
            cursor.execute(f"CREATE ROLE {owner} NOLOGIN NOSUPERUSER")
            cursor.execute(f"ALTER TABLE oversight_auditevent OWNER TO {owner}")
            cursor.execute(f"SET LOCAL ROLE {owner}")
            cursor.execute(
                "SELECT rolsuper, pg_get_userbyid(c.relowner) FROM pg_roles, pg_class c"
                " WHERE rolname = current_user AND c.relname = 'oversight_auditevent'"
            )
            assert cursor.fetchone() == (False, owner)

            def as_owner(sql: str) -> None:
                with transaction.atomic():
                    cursor.execute(sql, {"chain": CHAIN})

            messages = _each_refused(as_owner, PG_TAMPERING)
            transaction.set_rollback(True)
    else:
        # SQLite has no roles: whoever may write the file is its owner, the triggers refuse it.
        owner_connection = sqlite3.connect(connection.settings_dict["NAME"])
        try:
            messages = _each_refused(
                lambda sql: owner_connection.execute(
                    sql.replace("%(chain)s", ":chain"), {"chain": CHAIN}
                ),
                SQLITE_TAMPERING,
            )
        finally:
            owner_connection.close()
    assert all(REFUSED in m for m in messages.values()), messages
    _assert_untouched(before)


# Bypass attempts (A3) ------------------------------------------------------------------------


@pytest.mark.scenario("A3")
def test_bypass_attempts_are_still_refused() -> None:
    before = _append_three()
    if connection.vendor == "postgresql":
        if not _is_superuser():
            pytest.skip("session_replication_role can only be set by a superuser")
        assert set(audit_trigger_states().values()) == {"A"}  # ENABLE ALWAYS
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL session_replication_role = replica")
            cursor.execute("SHOW session_replication_role")
            assert cursor.fetchone() == ("replica",)

            def in_replica_mode(sql: str) -> None:
                with transaction.atomic():
                    cursor.execute(sql, {"chain": CHAIN})

            messages = _each_refused(in_replica_mode, PG_TAMPERING)
            transaction.set_rollback(True)
    else:
        # SQLite's quiet ways around a DELETE trigger: REPLACE and an upsert.
        messages = _each_refused(_execute, {k: SQLITE_TAMPERING[k] for k in ("replace", "upsert")})
    assert all(REFUSED in m for m in messages.values()), messages
    _assert_untouched(before)


# The test suite's own flush ------------------------------------------------------------------


@pytest.mark.scenario("A1")
def test_the_triggers_are_in_force_in_a_transactional_test() -> None:
    expected = (
        {name: "A" for name in MIGRATION.PG_TRIGGERS}
        if connection.vendor == "postgresql"
        else {name: "present" for name in MIGRATION.SQLITE_TRIGGERS}
    )
    assert audit_trigger_states() == expected
    append_event("tests.step", chain=CHAIN)
    with pytest.raises(DatabaseError, match=REFUSED):
        AuditEvent.objects.filter(chain=CHAIN).update(action="tampered.event")
    with pytest.raises(DatabaseError, match=REFUSED):
        AuditEvent.objects.filter(chain=CHAIN).delete()


def test_the_suites_flush_empties_the_audit_table_and_leaves_the_triggers_in_force() -> None:
    states = audit_trigger_states()
    append_event("tests.step", chain=CHAIN)
    call_command("flush", interactive=False, verbosity=0)
    # post_migrate, run after a flush, may write events of its own on other chains
    assert not AuditEvent.objects.filter(chain=CHAIN).exists()
    assert not AuditChainHead.objects.filter(chain=CHAIN).exists()
    assert audit_trigger_states() == states
    append_event("tests.step", chain=CHAIN)
    with pytest.raises(DatabaseError, match=REFUSED):
        AuditEvent.objects.filter(chain=CHAIN).delete()
