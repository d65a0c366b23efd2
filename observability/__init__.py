"""Operations: Prometheus metrics (`/metrics`) and optional OpenTelemetry tracing.

- `metrics`: the metric definitions, and counting committed audit events into them.
- `collector`: the gauges read at scrape time (broker queues, worker heartbeats, open leaves).
- `views`: the `/metrics` endpoint and who may scrape it.
- `middleware`: request counts, latencies and server spans.
- `tracing`: tracing set up from the OTEL_* variables (off unless they ask for it).
- `runs`: planning runs and leaf attempts timed and traced.
- `gunicorn`: the gunicorn hooks of multiprocess mode.

Nothing here holds business logic, and nothing imports the apps at import time: the audit module,
which every app imports, imports `metrics`.
"""
