"""Leaf attempts, work items, trust scores, the stop switch and the workers' heartbeats now
belong to the execution app (execution/migrations/0001_initial.py): removed from this app's
state only; their tables stay."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("oversight", "0012_accounts_models_moved"),
        ("execution", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name='executioncontrol',
                    name='one_execution_control',
                ),
                migrations.RemoveConstraint(
                    model_name='leafattempt',
                    name='leaf_attempt_unique',
                ),
                migrations.RemoveConstraint(
                    model_name='trustscore',
                    name='trust_per_capability',
                ),
                migrations.DeleteModel(
                    name='WorkerHeartbeat',
                ),
                migrations.RemoveIndex(
                    model_name='workitem',
                    name='oversight_w_status_1cee47_idx',
                ),
                migrations.RemoveIndex(
                    model_name='workitem',
                    name='oversight_w_status_6f2344_idx',
                ),
                migrations.RemoveIndex(
                    model_name='workitem',
                    name='oversight_w_status_124ffe_idx',
                ),
                migrations.RemoveConstraint(
                    model_name='workitem',
                    name='work_item_per_attempt',
                ),
                migrations.RemoveField(
                    model_name='leafattempt',
                    name='node',
                ),
                migrations.RemoveField(
                    model_name='trustscore',
                    name='agent',
                ),
                migrations.RemoveField(
                    model_name='workitem',
                    name='case',
                ),
                migrations.RemoveField(
                    model_name='workitem',
                    name='completed_by',
                ),
                migrations.RemoveField(
                    model_name='workitem',
                    name='escalation_group',
                ),
                migrations.RemoveField(
                    model_name='workitem',
                    name='group',
                ),
                migrations.RemoveField(
                    model_name='workitem',
                    name='node',
                ),
                migrations.DeleteModel(
                    name='ExecutionControl',
                ),
                migrations.DeleteModel(
                    name='LeafAttempt',
                ),
                migrations.DeleteModel(
                    name='TrustScore',
                ),
                migrations.DeleteModel(
                    name='WorkItem',
                ),
            ],
        ),
    ]
