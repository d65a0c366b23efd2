"""Execution's models move here from oversight (leaf attempts, work items, trust scores, the
stop switch, workers' heartbeats), keeping their tables.

Only Django's state changes (SeparateDatabaseAndState): the tables, their indexes and
constraints stay as they are. The content types are renamed so the models' permissions keep
their rows and grants.
"""

from typing import Any

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MOVED = ["workerheartbeat", "executioncontrol", "leafattempt", "trustscore", "workitem"]


def rename_content_types(apps: Any, schema_editor: Any) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MOVED:
        if not content_type.objects.filter(app_label="execution", model=model).exists():
            content_type.objects.filter(app_label="oversight", model=model).update(
                app_label="execution"
            )


def restore_content_types(apps: Any, schema_editor: Any) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    content_type.objects.filter(app_label="execution", model__in=MOVED).update(
        app_label="oversight"
    )


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ('oversight', '0012_accounts_models_moved'),
        ('auth', '0012_alter_user_first_name_max_length'),
        ('planning', '0007_api_token_moved'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='WorkerHeartbeat',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('hostname', models.CharField(max_length=255, unique=True)),
                        ('pid', models.PositiveIntegerField()),
                        ('started_at', models.DateTimeField()),
                        ('last_seen', models.DateTimeField()),
                    ],
                    options={
                        'db_table': 'oversight_workerheartbeat',
                    },
                ),
                migrations.CreateModel(
                    name='ExecutionControl',
                    fields=[
                        ('id', models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                        ('stopped', models.BooleanField(default=False)),
                        ('changed_at', models.DateTimeField(blank=True, null=True)),
                        ('reason', models.TextField(blank=True)),
                        ('changed_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'oversight_executioncontrol',
                        'constraints': [models.CheckConstraint(condition=models.Q(('id', 1)), name='one_execution_control')],
                    },
                ),
                migrations.CreateModel(
                    name='LeafAttempt',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('number', models.PositiveIntegerField()),
                        ('worker', models.CharField(blank=True, max_length=255)),
                        ('started_at', models.DateTimeField()),
                        ('finished_at', models.DateTimeField(blank=True, null=True)),
                        ('outcome', models.CharField(choices=[('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('lost', 'lost (worker gone, lease expired)'), ('stale', 'stale (result refused)'), ('cancelled', 'Cancelled')], default='running', max_length=10)),
                        ('error_class', models.CharField(blank=True, max_length=20)),
                        ('error', models.TextField(blank=True)),
                        ('node', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='runs', to='planning.plannode')),
                    ],
                    options={
                        'db_table': 'oversight_leafattempt',
                        'ordering': ['node', 'number'],
                        'constraints': [models.UniqueConstraint(fields=('node', 'number'), name='leaf_attempt_unique')],
                    },
                ),
                migrations.CreateModel(
                    name='TrustScore',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('capability', models.CharField(max_length=100)),
                        ('successes', models.FloatField(default=0.0)),
                        ('failures', models.FloatField(default=0.0)),
                        ('updated_at', models.DateTimeField()),
                        ('agent', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='scores', to='planning.agent')),
                    ],
                    options={
                        'db_table': 'oversight_trustscore',
                        'ordering': ['agent', 'capability'],
                        'constraints': [models.UniqueConstraint(fields=('agent', 'capability'), name='trust_per_capability')],
                    },
                ),
                migrations.CreateModel(
                    name='WorkItem',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('attempt', models.PositiveIntegerField(help_text='The leaf attempt this item belongs to.')),
                        ('status', models.CharField(choices=[('open', 'Open'), ('completed', 'Completed'), ('cancelled', 'Cancelled')], default='open', max_length=10)),
                        ('created_at', models.DateTimeField()),
                        ('deadline', models.DateTimeField()),
                        ('remind_at', models.DateTimeField(blank=True, help_text='When the group is reminded (half-way to the deadline).', null=True)),
                        ('reminded_at', models.DateTimeField(blank=True, null=True)),
                        ('escalated_at', models.DateTimeField(blank=True, null=True)),
                        ('completed_at', models.DateTimeField(blank=True, null=True)),
                        ('output', models.JSONField(blank=True, null=True)),
                        ('case', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='work_items', to='planning.case')),
                        ('completed_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('escalation_group', models.ForeignKey(blank=True, help_text='Once the item is escalated, its members may complete it too.', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='auth.group')),
                        ('group', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='work_items', to='auth.group')),
                        ('node', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='work_items', to='planning.plannode')),
                    ],
                    options={
                        'db_table': 'oversight_workitem',
                        'ordering': ['deadline', 'id'],
                        'indexes': [models.Index(fields=['status', 'group', 'deadline'], name='oversight_w_status_1cee47_idx'), models.Index(fields=['status', 'deadline'], name='oversight_w_status_6f2344_idx'), models.Index(fields=['status', 'remind_at'], name='oversight_w_status_124ffe_idx')],
                        'constraints': [models.UniqueConstraint(fields=('node', 'attempt'), name='work_item_per_attempt')],
                    },
                ),
            ],
        ),
        migrations.RunPython(rename_content_types, restore_content_types),
    ]
