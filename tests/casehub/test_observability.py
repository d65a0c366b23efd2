"""Operations: /metrics after real actions, who may scrape it, multiprocess sums, the scrape-time
gauges with a broker down, and OpenTelemetry tracing (off by default, GenAI spans when on)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.test import Client, override_settings
from django.utils import timezone
from kombu import Connection
from prometheus_client.parser import text_string_to_metric_families

from audit.chain import append_event
from audit.models import AuditEvent
from execution.models import WorkerHeartbeat
from observability import tracing
from observability.collector import queue_depths
from oversight.models import Gate, GateKind, GateStatus
from planning import tasks as planning_tasks
from planning.actions import submit_case
from planning.core.llm.client import LlmClient
from planning.core.llm.records import LlmSettings
from planning.core.llm.structured_output import strict_json_schema
from planning.models import NodeStatus, PlanNode
from tests import personas
from tests.cases import planned_invoice_case
from tests.execution.test_execution import approve, run_ready
from tests.execution.test_llm_runner import FINDINGS, approved_case, notes_pack  # noqa: F401 (a fixture)
from tests.execution.test_llm_runner import calls as llm_calls
from tests.fakes.openai_server import FakeOpenAIServer
from tests.planning.llm_scripts import fraud_plan_responder
from web.env import ConfigError

ROOT = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Return every sample of an exposition by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """Return one sample's value, 0 when the exposition has no such sample."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def scrape(client: Client | None = None, **extra: Any) -> Samples:
    response = (client or Client()).get("/metrics", **extra)
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"].startswith("text/plain; version=")
    return parse(response.content.decode())


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


# Counters after real actions -------------------------------------------------------------------


@pytest.mark.django_db
def test_planning_gate_and_leaf_counters_move_by_what_was_committed(
    django_capture_on_commit_callbacks: Any,
) -> None:
    analyst, officer = personas.analyst(), personas.officer()
    before = scrape()
    first_event = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    with django_capture_on_commit_callbacks(execute=True):
        case = planned_invoice_case(analyst)
        plan_gate = Gate.objects.get(case=case, kind=GateKind.PLAN, status=GateStatus.PENDING)
        approve(plan_gate, officer)
        outcomes = run_ready(case)
    after = scrape()

    events = AuditEvent.objects.filter(pk__gt=first_event)
    count = {
        a: events.filter(action=a).count() for a in set(events.values_list("action", flat=True))
    }
    assert count["planning.plan.started"] == count["planning.plan.materialised"] == 1
    assert delta(before, after, "casehub_planning_events_total", event="started") == 1
    assert delta(before, after, "casehub_planning_events_total", event="materialised") == 1
    assert delta(before, after, "casehub_planning_events_total", event="failed") == 0
    # The static invoice plan opens a plan gate and a signed step gate for the payment hold.
    assert delta(before, after, "casehub_gate_events_total", event="opened", kind="plan") == 1
    assert delta(before, after, "casehub_gate_events_total", event="opened", kind="step") == 1
    assert delta(before, after, "casehub_gate_events_total", event="decided", kind="plan") == 1
    assert (
        delta(before, after, "casehub_gate_decisions_total", kind="plan", decision="approve") == 1
    )
    decided = "casehub_gate_time_to_decision_seconds_count"
    assert delta(before, after, decided, kind="plan", status="approved") == 1
    # Every leaf that ran succeeded; each was claimed once (some claims ride on a completion).
    succeeded = [o for o in outcomes if o.endswith(" succeeded")]
    assert succeeded and len(succeeded) == len(outcomes)
    assert count["execution.leaf.succeeded"] == len(succeeded)
    assert delta(before, after, "casehub_leaf_events_total", event="succeeded") == len(succeeded)
    assert delta(before, after, "casehub_leaf_events_total", event="claimed") == len(succeeded)
    leaf_kind = PlanNode.objects.filter(version=case.current_version, kind="leaf").exclude(
        status=NodeStatus.AWAITING_APPROVAL
    )
    runs = sum(
        delta(before, after, "casehub_leaf_duration_seconds_count", kind=kind, outcome="succeeded")
        for kind in {"tool", "llm", "human", *leaf_kind.values_list("agent", flat=True)}
    )
    assert runs == len(succeeded)
    # And all of them, by action code, exactly as many as the audit trail holds.
    for action, committed in count.items():
        assert delta(before, after, "casehub_audit_events_total", action=action) == committed


