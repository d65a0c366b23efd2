"""API tokens now belong to the accounts app (accounts/migrations/0001_initial.py): removed
from this app's state only; the table planning_apitoken stays."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("planning", "0006_promoted_method"),
        ("accounts", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="ApiToken")],
        ),
    ]
