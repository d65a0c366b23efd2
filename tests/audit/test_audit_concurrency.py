"""Concurrent appends from several processes, and appends of transactions that fail (A6, A7)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
from django.db import connection, transaction

from audit.chain import append_event, case_chain, verify_chain
from audit.models import AuditChainHead, AuditEvent
from planning.models import Case
from tests import personas
from tests.conftest import ROOT, _database_url

pytestmark = pytest.mark.django_db(transaction=True)

PROCESSES = 4
ACTIONS_PER_PROCESS = 500
# One audited action a turn: its own transaction, one event on the shared chain.
WRITER = textwrap.dedent(
    """
    import sys

    import django

    django.setup()
    from django.db import connection, transaction

    from audit.chain import append_event

    process, chain, actions = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    connection.ensure_connection()
    print("ready", flush=True)
    sys.stdin.readline()  # every writer starts at once
    for i in range(actions):
        with transaction.atomic():
            append_event("tests.concurrent.action", chain=chain, data={"process": process, "i": i})
    print("done", flush=True)
    """
)


def _writers(chain: str) -> list[subprocess.Popen[str]]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "casehub.settings",
        "DATABASE_URL": _database_url(connection.settings_dict),
    }
    return [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(n), chain, str(ACTIONS_PER_PROCESS)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(PROCESSES)
    ]


@pytest.mark.slow
@pytest.mark.scenario("A6")
def test_concurrent_audited_actions_of_four_processes_form_one_gapless_chain() -> None:
    chain = case_chain(6006)
    writers = _writers(chain)
    try:
        for writer in writers:
            assert writer.stdout is not None
            ready = writer.stdout.readline().strip()
            assert ready == "ready", writer.communicate(timeout=30)
        started = time.monotonic()
        for writer in writers:
            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.flush()
        results = [writer.communicate(timeout=120) for writer in writers]
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait()
    elapsed = time.monotonic() - started
    failed = [(w.returncode, err[-3000:]) for w, (_out, err) in zip(writers, results, strict=True)]
    assert all(code == 0 for code, _err in failed), failed

    actions = PROCESSES * ACTIONS_PER_PROCESS
    events = list(AuditEvent.objects.filter(chain=chain).order_by("seq").values("seq", "data"))
    assert [e["seq"] for e in events] == list(range(1, actions + 1))
    done = sorted((e["data"]["process"], e["data"]["i"]) for e in events)
    assert done == [(p, i) for p in range(PROCESSES) for i in range(ACTIONS_PER_PROCESS)]
    assert verify_chain(chain) == []
    assert AuditChainHead.objects.get(chain=chain).seq == actions
    # The processes really overlapped: some appended between another's events.
    by_process = [[e["seq"] for e in events if e["data"]["process"] == p] for p in range(PROCESSES)]
    spans = [(seqs[0], seqs[-1]) for seqs in by_process]
    assert any(last - first + 1 > ACTIONS_PER_PROCESS for first, last in spans), (spans, elapsed)


class BusinessFailure(RuntimeError):
    """The business step that fails after the audit event was appended."""


@pytest.mark.scenario("A7")
def test_a_transaction_failing_after_its_append_leaves_no_orphan_and_no_gap() -> None:
    chain = case_chain(7007)
    for n in range(3):
        append_event("tests.step", chain=chain, data={"n": n})
    with pytest.raises(BusinessFailure), transaction.atomic():
        appended = append_event("tests.step", chain=chain, data={"n": "lost"})
        assert appended.seq == 4
        raise BusinessFailure("the business step after the append failed")
    assert not AuditEvent.objects.filter(chain=chain, seq=4).exists()
    assert AuditChainHead.objects.get(chain=chain).seq == 3

    after = append_event("tests.step", chain=chain, data={"n": 3})
    assert after.seq == 4
    assert list(AuditEvent.objects.filter(chain=chain).values_list("data", flat=True)) == [
        {"n": n} for n in range(4)
    ]
    assert verify_chain(chain) == []


@pytest.mark.scenario("A7")
def test_a_case_submission_failing_after_its_audit_event_leaves_neither_case_nor_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from planning import dispatch
    from planning.actions import submit_case

    analyst = personas.analyst()
    events_before = AuditEvent.objects.count()
    appended: list[Any] = []
    original_append = append_event

    def recording_append(*args: Any, **kwargs: Any) -> Any:
        appended.append(original_append(*args, **kwargs))
        return appended[-1]

    def broken_enqueue(case_id: int) -> None:
        raise BusinessFailure("the broker refused the planning task")

    monkeypatch.setattr("planning.actions.append_event", recording_append)
    monkeypatch.setattr(dispatch, "enqueue_planning", broken_enqueue)
    with pytest.raises(BusinessFailure):
        submit_case(
            submitter=analyst,
            title="Verify INV-1042",
            goal="Verify invoice INV-1042",
            domain="invoice",
            strategy="static",
            inputs={"invoice_id": "INV-1042"},
        )
    assert [event.action for event in appended] == ["planning.case.submitted"]
    chain = appended[0].chain
    assert not Case.objects.exists()
    assert not AuditEvent.objects.filter(chain=chain).exists()
    assert not AuditChainHead.objects.filter(chain=chain).exists()
    assert AuditEvent.objects.count() == events_before
