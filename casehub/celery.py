"""The Celery application; tasks live in the apps' tasks.py and use shared_task."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "casehub.settings")

app = Celery("casehub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.steps["worker"].add("oversight.worker.HeartbeatStep")
