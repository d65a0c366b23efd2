from typing import Any

from django.apps import AppConfig


class OversightConfig(AppConfig):
    name = "oversight"
    verbose_name = "Oversight"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        # Imported here, not at the top: models may be imported only once the app registry is
        # ready (Django loads this module before).
        from observability import metrics
        from oversight import gauges

        metrics.register_gate_times_reader(gauges.gate_times)
        post_migrate.connect(_ensure_defaults, sender=self)


def _ensure_defaults(sender: Any, **kwargs: Any) -> None:
    # The reason codes and policy version 1 must exist after every migrate (accounts' roles are
    # synced by its own post_migrate receiver, which runs first).
    # Imported here: the defaults import models, which Django loads after this module.
    from oversight.defaults import ensure_defaults

    ensure_defaults()
