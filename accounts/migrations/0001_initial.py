"""Accounts' models move here from oversight (two-person requests, access denials, signing
lockouts) and planning (API tokens), keeping their tables.

Only Django's state changes (SeparateDatabaseAndState): the tables, their indexes and
constraints stay as they are. The content types are renamed so the models' permissions keep
their rows and grants.
"""

from typing import Any

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

MOVED = {
    "apitoken": "planning",
    "signingstate": "oversight",
    "accessdenial": "oversight",
    "passwordresetrequest": "oversight",
    "rolegrantrequest": "oversight",
}


def rename_content_types(apps: Any, schema_editor: Any) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for model, old_app in MOVED.items():
        if not content_type.objects.filter(app_label="accounts", model=model).exists():
            content_type.objects.filter(app_label=old_app, model=model).update(
                app_label="accounts"
            )


def restore_content_types(apps: Any, schema_editor: Any) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for model, old_app in MOVED.items():
        content_type.objects.filter(app_label="accounts", model=model).update(app_label=old_app)


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("oversight", "0011_audit_models_moved"),
        ("planning", "0006_promoted_method"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='ApiToken',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('key_hash', models.CharField(max_length=64, unique=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('last_used_at', models.DateTimeField(blank=True, null=True)),
                        ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_tokens', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'planning_apitoken',
                    },
                ),
                migrations.CreateModel(
                    name='SigningState',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('failures', models.PositiveSmallIntegerField(default=0)),
                        ('locked_at', models.DateTimeField(blank=True, null=True)),
                        ('user', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='signing_state', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'oversight_signingstate',
                    },
                ),
                migrations.CreateModel(
                    name='AccessDenial',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('source', models.CharField(max_length=64)),
                        ('minute', models.DateTimeField()),
                        ('kind', models.CharField(choices=[('forbidden', 'Forbidden'), ('not_found', 'Not Found'), ('bad_token', 'Bad Token')], max_length=16)),
                        ('count', models.PositiveIntegerField(default=1)),
                        ('first_path', models.CharField(max_length=300)),
                        ('last_path', models.CharField(max_length=300)),
                        ('flushed', models.BooleanField(default=False)),
                        ('user', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'oversight_accessdenial',
                        'indexes': [models.Index(fields=['flushed', 'minute'], name='oversight_a_flushed_4bc4b5_idx')],
                        'constraints': [models.UniqueConstraint(models.F('source'), models.Func(models.F('user'), models.Value(0), function='COALESCE', output_field=models.IntegerField()), models.F('kind'), models.F('minute'), name='oversight_access_denial_once_a_minute')],
                    },
                ),
                migrations.CreateModel(
                    name='PasswordResetRequest',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('password_hash', models.CharField(max_length=256)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('status', models.CharField(choices=[('pending', 'Pending'), ('approved', 'Approved'), ('rejected', 'Rejected'), ('expired', 'Expired')], default='pending', max_length=16)),
                        ('decided_at', models.DateTimeField(blank=True, null=True)),
                        ('decided_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('requested_by', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('target', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='password_resets', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'oversight_passwordresetrequest',
                        'ordering': ['-created_at', '-id'],
                        'indexes': [models.Index(fields=['status', 'target'], name='oversight_p_status_dc6132_idx')],
                    },
                ),
                migrations.CreateModel(
                    name='RoleGrantRequest',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('roles', models.JSONField(default=list)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('status', models.CharField(choices=[('pending', 'Pending'), ('approved', 'Approved'), ('rejected', 'Rejected'), ('expired', 'Expired')], default='pending', max_length=16)),
                        ('decided_at', models.DateTimeField(blank=True, null=True)),
                        ('reason', models.CharField(blank=True, max_length=500)),
                        ('decided_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('requested_by', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to=settings.AUTH_USER_MODEL)),
                        ('target', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='role_grants', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'oversight_rolegrantrequest',
                        'ordering': ['-created_at', '-id'],
                        'indexes': [models.Index(fields=['status', 'target'], name='oversight_r_status_b637cc_idx')],
                    },
                ),
            ],
        ),
        migrations.RunPython(rename_content_types, restore_content_types),
    ]
