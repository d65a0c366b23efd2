"""The event's hash is no longer indexed.

No read looks an event up by its hash, and (chain, seq) identifies each event; the verifier
recomputes every hash. Its unique index (with the LIKE index Django adds beside it on
PostgreSQL) cost two random-key B-tree inserts an append, more as the trail grows.

SQLite alters the column by rebuilding the table, which drops its append-only triggers
(oversight 0002): they are installed again on the new table. The trigger that refuses an
INSERT OR REPLACE no longer looks at the hash: without its unique index a hash cannot make
an insert replace a stored event, and the test would read the whole table on every insert.
"""

from typing import Any

from django.db import migrations, models

TABLE = "oversight_auditevent"
MESSAGE = "audit events are append-only"
TRIGGERS = {
    "oversight_auditevent_no_update": f"BEFORE UPDATE ON {TABLE}",
    "oversight_auditevent_no_delete": f"BEFORE DELETE ON {TABLE}",
}
REPLACE = "oversight_auditevent_no_replace"
REPLACE_NOW = (
    f"BEFORE INSERT ON {TABLE} WHEN EXISTS (SELECT 1 FROM {TABLE}"
    " WHERE id = NEW.id OR (chain = NEW.chain AND seq = NEW.seq))"
)
REPLACE_BEFORE = (
    f"BEFORE INSERT ON {TABLE} WHEN EXISTS (SELECT 1 FROM {TABLE}"
    " WHERE id = NEW.id OR hash = NEW.hash OR (chain = NEW.chain AND seq = NEW.seq))"
)


def _sqlite_triggers(schema_editor: Any, replace: str) -> None:
    if schema_editor.connection.vendor != "sqlite":
        return
    for name, when in {**TRIGGERS, REPLACE: replace}.items():
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")
        schema_editor.execute(
            f"CREATE TRIGGER {name} {when} BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
        )


def _install(apps: Any, schema_editor: Any) -> None:
    _sqlite_triggers(schema_editor, REPLACE_NOW)


def _install_before(apps: Any, schema_editor: Any) -> None:
    _sqlite_triggers(schema_editor, REPLACE_BEFORE)


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0002_auditchainhead_prev_hash"),
    ]

    operations = [
        # Backwards, this runs last: after the table is rebuilt with the unique hash again.
        migrations.RunPython(migrations.RunPython.noop, _install_before, elidable=False),
        migrations.AlterField(
            model_name="auditevent",
            name="hash",
            field=models.CharField(max_length=64),
        ),
        migrations.RunPython(_install, migrations.RunPython.noop, elidable=False),
    ]
