"""The two-person requests, access denials and signing lockouts now belong to the accounts
app (accounts/migrations/0001_initial.py): removed from this app's state only; their tables
stay."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("oversight", "0011_audit_models_moved"),
        ("accounts", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(
                    model_name='accessdenial',
                    name='oversight_a_flushed_4bc4b5_idx',
                ),
                migrations.RemoveConstraint(
                    model_name='accessdenial',
                    name='oversight_access_denial_once_a_minute',
                ),
                migrations.RemoveIndex(
                    model_name='passwordresetrequest',
                    name='oversight_p_status_dc6132_idx',
                ),
                migrations.RemoveIndex(
                    model_name='rolegrantrequest',
                    name='oversight_r_status_b637cc_idx',
                ),
                migrations.RemoveField(
                    model_name='accessdenial',
                    name='user',
                ),
                migrations.RemoveField(
                    model_name='passwordresetrequest',
                    name='decided_by',
                ),
                migrations.RemoveField(
                    model_name='passwordresetrequest',
                    name='requested_by',
                ),
                migrations.RemoveField(
                    model_name='passwordresetrequest',
                    name='target',
                ),
                migrations.RemoveField(
                    model_name='rolegrantrequest',
                    name='decided_by',
                ),
                migrations.RemoveField(
                    model_name='rolegrantrequest',
                    name='requested_by',
                ),
                migrations.RemoveField(
                    model_name='rolegrantrequest',
                    name='target',
                ),
                migrations.DeleteModel(
                    name='SigningState',
                ),
                migrations.DeleteModel(
                    name='AccessDenial',
                ),
                migrations.DeleteModel(
                    name='PasswordResetRequest',
                ),
                migrations.DeleteModel(
                    name='RoleGrantRequest',
                ),
            ],
        ),
    ]
