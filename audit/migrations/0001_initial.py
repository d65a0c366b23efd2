"""The audit models move here from the oversight app, keeping their tables.

Only Django's state changes (SeparateDatabaseAndState): the tables `oversight_auditchainhead`
and `oversight_auditevent`, their indexes, constraints and append-only triggers stay as they
are. The content types are renamed so the models' permissions keep their rows and grants.
"""

from typing import Any

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MOVED = ("auditchainhead", "auditevent")


def rename_content_types(apps: Any, schema_editor: Any) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if not content_type.objects.filter(app_label="audit", model=model).exists():
            content_type.objects.filter(app_label="oversight", model=model).update(
                app_label="audit"
            )


def restore_content_types(apps: Any, schema_editor: Any) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        content_type.objects.filter(app_label="audit", model=model).update(
            app_label="oversight"
        )


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("oversight", "0010_llm_budgets"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
        migrations.CreateModel(
            name="AuditChainHead",
            fields=[
                ("chain", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("seq", models.PositiveBigIntegerField(default=0)),
                ("head_hash", models.CharField(max_length=64)),
            ],
            options={"db_table": "oversight_auditchainhead"},
        ),
        migrations.CreateModel(
            name="AuditEvent",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("chain", models.CharField(max_length=64)),
                ("seq", models.PositiveBigIntegerField()),
                ("time", models.DateTimeField()),
                (
                    "actor_kind",
                    models.CharField(
                        choices=[
                            ("user", "User"),
                            ("agent", "Agent"),
                            ("system", "System"),
                            ("anonymous", "Anonymous"),
                        ],
                        max_length=16,
                    ),
                ),
                ("actor_label", models.CharField(max_length=150)),
                ("action", models.CharField(max_length=100)),
                ("data", models.JSONField(default=dict)),
                ("prev_hash", models.CharField(max_length=64)),
                ("hash", models.CharField(max_length=64, unique=True)),
                (
                    "actor_user",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "db_table": "oversight_auditevent",
                "ordering": ["chain", "seq"],
                "indexes": [
                    models.Index(fields=["action"], name="oversight_a_action_bc9bb4_idx"),
                    models.Index(fields=["-time"], name="oversight_a_time_8b00a3_idx"),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("chain", "seq"), name="audit_event_chain_seq_unique"
                    )
                ],
            },
        ),
            ],
        ),
        migrations.RunPython(rename_content_types, restore_content_types),
    ]
