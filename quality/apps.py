from django.apps import AppConfig


class QualityConfig(AppConfig):
    name = "quality"
    verbose_name = "Quality"
    default_auto_field = "django.db.models.BigAutoField"
