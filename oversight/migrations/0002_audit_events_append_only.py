"""Make the audit events append-only in the database itself.

PostgreSQL: row triggers refuse UPDATE and DELETE, a statement trigger refuses TRUNCATE, all
ENABLE ALWAYS so that `session_replication_role = replica` does not switch them off; when
CASEHUB_DB_APP_ROLE names the application's role, it keeps only INSERT and SELECT on the table.
SQLite: BEFORE UPDATE and BEFORE DELETE triggers, and a BEFORE INSERT trigger that refuses an
insert colliding with a stored event (INSERT OR REPLACE would delete it, firing no DELETE trigger).

The chain heads (oversight_auditchainhead) stay updatable: every append advances one.
"""

from typing import Any

from django.conf import settings
from django.db import migrations

TABLE = "oversight_auditevent"
MESSAGE = "audit events are append-only"
PG_FUNCTION = "oversight_auditevent_refuse_change"
PG_TRIGGERS = {
    "oversight_auditevent_no_update": "BEFORE UPDATE ON oversight_auditevent FOR EACH ROW",
    "oversight_auditevent_no_delete": "BEFORE DELETE ON oversight_auditevent FOR EACH ROW",
    "oversight_auditevent_no_truncate": (
        "BEFORE TRUNCATE ON oversight_auditevent FOR EACH STATEMENT"
    ),
}
SQLITE_TRIGGERS = {
    "oversight_auditevent_no_update": "BEFORE UPDATE ON oversight_auditevent",
    "oversight_auditevent_no_delete": "BEFORE DELETE ON oversight_auditevent",
    "oversight_auditevent_no_replace": (
        "BEFORE INSERT ON oversight_auditevent WHEN EXISTS (SELECT 1 FROM oversight_auditevent"
        " WHERE id = NEW.id OR hash = NEW.hash OR (chain = NEW.chain AND seq = NEW.seq))"
    ),
}


def _install(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE OR REPLACE FUNCTION {PG_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$"
            f" BEGIN RAISE EXCEPTION '{MESSAGE}: % refused on %', TG_OP, TG_TABLE_NAME"
            " USING ERRCODE = 'insufficient_privilege'; END $$",
            params=None,  # the % are PL/pgSQL's placeholders, not the driver's
        )
        for name, when in PG_TRIGGERS.items():
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name} ON {TABLE}")
            schema_editor.execute(f"CREATE TRIGGER {name} {when} EXECUTE FUNCTION {PG_FUNCTION}()")
            schema_editor.execute(f"ALTER TABLE {TABLE} ENABLE ALWAYS TRIGGER {name}")
        if settings.CASEHUB_DB_APP_ROLE:
            restrict_app_role(schema_editor, settings.CASEHUB_DB_APP_ROLE)
    elif connection.vendor == "sqlite":
        for name, when in SQLITE_TRIGGERS.items():
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
            schema_editor.execute(
                f"CREATE TRIGGER {name} {when} BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
            )


def restrict_app_role(schema_editor: Any, role: str) -> None:
    """Leave the application's role INSERT and SELECT on the audit events, nothing else.

    Raises django.db.ProgrammingError when the role does not exist.
    """
    quoted = schema_editor.connection.ops.quote_name(role)
    schema_editor.execute(f"REVOKE ALL ON {TABLE} FROM {quoted}")
    schema_editor.execute(f"GRANT SELECT, INSERT ON {TABLE} TO {quoted}")


def _remove(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        for name in PG_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name} ON {TABLE}")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {PG_FUNCTION}()")
        if settings.CASEHUB_DB_APP_ROLE:
            quoted = connection.ops.quote_name(settings.CASEHUB_DB_APP_ROLE)
            schema_editor.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE} TO {quoted}")
    elif connection.vendor == "sqlite":
        for name in SQLITE_TRIGGERS:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("oversight", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(_install, _remove, elidable=False),
    ]
