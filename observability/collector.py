"""Gauges read when /metrics is scraped: broker queue depth, worker heartbeats, open leaves.

They describe the system, not one process, so the process answering the scrape reads them from
the broker and the database (they are not multiprocess values). A broker or database that does
not answer leaves its `*_up` gauge at 0 and its other gauges out; the scrape still succeeds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from django.conf import settings
from django.utils import timezone
from kombu import Connection
from kombu.exceptions import ChannelError
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

BROKER_TIMEOUT_S = 2.0


class CaseHubCollector(Collector):
    """Collect the scrape-time gauges; never raise for a service that is down."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Yield the broker's, the workers' and the leaves' gauges."""
        yield from _broker_metrics()
        yield from _database_metrics()


def queue_names() -> list[str]:
    """Return the Celery queues CaseHub's tasks go to (the default queue unless configured)."""
    return [getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", "celery")]


def _broker_connection() -> Connection:
    url = settings.CELERY_BROKER_URL
    options: dict[str, Any] = dict(getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}))
    if url.startswith(("redis://", "rediss://")):
        options |= {"socket_connect_timeout": BROKER_TIMEOUT_S, "socket_timeout": BROKER_TIMEOUT_S}
    return Connection(url, transport_options=options, connect_timeout=BROKER_TIMEOUT_S)


def queue_depths() -> dict[str, int]:
    """Return the messages waiting in each queue (not those a worker holds unacknowledged).

    Raises whatever the transport raises when the broker does not answer.
    """
    depths: dict[str, int] = {}
    with _broker_connection() as conn:
        conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
        for name in queue_names():
            channel = conn.channel()
            try:
                depths[name] = channel.queue_declare(queue=name, passive=True).message_count
            except ChannelError:
                # Redis keeps no empty list: a queue never used, or drained, does not exist.
                depths[name] = 0
            finally:
                channel.close()
    return depths


def _broker_metrics() -> Iterator[GaugeMetricFamily]:
    up = GaugeMetricFamily("casehub_broker_up", "1 when the broker answered this scrape, else 0.")
    try:
        depths = queue_depths()
    except Exception as exc:
        logger.warning("metrics: the broker did not answer: %s", type(exc).__name__)
        up.add_metric([], 0)
        yield up
        return
    up.add_metric([], 1)
    yield up
    queued = GaugeMetricFamily(
        "casehub_queue_messages", "Messages waiting in a Celery queue.", labels=["queue"]
    )
    for name, depth in depths.items():
        queued.add_metric([name], depth)
    yield queued


def _database_metrics() -> Iterator[GaugeMetricFamily]:
    up = GaugeMetricFamily(
        "casehub_database_up", "1 when the database answered this scrape, else 0."
    )
    try:
        beats, leaves = _read_database()
    except Exception as exc:
        logger.warning("metrics: the database did not answer: %s", type(exc).__name__)
        up.add_metric([], 0)
        yield up
        return
    up.add_metric([], 1)
    yield up
    now = timezone.now()
    stale_after = settings.CASEHUB_HEARTBEAT_STALE_S
    age = GaugeMetricFamily(
        "casehub_worker_heartbeat_age_seconds",
        "Seconds since each Celery worker's last heartbeat.",
        labels=["worker"],
    )
    alive = 0
    for hostname, last_seen in beats:
        seconds = max(0.0, (now - last_seen).total_seconds())
        age.add_metric([hostname], seconds)
        alive += seconds <= stale_after
    yield age
    workers = GaugeMetricFamily(
        "casehub_workers",
        "Celery workers by heartbeat: alive (seen within CASEHUB_HEARTBEAT_STALE_S) or stale.",
        labels=["state"],
    )
    workers.add_metric(["alive"], alive)
    workers.add_metric(["stale"], len(beats) - alive)
    yield workers
    open_leaves = GaugeMetricFamily(
        "casehub_leaves",
        "Leaves ready to run, waiting to retry, running, and running past their lease (stuck).",
        labels=["state"],
    )
    for state in ("ready", "retrying", "running", "stuck"):
        open_leaves.add_metric([state], leaves[state])
    yield open_leaves


# The apps that own workers and leaves register how to read them (heartbeats as (hostname,
# last_seen) rows; leaves as counts by state), so this module imports no app.
HeartbeatReader = Callable[[], list[tuple[str, Any]]]
LeafCountReader = Callable[[], dict[str, int]]
_readers: dict[str, Callable[[], Any]] = {}


def register_database_readers(heartbeats: HeartbeatReader, leaves: LeafCountReader) -> None:
    """Set the functions that read worker heartbeats and open-leaf counts at scrape time."""
    _readers["heartbeats"] = heartbeats
    _readers["leaves"] = leaves


def _read_database() -> tuple[list[tuple[str, Any]], dict[str, int]]:
    if not _readers:
        raise LookupError("no database readers are registered")
    return _readers["heartbeats"](), _readers["leaves"]()
