from django.apps import AppConfig


class OversightConfig(AppConfig):
    name = "oversight"
    verbose_name = "Oversight"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from oversight import checks, roles, signals  # noqa: F401 (checks registers itself)

        signals.connect()
        post_migrate.connect(roles.sync_roles_after_migrate, sender=self)
