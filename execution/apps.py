from django.apps import AppConfig


class ExecutionConfig(AppConfig):
    name = "execution"
    verbose_name = "Execution"
    default_auto_field = "django.db.models.BigAutoField"
