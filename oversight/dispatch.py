"""The broker as the health check sees it (execution's tasks are sent by execution.dispatch)."""

from __future__ import annotations

from celery import current_app


def broker_status() -> dict[str, object]:
    """Return whether the broker accepts a connection within a few seconds, and its transport."""
    try:
        with current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
            transport = conn.transport_cls
    except Exception as exc:
        return {"ok": False, "error": type(exc).__name__}
    return {"ok": True, "transport": str(transport)}
