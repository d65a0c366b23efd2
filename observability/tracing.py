"""OpenTelemetry tracing: off unless the standard OTEL_* variables ask for it.

Tracing is on in a process when the SDK is installed (the `otel` extra), `OTEL_SDK_DISABLED` is
not `true`, and either `OTEL_TRACES_EXPORTER` names an exporter other than `none` or an OTLP
endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). Unlike
the SDK's own default (`otlp` to localhost), nothing is exported when none of them is set.
Exporters: `otlp` (OTLP over HTTP/protobuf, configured by the SDK's `OTEL_EXPORTER_OTLP_*`) and
`console`. The sampler (`OTEL_TRACES_SAMPLER`), the batch processor (`OTEL_BSP_*`) and the
resource (`OTEL_SERVICE_NAME`, default `casehub`; `OTEL_RESOURCE_ATTRIBUTES`) read theirs.

While tracing is off no provider is installed: `tracer()` is None and the request middleware,
the planning and leaf runs create no span at all. When it is on, a Celery task message carries the
trace context of whoever sent it (`casehub/celery.py`), so a planning run or a leaf continues the
trace of the request or the leaf that enqueued it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from web.env import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

try:
    from opentelemetry import trace
except ImportError:  # the `otel` extra is not installed: tracing stays off
    trace = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

TRACER_NAME = "casehub"
EXPORTERS = ("otlp", "console", "none")
SUPPORTED_PROTOCOLS = ("http/protobuf",)


def _true(value: str | None) -> bool:
    # OTel's boolean variables: only "true", in any case, is true.
    return (value or "").strip().lower() == "true"


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    raw = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if raw:
        return [name.strip().lower() for name in raw.split(",") if name.strip()]
    endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    return ["otlp"] if (endpoint or "").strip() else []


def tracing_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Tell whether the OTEL_* variables ask for spans to be exported."""
    if _true(environ.get("OTEL_SDK_DISABLED")):
        return False
    return any(name != "none" for name in _exporter_names(environ))


def configure_tracing() -> TracerProvider | None:
    """Install a tracer provider exporting as the OTEL_* variables say; return it, or None if off.

    Reads the process's environment (the SDK's exporter, sampler and resource read it too).

    Raises ConfigError for an exporter or an OTLP protocol CaseHub does not ship, and when
    tracing is asked for but the OpenTelemetry SDK is not installed (`pip install casehub[otel]`).
    """
    environ = os.environ
    if not tracing_requested(environ):
        return None
    names = [name for name in _exporter_names(environ) if name != "none"]
    unknown = sorted(set(names) - set(EXPORTERS))
    if unknown:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER: {', '.join(unknown)} is not one of {', '.join(EXPORTERS)}"
        )
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if "otlp" in names and protocol not in SUPPORTED_PROTOCOLS:
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf is supported, not {protocol!r}"
        )
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        raise ConfigError(
            "tracing is configured (OTEL_*) but the OpenTelemetry SDK is not installed: "
            "pip install 'casehub[otel]'"
        ) from None
    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    # Attributes given here win over the variables': the default name only when none is set.
    resource = Resource.create({} if named else {SERVICE_NAME: "casehub"})
    provider = TracerProvider(resource=resource)
    for name in dict.fromkeys(names):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        else:
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    logger.info("tracing on: exporting spans to %s", ", ".join(dict.fromkeys(names)))
    return provider


def tracer() -> Tracer | None:
    """Return CaseHub's tracer when a tracer provider is installed, else None (tracing off)."""
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    return trace.get_tracer(TRACER_NAME)


@contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Span | None]:
    """Run the block in a span of its own (None, and no span, while tracing is off).

    An exception leaving the block is recorded on the span, which is marked as an error.
    """
    current = tracer()
    if current is None:
        yield None
        return
    with current.start_as_current_span(name, attributes=dict(attributes or {})) as opened:
        yield opened


def start_span(name: str, attributes: Mapping[str, Any] | None = None) -> Span | None:
    """Start a span that the caller ends itself (`Span.end`, from any thread); None while off.

    It is not made current: `current_span` makes it so for a block.
    """
    current = tracer()
    if current is None:
        return None
    return current.start_span(name, attributes=dict(attributes or {}))


@contextmanager
def current_span(span: Span | None) -> Iterator[None]:
    """Make `span` the current one for the block (children started in it are its own); the
    block's end does not end it. An exception leaving the block is recorded on it."""
    if span is None:
        yield
        return
    from opentelemetry import trace

    with trace.use_span(
        span, end_on_exit=False, record_exception=True, set_status_on_exception=True
    ):
        yield


def inject_context(carrier: dict[str, Any]) -> None:
    """Add the current trace context (W3C `traceparent`) to a message's headers; nothing if off."""
    if tracer() is not None:
        from opentelemetry import propagate

        propagate.inject(carrier)


def attach_context(carrier: Mapping[str, Any]) -> object | None:
    """Make the trace context a message carried the current one; return the token to detach.

    None, and nothing attached, while tracing is off.
    """
    if tracer() is None:
        return None
    from opentelemetry import context, propagate

    return context.attach(propagate.extract(carrier))


def detach_context(token: object | None) -> None:
    """Undo `attach_context` (nothing for None)."""
    if token is not None:
        from opentelemetry import context

        context.detach(token)  # type: ignore[arg-type]
