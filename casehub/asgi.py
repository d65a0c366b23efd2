"""ASGI entry point (uvicorn casehub.asgi:application)."""

import os

from django.core.asgi import get_asgi_application

from observability.tracing import configure_tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "casehub.settings")
application = get_asgi_application()

# The server process exports its own spans, when the OTEL_* variables turn tracing on.
configure_tracing()
