from django.apps import AppConfig


class OversightConfig(AppConfig):
    name = "oversight"
    verbose_name = "Oversight"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from observability import collector, metrics
        from oversight import checks, gauges, roles, signals  # noqa: F401 (checks registers itself)

        signals.connect()
        collector.register_database_readers(gauges.heartbeats, gauges.open_leaves)
        metrics.register_gate_times_reader(gauges.gate_times)
        post_migrate.connect(roles.sync_roles_after_migrate, sender=self)
