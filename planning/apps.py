from typing import Any

from django.apps import AppConfig


class PlanningConfig(AppConfig):
    name = "planning"
    verbose_name = "Planning"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        post_migrate.connect(_register_packs, sender=self)


def _register_packs(sender: Any, **kwargs: Any) -> None:
    # The packs, their tools and agents live in code; their rows must exist after every migrate.
    # Imported here: the catalogue imports models, which Django loads after this module.
    from planning.catalogue import sync_packs

    sync_packs()
