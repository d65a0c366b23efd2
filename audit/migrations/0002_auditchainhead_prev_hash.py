"""A chain head keeps the hash its last event follows, so one append is one UPDATE (no locking
read before it). Existing heads get it from their last event."""

from typing import Any

from django.db import migrations, models


def fill_prev_hash(apps: Any, schema_editor: Any) -> None:
    head_model = apps.get_model("audit", "AuditChainHead")
    event_model = apps.get_model("audit", "AuditEvent")
    for head in head_model.objects.filter(seq__gt=0).iterator():
        last = event_model.objects.filter(chain=head.chain, seq=head.seq).first()
        if last is not None:
            head.prev_hash = last.prev_hash
            head.save(update_fields=["prev_hash"])


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="auditchainhead",
            name="prev_hash",
            field=models.CharField(blank=True, db_default="", max_length=64),
        ),
        migrations.RunPython(fill_prev_hash, migrations.RunPython.noop),
    ]
