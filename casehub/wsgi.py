"""WSGI entry point (gunicorn casehub.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

from observability.tracing import configure_tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "casehub.settings")
application = get_wsgi_application()

# Each web worker process exports its own spans, when the OTEL_* variables turn tracing on.
configure_tracing()
