"""Two Celery beat schedulers at once (RELIABILITY F4): each sweep and checkpoint happens once.

A misconfigured deployment starts beat twice (docs/operations.md asks for exactly one). Both send
every periodic task on the same schedule, so two workers' threads run the same sweep at the same
moment. Real processes: one worker with four threads and two `celery beat` processes, each with
its own schedule file, every interval at one second, on the test database and broker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from audit.chain import append_event, case_chain, verify_chain
from audit.models import AuditChainHead, AuditEvent
from oversight.models import Gate, GateStatus
from tests import personas
from tests.cases import planned_invoice_case
from tests.conftest import ROOT, running_worker

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

RUN_S = 8.0
MAX_RUN_S = 40.0
CHAINS = 300


@pytest.fixture
def schedulers(tmp_path: Path, settings: Any) -> Iterator[dict[str, Any]]:
    """A worker and two beat processes sharing the anchor and signing key directories."""
    if connection.vendor != "postgresql":
        pytest.skip("two schedulers at once need a server database (CI runs PostgreSQL)")
    env = {
        "OPENAI_BASE_URL": "",
        "OPENAI_API_KEY": "",
        "CASEHUB_AUDIT_ANCHOR_DIR": str(tmp_path / "audit-anchors"),
        "CASEHUB_SIGNING_KEY_DIR": str(tmp_path / "signing-keys"),
        "CASEHUB_AUDIT_CHECKPOINT_INTERVAL_S": "1",
        "CASEHUB_GATE_SWEEP_INTERVAL_S": "1",
        "CASEHUB_RECONCILE_INTERVAL_S": "1",
        "CASEHUB_EXECUTION_RECONCILE_INTERVAL_S": "1",
    }
    settings.CASEHUB_AUDIT_ANCHOR_DIR = tmp_path / "audit-anchors"
    settings.CASEHUB_SIGNING_KEY_DIR = tmp_path / "signing-keys"
    worker = running_worker(env)
    beats: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def start() -> None:
        """Start the two beat processes at once (after the test has made its data)."""
        for number in (1, 2):
            log = tmp_path / f"beat-{number}.log"
            logs.append(log)
            command = [sys.executable, "-m", "celery", "-A", "casehub", "beat", "--loglevel"]
            command += ["INFO", "--schedule", str(tmp_path / f"beat-{number}")]
            output = log.open("wb")
            beats.append(
                subprocess.Popen(
                    command,
                    cwd=ROOT,
                    env=worker.env,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    try:
        yield {
            "start": start,
            "beats": beats,
            "logs": logs,
            "anchors": tmp_path / "audit-anchors",
        }
    finally:
        for beat in beats:
            if beat.poll() is None:
                os.killpg(beat.pid, signal.SIGTERM)
                beat.wait(timeout=20)
        worker.stop()


def _sent(log: Path) -> int:
    return log.read_text(errors="replace").count("Sending due task audit-checkpoints")


@pytest.mark.scenario("F4")
def test_two_beat_schedulers_sweep_and_checkpoint_once(schedulers: dict[str, Any]) -> None:
    case = planned_invoice_case(personas.analyst())
    # The running worker may plan the case itself (its planning task was sent on submission)
    # while the test plans it inline: one of them plans it, the other finds it taken.
    deadline = time.monotonic() + 30
    while (
        len(gates := list(Gate.objects.filter(case=case, status=GateStatus.PENDING))) < 2
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert len(gates) == 2  # the plan gate and the hold's step gate
    # Both gates are half-way to their deadline: one reminder each is due.
    Gate.objects.filter(case=case).update(remind_at=timezone.now() - timedelta(minutes=1))
    # Many chains never checkpointed: a checkpoint round has a few hundred milliseconds of work,
    # so the two schedulers' rounds, sent a moment apart, overlap.
    for number in range(CHAINS):
        append_event("test.step", actor="erp-lookup", chain=case_chain(10_000 + number))
    schedulers["start"]()

    # At least RUN_S, and on a slow machine until each scheduler sent three rounds (a beat takes
    # seconds to start there), up to a bound: the sends, not the clock, are what is tested.
    started = time.monotonic()
    while time.monotonic() - started < RUN_S or (
        time.monotonic() - started < MAX_RUN_S
        and not all(_sent(log) >= 3 for log in schedulers["logs"])
    ):
        time.sleep(0.5)
        for beat, log in zip(schedulers["beats"], schedulers["logs"], strict=True):
            assert beat.poll() is None, log.read_text(errors="replace")[-3000:]
    # each scheduler sent the checkpoint task several times, so rounds overlapped
    assert all(_sent(log) >= 3 for log in schedulers["logs"]), [
        _sent(log) for log in schedulers["logs"]
    ]

    reminded = AuditEvent.objects.filter(action="oversight.gate.reminded")
    assert sorted(event.data["gate"] for event in reminded) == sorted(gate.pk for gate in gates)
    # One checkpoint per head a chain had: never the same head twice.
    anchors: Path = schedulers["anchors"]
    assert len(list(anchors.glob("case-*.jsonl"))) >= CHAINS  # every chain was checkpointed
    for head in AuditChainHead.objects.all():
        path = anchors / f"{head.chain.replace(':', '-')}.jsonl"
        if not path.exists():  # a chain that began after the last round
            continue
        seen = [json.loads(line)["seq"] for line in path.read_text().splitlines() if line]
        assert seen == sorted(set(seen)), (head.chain, seen)
        assert seen[-1] <= head.seq
    assert not AuditEvent.objects.filter(action="oversight.audit.broken").exists()
    for chain in AuditChainHead.objects.values_list("chain", flat=True):
        assert verify_chain(chain) == [], chain
