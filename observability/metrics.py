"""The Prometheus metrics CaseHub's processes count, and counting them from committed audit events.

Every metric here lives in prometheus-client's default registry. With `PROMETHEUS_MULTIPROC_DIR`
set before the first import of prometheus_client (`runcasehub` sets it for its children), each
process writes its values to files there and a scrape adds them up (see `views.py`).

Planning, gate, leaf and LLM counters are not counted where things happen but from the audit
events, after their transaction commits: every state change writes one through
`audit.chain.append_events`, so the counters are the committed truth and nothing rolled back
is counted. Labels are codes and kinds from CaseHub's own code, never user text or ids, so their
number stays bounded.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from prometheus_client import Counter, Histogram

logger = logging.getLogger(__name__)

# Seconds: requests and LLM calls take milliseconds to a minute; planning, leaves and gates from
# a second to days (a person decides a gate).
FAST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
RUN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
HUMAN_BUCKETS = (60, 300, 900, 1800, 3600, 4 * 3600, 8 * 3600, 86400, 3 * 86400, 7 * 86400)

HTTP_REQUESTS = Counter(
    "casehub_http_requests",
    "HTTP requests answered, by route name, method and status code.",
    ["route", "method", "status"],
)
HTTP_DURATION = Histogram(
    "casehub_http_request_duration_seconds",
    "Time to answer an HTTP request, by route name and method.",
    ["route", "method"],
    buckets=FAST_BUCKETS,
)
AUDIT_EVENTS = Counter(
    "casehub_audit_events", "Audit events committed, by action code.", ["action"]
)
PLANNING_EVENTS = Counter(
    "casehub_planning_events",
    "Committed planning events (planning.plan.*): started, materialised, failed, requeued, …",
    ["event"],
)
PLANNING_DURATION = Histogram(
    "casehub_planning_duration_seconds",
    "Time of one planning run on a worker, by outcome (materialised, failed, skipped, error).",
    ["outcome"],
    buckets=RUN_BUCKETS,
)
GATE_EVENTS = Counter(
    "casehub_gate_events",
    "Committed gate events (oversight.gate.*): opened, decided, reminded, escalated, …, by kind.",
    ["event", "kind"],
)
GATE_DECISIONS = Counter(
    "casehub_gate_decisions",
    "Committed gate decisions, by gate kind and decision (approve, reject).",
    ["kind", "decision"],
)
GATE_DECISION_TIME = Histogram(
    "casehub_gate_time_to_decision_seconds",
    "Time from a gate's opening to its final decision (approved or rejected), by kind and status.",
    ["kind", "status"],
    buckets=HUMAN_BUCKETS,
)
LEAF_EVENTS = Counter(
    "casehub_leaf_events",
    "Committed leaf events (execution.leaf.*): claimed, succeeded, attempt_failed, failed, …",
    ["event"],
)
LEAF_DURATION = Histogram(
    "casehub_leaf_duration_seconds",
    "Time of one leaf attempt on a worker, run to its end, by agent kind and outcome.",
    ["kind", "outcome"],
    buckets=RUN_BUCKETS,
)
LLM_CALLS = Counter(
    "casehub_llm_calls",
    "Committed LLM calls (planning.llm.called), by model, purpose and outcome (ok, error).",
    ["model", "purpose", "outcome"],
)
LLM_TOKENS = Counter(
    "casehub_llm_tokens",
    "Tokens of committed LLM calls, by model and type (input, output).",
    ["model", "type"],
)
LLM_DURATION = Histogram(
    "casehub_llm_call_duration_seconds",
    "Latency of committed LLM calls, by model and purpose.",
    ["model", "purpose"],
    buckets=FAST_BUCKETS,
)
SCRAPES_REFUSED = Counter(
    "casehub_metrics_scrapes_refused",
    "Requests for /metrics refused, by reason (address, token).",
    ["reason"],
)

FINAL_GATE_STATUSES = frozenset({"approved", "rejected"})

# The children of the metrics every leaf feeds, by label: `labels()` takes a lock and checks its
# arguments on every call (the label values are codes, a bounded set).
_audit_events = functools.cache(AUDIT_EVENTS.labels)
_leaf_events = functools.cache(LEAF_EVENTS.labels)
leaf_duration = functools.cache(LEAF_DURATION.labels)


@dataclass(frozen=True, slots=True)
class EventCount:
    """The on-commit callback that counts the events of one append (tests tell it apart)."""

    events: Sequence[tuple[str, Mapping[str, Any]]]

    def __call__(self) -> None:
        count_events(self.events)


def count_on_commit(events: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
    """Count the (action, data) of events just appended once their transaction commits.

    Nothing is counted for a transaction (or savepoint) that rolls back. A failure to count is
    logged, never raised into the action that committed.
    """
    if events:
        transaction.on_commit(EventCount(events), robust=True)


def count_events(events: Iterable[tuple[str, Mapping[str, Any]]]) -> None:
    """Count committed audit events into the counters their action codes feed."""
    decided: list[int] = []
    for action, data in events:
        _audit_events(action).inc()
        family, _, event = action.rpartition(".")
        if family == "planning.plan":
            PLANNING_EVENTS.labels(event).inc()
        elif family == "oversight.gate":
            kind = str(data.get("kind") or "")
            GATE_EVENTS.labels(event, kind).inc()
            if event == "decided":
                GATE_DECISIONS.labels(kind, str(data.get("decision") or "")).inc()
                after = data.get("after")
                if isinstance(after, Mapping) and after.get("status") in FINAL_GATE_STATUSES:
                    decided.append(int(data["gate"]))
        elif family == "execution.leaf":
            _leaf_events(event).inc()
            # A completion that claims the worker's next leaf (and the one after it) audits
            # those claims in its own event.
            if event == "succeeded":
                for key in ("claimed", "claimed_ahead"):
                    if data.get(key):
                        _leaf_events("claimed").inc()
        elif action == "planning.llm.called":
            _count_llm_call(data)
    if decided:
        _observe_decision_times(decided)


def _count_llm_call(data: Mapping[str, Any]) -> None:
    model = str(data.get("model") or "")
    purpose = str(data.get("purpose") or "")
    LLM_CALLS.labels(model, purpose, "error" if data.get("error") else "ok").inc()
    LLM_TOKENS.labels(model, "input").inc(int(data.get("prompt_tokens") or 0))
    LLM_TOKENS.labels(model, "output").inc(int(data.get("completion_tokens") or 0))
    LLM_DURATION.labels(model, purpose).observe(int(data.get("latency_ms") or 0) / 1000)


# The decided event does not carry the opening time; the app that owns gates registers how to
# read (kind, status, opened_at, decided_at) of decided gates, in one query for all of them.
GateTimes = Iterable[tuple[str, str, Any, Any]]
_gate_times_reader: Callable[[list[int]], GateTimes] | None = None


def register_gate_times_reader(reader: Callable[[list[int]], GateTimes]) -> None:
    """Set the function that reads decided gates' kind, status and times (the review app's)."""
    global _gate_times_reader
    _gate_times_reader = reader


def _observe_decision_times(gate_ids: list[int]) -> None:
    if _gate_times_reader is None:
        return
    for kind, status, opened_at, decided_at in _gate_times_reader(gate_ids):
        if decided_at is None:
            continue
        seconds = max(0.0, (decided_at - opened_at).total_seconds())
        GATE_DECISION_TIME.labels(kind, status).observe(seconds)
