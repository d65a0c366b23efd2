"""A plan node's version has no index of its own: the unique (version, key) index leads with it.

The second index gave a prepared statement's generic plan a worse way to look up a node by its
version and key (the version's every node read, the key filtered), and cost every node's insert.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("planning", "0008_llm_budget_models_moved"),
    ]

    operations = [
        migrations.AlterField(
            model_name="plannode",
            name="version",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="nodes",
                to="planning.planversion",
            ),
        ),
    ]