@pytest.mark.django_db
def test_an_event_rolled_back_is_not_counted(django_capture_on_commit_callbacks: Any) -> None:
    before = scrape()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():
            append_event("oversight.metrics_test.rolled_back")
            raise RuntimeError("the action failed after its event")
        append_event("oversight.metrics_test.kept")
    after = scrape()
    assert len(callbacks) == 1
    action = "casehub_audit_events_total"
    assert delta(before, after, action, action="oversight.metrics_test.rolled_back") == 0
    assert delta(before, after, action, action="oversight.metrics_test.kept") == 1


@pytest.mark.django_db
def test_requests_are_counted_by_route_name_method_and_status_never_by_path() -> None:
    client = Client()
    client.force_login(personas.analyst())
    before = scrape()
    assert client.get("/").status_code == 200
    assert client.get("/cases/999999/").status_code == 404
    assert client.get("/no/such/page/").status_code == 404
    assert client.get("/static/casehub/no-such-file.css").status_code == 404
    after = scrape()
    requests = "casehub_http_requests_total"
    assert delta(before, after, requests, route="home", method="GET", status="200") == 1
    assert (
        delta(before, after, requests, route="planning:case-detail", method="GET", status="404")
        == 1
    )
    assert delta(before, after, requests, route="unmatched", method="GET", status="404") == 1
    assert delta(before, after, requests, route="static", method="GET", status="404") == 1
    # The scrape before this one is counted too, under its route name.
    assert delta(before, after, requests, route="metrics", method="GET", status="200") == 1
    assert not any("999999" in str(labels) for _, labels in after)
    assert (
        delta(
            before, after, "casehub_http_request_duration_seconds_count", route="home", method="GET"
        )
        == 1
    )


# Who may scrape --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_scrape_from_outside_the_allowed_networks_is_refused_and_not_audited() -> None:
    before = scrape()
    events = AuditEvent.objects.count()
    outside = Client(REMOTE_ADDR="203.0.113.7")
    response = outside.get("/metrics")
    assert response.status_code == 403
    assert b"casehub_" not in response.content
    # X-Forwarded-For counts only behind trusted proxies (CASEHUB_TRUSTED_PROXY_COUNT).
    assert outside.get("/metrics", HTTP_X_FORWARDED_FOR="127.0.0.1").status_code == 403
    with override_settings(CASEHUB_TRUSTED_PROXY_COUNT=1):
        # Through the local proxy, the client is the one it names: outside.
        proxied = Client(REMOTE_ADDR="127.0.0.1")
        assert proxied.get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.7").status_code == 403
    with override_settings(CASEHUB_METRICS_ALLOW=tracing_networks("203.0.113.0/24")):
        assert outside.get("/metrics").status_code == 200
        assert Client().get("/metrics").status_code == 403
    assert AuditEvent.objects.count() == events
    after = scrape()
    assert delta(before, after, "casehub_metrics_scrapes_refused_total", reason="address") == 4


def tracing_networks(*networks: str) -> list[Any]:
    import ipaddress

    return [ipaddress.ip_network(n) for n in networks]


@pytest.mark.django_db
@override_settings(CASEHUB_METRICS_TOKEN="scrape-me-3f9a")
def test_with_a_token_set_a_scrape_must_also_carry_it() -> None:
    client = Client()
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Basic scrape-me-3f9a").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me-3f9a").status_code == 200
    # The token does not let in an address outside the networks.
    outside = Client(REMOTE_ADDR="198.51.100.1")
    response = outside.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me-3f9a")
    assert response.status_code == 403
    assert client.post("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me-3f9a").status_code == 405


def test_a_malformed_allowed_network_stops_the_settings_with_a_clear_error() -> None:
    env = {**os.environ, "CASEHUB_METRICS_ALLOW": "127.0.0.1/8,not-a-network"}
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "CASEHUB_METRICS_ALLOW" in result.stderr and "not-a-network" in result.stderr


