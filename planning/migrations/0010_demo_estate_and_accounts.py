"""The incident pack's estate and the fraud pack's account data as tables, like the invoice ERP's.

Their effects (fail-overs, isolations, notices, freezes) are rows with the acting leaf's
idempotency key, unique: once per key.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('planning', '0009_plan_node_version_index_in_the_key_index'),
    ]

    operations = [
        migrations.CreateModel(
            name='EstateDatabase',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('service', models.CharField(max_length=100, unique=True)),
                ('description', models.CharField(blank=True, max_length=200)),
                ('primary_host', models.CharField(help_text='The primary as configured.', max_length=100)),
                ('replica_host', models.CharField(max_length=100)),
                ('current_primary', models.CharField(help_text='The primary since fail-overs.', max_length=100)),
                ('owners', models.JSONField(blank=True, default=list, help_text='Who hears of its incidents.')),
            ],
        ),
        migrations.CreateModel(
            name='EstateFailover',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('idempotency_key', models.CharField(blank=True, help_text='One effect per key.', max_length=200, null=True, unique=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('service', models.CharField(max_length=100)),
                ('old_primary', models.CharField(max_length=100)),
                ('new_primary', models.CharField(max_length=100)),
            ],
            options={
                'abstract': False,
            },
        ),
        migrations.CreateModel(
            name='EstateHost',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True)),
                ('description', models.CharField(blank=True, max_length=200)),
                ('is_down', models.BooleanField(default=False, help_text='Down: it does not answer.')),
                ('is_isolated', models.BooleanField(default=False, help_text='Cut off the network.')),
                ('logs', models.JSONField(blank=True, default=list, help_text='Its security log lines.')),
            ],
        ),
        migrations.CreateModel(
            name='EstateIsolation',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('idempotency_key', models.CharField(blank=True, help_text='One effect per key.', max_length=200, null=True, unique=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('hosts', models.JSONField(default=list)),
            ],
            options={
                'abstract': False,
            },
        ),
        migrations.CreateModel(
            name='EstateNotice',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('idempotency_key', models.CharField(blank=True, help_text='One effect per key.', max_length=200, null=True, unique=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('recipients', models.JSONField(default=list)),
                ('message', models.TextField()),
            ],
            options={
                'abstract': False,
            },
        ),
        migrations.CreateModel(
            name='FraudAccount',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('account_id', models.CharField(max_length=20, unique=True)),
                ('description', models.CharField(blank=True, max_length=200)),
            ],
        ),
        migrations.CreateModel(
            name='FraudAccountFreeze',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('idempotency_key', models.CharField(blank=True, help_text='One effect per key.', max_length=200, null=True, unique=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('freeze_id', models.CharField(max_length=20, unique=True)),
                ('account_id', models.CharField(db_index=True, max_length=20)),
                ('reason', models.TextField()),
            ],
            options={
                'abstract': False,
            },
        ),
        migrations.CreateModel(
            name='FraudSanctionedParty',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200, unique=True)),
            ],
        ),
        migrations.CreateModel(
            name='FraudTransaction',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tx_id', models.CharField(max_length=20, unique=True)),
                ('account_id', models.CharField(db_index=True, max_length=20)),
                ('amount', models.DecimalField(decimal_places=2, max_digits=14)),
                ('counterparty', models.CharField(max_length=200)),
            ],
        ),
    ]
