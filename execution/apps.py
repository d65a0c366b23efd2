from django.apps import AppConfig


class ExecutionConfig(AppConfig):
    name = "execution"
    verbose_name = "Execution"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported once the app registry is ready: the checks and gauges read the models.
        from execution import checks, gauges  # noqa: F401 (checks registers itself)
        from observability import collector

        collector.register_database_readers(gauges.heartbeats, gauges.open_leaves)
