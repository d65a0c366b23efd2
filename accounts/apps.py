from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = "Accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        # Imported here, not at the top: models may be imported only once the app registry is
        # ready (Django loads this module before).
        from accounts import roles, signals

        signals.connect()
        post_migrate.connect(roles.sync_roles_after_migrate, sender=self)
