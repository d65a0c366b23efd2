"""The LLM budget ledger's models (LlmUsage, LlmReservation) move here from oversight, keeping
their tables, indexes and constraints (SeparateDatabaseAndState: Django's state only). The
content types are renamed so the models' permissions keep their rows and grants.
"""

from typing import Any

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

MOVED = ("llmusage", "llmreservation")


def rename_content_types(apps: Any, schema_editor: Any) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if not content_type.objects.filter(app_label="planning", model=model).exists():
            content_type.objects.filter(app_label="oversight", model=model).update(
                app_label="planning"
            )


def restore_content_types(apps: Any, schema_editor: Any) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        content_type.objects.filter(app_label="planning", model=model).update(
            app_label="oversight"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("oversight", "0012_accounts_models_moved"),
        ("planning", "0007_api_token_moved"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='LlmReservation',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('day', models.DateField()),
                        ('model', models.CharField(max_length=200)),
                        ('purpose', models.CharField(max_length=100)),
                        ('tokens', models.PositiveBigIntegerField()),
                        ('cost_nano_usd', models.PositiveBigIntegerField(default=0)),
                        ('is_priced', models.BooleanField(default=True)),
                        ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                        ('expires_at', models.DateTimeField()),
                        ('case', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='planning.case')),
                    ],
                    options={
                        'db_table': 'oversight_llmreservation',
                        'indexes': [models.Index(fields=['day', 'expires_at'], name='llm_reservation_day'), models.Index(fields=['case', 'expires_at'], name='llm_reservation_case')],
                    },
                ),
                migrations.CreateModel(
                    name='LlmUsage',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('day', models.DateField(blank=True, null=True)),
                        ('calls', models.PositiveIntegerField(default=0)),
                        ('tokens', models.PositiveBigIntegerField(default=0)),
                        ('cost_nano_usd', models.PositiveBigIntegerField(default=0)),
                        ('unpriced_calls', models.PositiveIntegerField(default=0)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('case', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='planning.case')),
                    ],
                    options={
                        'db_table': 'oversight_llmusage',
                        'constraints': [models.CheckConstraint(condition=models.Q(models.Q(('case__isnull', True), ('day__isnull', False)), models.Q(('case__isnull', False), ('day__isnull', True)), _connector='OR'), name='llm_usage_case_or_day'), models.UniqueConstraint(fields=('case',), name='llm_usage_per_case'), models.UniqueConstraint(fields=('day',), name='llm_usage_per_day')],
                    },
                ),
            ],
        ),
        migrations.RunPython(rename_content_types, restore_content_types),
    ]
