"""Oversight Celery tasks."""

from __future__ import annotations

import socket

from celery import shared_task
from django.contrib.auth import get_user_model
from django.db import connection

from accounts import oidc_mappings, users
from accounts.denials import flush_denials
from audit.checkpoints import write_checkpoints
from oversight.actions import deadlines, whatif


@shared_task(name="oversight.ping")
def ping(username: str) -> dict[str, object]:
    """Answer with the worker's host, its database vendor and whether it sees the user."""
    exists = get_user_model().objects.filter(username=username).exists()
    return {"host": socket.gethostname(), "database": connection.vendor, "user_exists": exists}


@shared_task(name="oversight.write_audit_checkpoints")
def write_audit_checkpoints() -> dict[str, object]:
    """Verify every audit chain and checkpoint the intact ones; broken ones raise an alert event."""
    run = write_checkpoints()
    return {"written": len(run.written), "broken": sorted(run.broken)}


@shared_task(name="oversight.sweep_gates")
def sweep_gates() -> dict[str, int]:
    """Remind, escalate and hold the gates past their deadlines (never approve by time)."""
    return deadlines.sweep_gates()


@shared_task(name="oversight.flush_access_denials")
def flush_access_denials() -> dict[str, int]:
    """Summarise the access denials of every finished minute in the system audit chain."""
    return flush_denials()


@shared_task(name="oversight.expire_admin_requests")
def expire_admin_requests() -> dict[str, int]:
    """Expire pending password resets, role grants and group mapping proposals that were not
    approved in time."""
    return {**users.expire_old_requests(), "group_mappings": oidc_mappings.expire_old_proposals()}


@shared_task(name="oversight.run_policy_whatif")
def run_policy_whatif(whatif_id: int) -> dict[str, object]:
    """Replay a period's plan versions under a proposed policy and write the what-if report."""
    report = whatif.run_whatif(whatif_id)
    return {"whatif": report.pk, "status": report.status, "versions": report.done}
