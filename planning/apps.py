from django.apps import AppConfig


class PlanningConfig(AppConfig):
    name = "planning"
    verbose_name = "Planning"
    default_auto_field = "django.db.models.BigAutoField"