# Scrape-time gauges ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_heartbeats_and_open_leaves_are_read_at_scrape_time(analyst: Any, officer: Any) -> None:
    now = timezone.now()
    WorkerHeartbeat.objects.create(hostname="w-fresh", pid=1, started_at=now, last_seen=now)
    WorkerHeartbeat.objects.create(
        hostname="w-old", pid=2, started_at=now, last_seen=now - timedelta(minutes=5)
    )
    case = planned_invoice_case(analyst)
    approve(Gate.objects.get(case=case, kind=GateKind.PLAN), officer)
    running = PlanNode.objects.filter(version=case.current_version, status=NodeStatus.READY)
    ready = running.count()
    assert ready >= 1
    samples = scrape()
    assert value(samples, "casehub_database_up") == 1
    assert value(samples, "casehub_worker_heartbeat_age_seconds", worker="w-fresh") < 30
    assert 300 <= value(samples, "casehub_worker_heartbeat_age_seconds", worker="w-old") < 400
    assert value(samples, "casehub_workers", state="alive") == 1
    assert value(samples, "casehub_workers", state="stale") == 1
    assert value(samples, "casehub_leaves", state="ready") == ready
    # A running leaf whose lease ran out is stuck until the reconciler recovers it.
    node = running.first()
    assert node is not None
    PlanNode.objects.filter(pk=node.pk).update(
        status=NodeStatus.RUNNING, lease_until=now - timedelta(seconds=5)
    )
    samples = scrape()
    assert value(samples, "casehub_leaves", state="ready") == ready - 1
    assert value(samples, "casehub_leaves", state="running") == 1
    assert value(samples, "casehub_leaves", state="stuck") == 1


@pytest.mark.django_db
def test_a_dead_broker_leaves_broker_up_at_zero_and_the_rest_of_the_scrape(
    django_assert_max_num_queries: Any,
) -> None:
    # Nothing listens on port 1: the connection is refused at once.
    with (
        override_settings(CELERY_BROKER_URL="redis://127.0.0.1:1/0"),
        django_assert_max_num_queries(2),
    ):
        samples = scrape()
    assert value(samples, "casehub_broker_up") == 0
    assert not any(name == "casehub_queue_messages" for name, _ in samples)
    assert value(samples, "casehub_database_up") == 1
    assert ("casehub_leaves", frozenset({("state", "ready")})) in samples


@pytest.mark.django_db
def test_queue_depth_is_read_from_the_filesystem_broker(tmp_path: Path) -> None:
    folder = tmp_path / "broker"
    folder.mkdir()
    options = {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "control_folder": str(tmp_path / "control"),
    }
    # A queue of its own: kombu keeps the exchanges it declared (celery's) for the process.
    name = f"casehub-metrics-test-{os.getpid()}"
    with override_settings(
        CELERY_BROKER_URL="filesystem://",
        CELERY_BROKER_TRANSPORT_OPTIONS=options,
        CELERY_TASK_DEFAULT_QUEUE=name,
    ):
        assert queue_depths() == {name: 0}
        with Connection("filesystem://", transport_options=options) as conn:
            queue = conn.SimpleQueue(name)
            for n in range(3):
                queue.put({"n": n})
            queue.close()
        assert len(list(folder.iterdir())) == 3
        samples = scrape()
    assert value(samples, "casehub_broker_up") == 1
    assert value(samples, "casehub_queue_messages", queue=name) == 3


REDIS_URL = os.environ.get("CASEHUB_TEST_METRICS_REDIS_URL", "redis://127.0.0.1:6379/3")


def _redis_or_skip() -> None:
    try:
        with Connection(REDIS_URL, connect_timeout=1) as conn:
            conn.ensure_connection(max_retries=1, timeout=1)
    except Exception:
        pytest.skip(f"no Redis at {REDIS_URL}")


@pytest.mark.django_db
def test_queue_depth_is_read_from_redis_and_an_empty_queue_counts_zero() -> None:
    _redis_or_skip()
    name = f"casehub-metrics-test-{os.getpid()}"
    with override_settings(CELERY_BROKER_URL=REDIS_URL, CELERY_TASK_DEFAULT_QUEUE=name):
        # Redis keeps no empty list: a queue with nothing in it does not exist there.
        assert queue_depths() == {name: 0}
        with Connection(REDIS_URL) as conn:
            queue = conn.SimpleQueue(name)
            try:
                for n in range(2):
                    queue.put({"n": n})
                assert queue_depths() == {name: 2}
                assert value(scrape(), "casehub_queue_messages", queue=name) == 2
            finally:
                queue.clear()
                queue.close()


