"""Time planning runs and leaf attempts on a worker: a histogram, and a span if tracing is on."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from observability import metrics, tracing


@dataclass(slots=True)
class Run:
    """What the block reports about its run: its outcome (`error` when it raises)."""

    outcome: str = "unknown"


@contextmanager
def planning_run(case_id: int) -> Iterator[Run]:
    """Time one planning run of a case; set `outcome` on what it yields before leaving."""
    with _measured(
        "casehub.planning",
        {"casehub.case.id": case_id},
        lambda outcome, seconds: metrics.PLANNING_DURATION.labels(outcome).observe(seconds),
    ) as run:
        yield run


@contextmanager
def leaf_run(*, case_id: int, key: str, attempt: int, kind: str) -> Iterator[Run]:
    """Time one leaf attempt, run to its end; set `outcome` on what it yields before leaving."""
    attributes = {
        "casehub.case.id": case_id,
        "casehub.leaf.key": key,
        "casehub.leaf.attempt": attempt,
        "casehub.leaf.kind": kind,
    }
    with _measured(
        "casehub.leaf",
        attributes,
        lambda outcome, seconds: metrics.leaf_duration(kind, outcome).observe(seconds),
    ) as run:
        yield run


class LeafRunAhead:
    """A leaf attempt timed from its start to its end, where the end comes on another thread.

    The worker runs a leaf while the previous one's completion is recorded on a thread of its
    own (`execution.worker`): the run and its end do not nest in one block there. The same
    histogram and span as `leaf_run`: the span is current while the leaf runs (`running`), and
    `end` ends it and observes the duration with the outcome.
    """

    __slots__ = ("_kind", "_span", "_started")

    def __init__(self, *, case_id: int, key: str, attempt: int, kind: str) -> None:
        self._kind = kind
        self._started = time.perf_counter()
        self._span = tracing.start_span(
            "casehub.leaf",
            {
                "casehub.case.id": case_id,
                "casehub.leaf.key": key,
                "casehub.leaf.attempt": attempt,
                "casehub.leaf.kind": kind,
            },
        )

    @contextmanager
    def running(self) -> Iterator[None]:
        """Make the leaf's span the current one while the leaf runs."""
        with tracing.current_span(self._span):
            yield

    def end(self, outcome: str) -> None:
        """Record the attempt's end: its outcome on the span, the duration in the histogram."""
        if self._span is not None:
            self._span.set_attribute("casehub.outcome", outcome)
            self._span.end()
        metrics.leaf_duration(self._kind, outcome).observe(time.perf_counter() - self._started)


@contextmanager
def _measured(
    name: str, attributes: dict[str, Any], observe: Callable[[str, float], None]
) -> Iterator[Run]:
    run = Run()
    started = time.perf_counter()
    try:
        with tracing.span(name, attributes) as span:
            try:
                yield run
            except BaseException:
                run.outcome = "error"
                raise
            finally:
                if span is not None:
                    span.set_attribute("casehub.outcome", run.outcome)
    finally:
        observe(run.outcome, time.perf_counter() - started)
