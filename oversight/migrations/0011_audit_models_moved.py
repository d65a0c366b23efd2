"""The audit models now belong to the audit app (audit/migrations/0001_initial.py): removed
from this app's state only; their tables stay."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("oversight", "0010_llm_budgets"),
        ("audit", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="AuditEvent"),
                migrations.DeleteModel(name="AuditChainHead"),
            ],
        ),
    ]