# Multiprocess mode -----------------------------------------------------------------------------

COUNTING = """
import django, sys
django.setup()
from observability.metrics import count_events
count_events([("planning.plan.started", {})] * int(sys.argv[1]))
"""
SCRAPING = """
import django
django.setup()
from observability.views import exposition
print(exposition().decode())
"""


def test_counts_of_several_processes_add_up_in_one_scrape(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for count in ("3", "4"):
        subprocess.run(
            [sys.executable, "-c", COUNTING, count], cwd=ROOT, env=env, check=True, timeout=120
        )
    assert len(list(tmp_path.glob("counter_*.db"))) == 2  # one file a process
    result = subprocess.run(
        [sys.executable, "-c", SCRAPING], cwd=ROOT, env=env, check=True, timeout=120,
        capture_output=True, text=True,
    )  # fmt: skip
    samples = parse(result.stdout)
    assert value(samples, "casehub_planning_events_total", event="started") == 7
    assert value(samples, "casehub_audit_events_total", action="planning.plan.started") == 7
    # The gauges come from the scraping process, once.
    assert result.stdout.count("# TYPE casehub_broker_up gauge") == 1


def test_gunicorn_child_exit_marks_the_worker_dead(tmp_path: Path, monkeypatch: Any) -> None:
    from observability.gunicorn import child_exit

    live = tmp_path / "gauge_livesum_4242.db"
    live.write_bytes(b"")
    kept = tmp_path / "counter_4242.db"
    kept.write_bytes(b"")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    child_exit(None, type("Worker", (), {"pid": 4242})())
    assert not live.exists()
    assert kept.exists()  # its counts stay in the sums


def test_runcasehub_points_its_services_at_a_fresh_metrics_directory(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from casehub.management.commands.runcasehub import casehub_services, prepare_metrics_dir

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with override_settings(VAR_DIR=tmp_path):
        stale = tmp_path / "metrics" / "counter_1.db"
        stale.parent.mkdir()
        stale.write_bytes(b"old")
        directory = prepare_metrics_dir()
        assert directory == tmp_path / "metrics"
        assert not stale.exists()
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(directory)
        web = casehub_services(
            host="127.0.0.1", port=8000, web_workers=2, web_threads=4, concurrency=4
        )[0]
    assert "python:observability.gunicorn" in web.argv


# Tracing ---------------------------------------------------------------------------------------


def test_tracing_is_off_unless_the_otel_variables_ask_for_it() -> None:
    assert not tracing.tracing_requested({})
    assert not tracing.tracing_requested({"OTEL_SERVICE_NAME": "casehub"})
    assert not tracing.tracing_requested({"OTEL_TRACES_EXPORTER": "none"})
    assert tracing.tracing_requested({"OTEL_TRACES_EXPORTER": "console"})
    assert tracing.tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert tracing.tracing_requested(
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x:4318/v1/traces"}
    )
    disabled = {"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert not tracing.tracing_requested(disabled)


def test_without_otel_variables_a_process_installs_no_tracer_provider() -> None:
    script = """
import django
django.setup()
import casehub.wsgi
from opentelemetry import trace
from observability import tracing
print(type(trace.get_tracer_provider()).__name__, tracing.tracer())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, check=True, timeout=120,
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.stdout.split() == ["ProxyTracerProvider", "None"]


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "zipkin"),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            },
            "grpc",
        ),
    ],
)
def test_an_exporter_casehub_does_not_ship_is_a_clear_error(
    variables: dict[str, str], named: str, monkeypatch: Any
) -> None:
    for key, setting in variables.items():
        monkeypatch.setenv(key, setting)
    with pytest.raises(ConfigError, match=named):
        tracing.configure_tracing()


def _reset_global_tracer_provider() -> None:
    # OpenTelemetry sets its global provider once a process; tests put it back (as the SDK's own
    # test utilities do) so that no other test runs with tracing on.
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@pytest.fixture
def spans() -> Iterator[Any]:
    """Install a tracer provider recording spans in memory; yield its exporter."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    assert tracing.tracer() is None, "tracing was left on by another test"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset_global_tracer_provider()


def test_an_llm_call_makes_a_client_span_with_the_genai_attributes(
    spans: Any, fake_openai: FakeOpenAIServer
) -> None:
    from opentelemetry.trace import SpanKind, StatusCode
    from pydantic import BaseModel

    class Verdict(BaseModel):
        verdict: str

    fake_openai.enqueue('{"verdict": "ok"}')
    settings = LlmSettings(
        base_url=fake_openai.base_url, api_key="test-key", model="fake-model", timeout_s=5,
        max_retries=0, max_concurrency=2, max_tokens_per_call=300,
    )  # fmt: skip
    with LlmClient(settings) as client:
        result = client.complete_json(
            [{"role": "user", "content": "judge"}],
            Verdict.model_validate,
            schema_name="verdict",
            json_schema=strict_json_schema(Verdict),
        )
    (span,) = spans.get_finished_spans()
    assert span.name == "chat fake-model"
    assert span.kind == SpanKind.CLIENT
    attributes = dict(span.attributes)
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "fake-model"
    assert attributes["gen_ai.response.model"] == "fake-model"
    assert attributes["gen_ai.request.max_tokens"] == 300
    assert attributes["gen_ai.usage.input_tokens"] == result.prompt_tokens > 0
    assert attributes["gen_ai.usage.output_tokens"] == result.completion_tokens > 0
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["server.port"] == fake_openai.port
    assert span.status.status_code == StatusCode.UNSET
    assert "judge" not in json.dumps(attributes)  # never the prompt


def test_a_failed_llm_call_span_is_an_error_with_its_type(
    spans: Any, fake_openai: FakeOpenAIServer
) -> None:
    from opentelemetry.trace import StatusCode

    from planning.core.llm.records import LlmCallFailed
    from tests.fakes.openai_server import FakeReply

    fake_openai.enqueue(FakeReply(content="no", status=400))
    settings = LlmSettings(
        base_url=fake_openai.base_url, api_key="k", model="fake-model", timeout_s=5,
        max_retries=0, max_concurrency=1,
    )  # fmt: skip
    with LlmClient(settings) as client, pytest.raises(LlmCallFailed):
        client.complete_json(
            [{"role": "user", "content": "x"}],
            dict,
            schema_name="anything",
            json_schema={"type": "object"},
        )
    (span,) = spans.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "BadRequestError"


@pytest.mark.django_db
def test_a_planning_run_is_a_span_with_its_llm_calls_inside(
    spans: Any, fake_openai: FakeOpenAIServer, django_capture_on_commit_callbacks: Any
) -> None:
    fake_openai.responder = fraud_plan_responder
    before = scrape()
    with override_settings(OPENAI_BASE_URL=fake_openai.base_url, OPENAI_API_KEY="test-key"):
        with django_capture_on_commit_callbacks(execute=False):
            case = submit_case(
                submitter=personas.analyst(), title="Fraud", goal="investigate-fraud",
                domain="", strategy="llm", inputs={}, max_depth=2,
            )  # fmt: skip
        with django_capture_on_commit_callbacks(execute=True):
            assert planning_tasks.plan_case(case.pk) == "materialised"
    after = scrape()
    finished = spans.get_finished_spans()
    (planning,) = [s for s in finished if s.name == "casehub.planning"]
    calls = [s for s in finished if s.attributes.get("gen_ai.operation.name") == "chat"]
    model = calls[0].attributes["gen_ai.request.model"]
    assert len(calls) == 2 == len(fake_openai.requests)
    assert all(c.parent is not None and c.parent.span_id == planning.context.span_id for c in calls)
    assert all(c.context.trace_id == planning.context.trace_id for c in calls)
    assert planning.attributes["casehub.case.id"] == case.pk
    assert planning.attributes["casehub.outcome"] == "materialised"
    assert (
        delta(before, after, "casehub_planning_duration_seconds_count", outcome="materialised") == 1
    )
    tokens = sum(c.attributes["gen_ai.usage.input_tokens"] for c in calls)
    assert delta(before, after, "casehub_llm_tokens_total", model=model, type="input") == tokens
    assert (
        sum(
            delta(
                before,
                after,
                "casehub_llm_calls_total",
                model=model,
                purpose=p,
                outcome="ok",
            )
            for p in {c.attributes["casehub.llm.purpose"] for c in calls}
        )
        == 2
    )


@pytest.mark.django_db
def test_requests_and_leaves_are_spans_when_tracing_is_on(
    spans: Any, analyst: Any, officer: Any
) -> None:
    from opentelemetry.trace import SpanKind

    case = planned_invoice_case(analyst)
    approve(Gate.objects.get(case=case, kind=GateKind.PLAN), officer)
    run_ready(case)
    client = Client()
    client.force_login(analyst)
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert client.get(f"/cases/{case.pk}/", HTTP_TRACEPARENT=parent).status_code == 200
    finished = spans.get_finished_spans()
    leaves = [s for s in finished if s.name == "casehub.leaf"]
    assert leaves and all(s.attributes["casehub.case.id"] == case.pk for s in leaves)
    assert {s.attributes["casehub.outcome"] for s in leaves} == {"succeeded"}
    (request,) = [s for s in finished if s.kind == SpanKind.SERVER]
    assert request.name == "GET cases/<int:case_id>/"
    assert request.attributes["http.route"] == "cases/<int:case_id>/"
    assert request.attributes["casehub.route"] == "planning:case-detail"
    assert request.attributes["http.response.status_code"] == 200
    # The caller's trace context (W3C traceparent) is continued.
    assert f"{request.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"


class _Receiver(BaseHTTPRequestHandler):
    bodies: list[tuple[str, bytes]]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self.server.bodies.append((self.path, self.rfile.read(length)))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_with_an_otlp_endpoint_spans_are_exported_over_http(monkeypatch: Any) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    server.bodies = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "casehub-test")
    assert tracing.tracer() is None
    provider = tracing.configure_tracing()
    try:
        assert provider is not None
        with tracing.span("casehub.test", {"casehub.case.id": 7}):
            pass
        assert provider.force_flush(10_000)
    finally:
        if provider is not None:
            provider.shutdown()
        _reset_global_tracer_provider()
        server.shutdown()
    ((path, body),) = server.bodies  # type: ignore[attr-defined]
    assert path == "/v1/traces"
    request = ExportTraceServiceRequest.FromString(body)
    (resource_spans,) = request.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "casehub-test"
    (span,) = resource_spans.scope_spans[0].spans
    assert span.name == "casehub.test"


def test_the_llm_client_works_without_opentelemetry_installed(
    fake_openai: FakeOpenAIServer,
) -> None:
    script = f"""
import sys
sys.modules["opentelemetry"] = None  # as if the package were not installed
from planning.core.llm import transport as module
from planning.core.llm.client import LlmClient
from planning.core.llm.records import LlmSettings
assert module._trace is None
settings = LlmSettings(base_url={fake_openai.base_url!r}, api_key="k", model="m", timeout_s=5,
                       max_retries=0, max_concurrency=1)
with LlmClient(settings) as client:
    result = client.complete_json([{{"role": "user", "content": "x"}}], dict,
                                  schema_name="any", json_schema={{"type": "object"}})
print(result.parsed)
"""
    fake_openai.enqueue('{"fine": true}')
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, check=True, timeout=120,
        capture_output=True, text=True,
    )  # fmt: skip
    assert result.stdout.strip() == "{'fine': True}"


# The real thing: runcasehub's gunicorn workers and Celery worker, one scrape ------------------


@pytest.mark.integration
def test_runcasehub_serves_metrics_summed_over_its_processes(tmp_path: Path) -> None:
    import re
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    var_dir = tmp_path / "var"
    env = {
        key: setting
        for key, setting in os.environ.items()
        if key not in {"DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "SECRET_KEY"}
        and not key.startswith(("OTEL_", "PROMETHEUS_"))
    }
    env.update(CASEHUB_DEMO="1", CASEHUB_VAR_DIR=str(var_dir), DEBUG="0")
    base = f"http://127.0.0.1:{port}"

    def get(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(base + path, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    with (tmp_path / "run.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runcasehub", f"127.0.0.1:{port}", "--web-workers", "2"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        status = 0
        while time.monotonic() < deadline and process.poll() is None and status != 200:
            try:
                status = get("/health")[0]
            except OSError:
                time.sleep(0.5)
        assert status == 200, (tmp_path / "run.log").read_text(errors="replace")[-3000:]
        for _ in range(20):
            assert get("/login/")[0] == 200
        status, body = get("/metrics")
        assert status == 200
        samples = parse(body.decode())
        login = value(
            samples, "casehub_http_requests_total", route="login", method="GET", status="200"
        )
        assert login == 20
        assert value(samples, "casehub_broker_up") == 1
        assert ("casehub_queue_messages", frozenset({("queue", "celery")})) in samples
        assert value(samples, "casehub_workers", state="alive") == 1
        # Each web worker that answered wrote its own files there (which of the two answers is
        # the kernel's choice; the sum over processes is tested deterministically above).
        pids = {re.sub(r"\D", "", f.stem) for f in (var_dir / "metrics").glob("counter_*.db")}
        assert pids and str(process.pid) not in pids
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_a_celery_worker_with_a_tracing_misconfiguration_stops_naming_it() -> None:
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "zipkin"}
    result = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "casehub", "worker", "--pool", "threads",
         "--without-mingle", "--without-gossip", "--loglevel", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    assert "tracing: OTEL_TRACES_EXPORTER: zipkin is not one of" in result.stderr


@pytest.mark.integration
def test_a_planning_run_on_a_real_worker_continues_the_trace_that_enqueued_it(
    transactional_db: None, spans: Any
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from tests.conftest import running_worker

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    receiver.bodies = []  # type: ignore[attr-defined]
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    worker = running_worker(
        {
            "OPENAI_BASE_URL": "",
            "OPENAI_API_KEY": "",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_port}",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
    )
    try:
        with tracing.span("test.submit") as parent:
            assert parent is not None
            case = submit_case(
                submitter=personas.analyst(), title="Traced", goal="Verify invoice INV-1042",
                domain="invoice", strategy="static", inputs={"invoice_id": "INV-1042"},
            )  # fmt: skip
        deadline = time.monotonic() + 60
        planning: list[Any] = []
        while not planning and time.monotonic() < deadline:
            time.sleep(0.2)
            for _, body in list(receiver.bodies):  # type: ignore[attr-defined]
                for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
                    for scope in resource.scope_spans:
                        planning += [s for s in scope.spans if s.name == "casehub.planning"]
        assert planning, worker.log()[-3000:]
    finally:
        worker.stop()
        receiver.shutdown()
    (run,) = planning
    assert run.trace_id == parent.get_span_context().trace_id.to_bytes(16, "big")
    assert run.parent_span_id == parent.get_span_context().span_id.to_bytes(8, "big")
    attributes = {a.key: a.value for a in run.attributes}
    assert attributes["casehub.case.id"].int_value == case.pk
    assert attributes["casehub.outcome"].string_value == "materialised"


@pytest.mark.django_db
def test_an_llm_agents_model_calls_are_spans_inside_its_leaf(
    spans: Any,
    notes_pack: FakeOpenAIServer,  # noqa: F811 (the llm runner tests' fixture, imported above)
    analyst: Any,
    officer: Any,
) -> None:
    notes_pack.enqueue(llm_calls(("lookup_notes", {"account_id": "ACC-300"})), FINDINGS)
    case = approved_case(analyst, officer, expected_output="Findings")
    run_ready(case)
    finished = spans.get_finished_spans()
    (leaf,) = [
        s
        for s in finished
        if s.name == "casehub.leaf" and s.attributes["casehub.leaf.key"] == "review"
    ]
    assert leaf.attributes["casehub.leaf.kind"] == "llm"
    assert leaf.attributes["casehub.outcome"] == "succeeded"
    model_calls = [s for s in finished if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert len(model_calls) == 2 == len(notes_pack.requests)
    assert all(
        c.parent is not None and c.parent.span_id == leaf.context.span_id for c in model_calls
    )
    assert [c.attributes["gen_ai.response.finish_reasons"] for c in model_calls] == [
        ("tool_calls",),
        ("stop",),
    ]
