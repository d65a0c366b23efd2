"""A trail of a million events (P3): appended, verified in place, exported and checked offline.

One case's chain gets 1,000,000 events: all but the last thousand written in bulk (PostgreSQL's
`COPY`, each hashed by the one rule, `event_hash`, as `tests/audit/test_export.py` seeds its long
chains: appending them one by one would take most of the test's time) and the chain's head set,
then the last thousand through `append_events`, the app's own append, on top of them. Then:

- `verify_chain` checks it in place, in parts at once, and finds nothing;
- the export runs in a fresh process (`tests/audit/export_probe.py`), the function an auditor's
  export runs, and its peak memory may grow by at most 50 MB over its RSS before it (DESIGN §9's
  figure for 100,000 events: the bundle is streamed, so ten times the events cost no more);
- `casehub_verify.py`, the auditor's offline verifier, checks the bundle (intact, authentic, a
  million events) in a process of its own, in at most 100 MB of peak memory;
- one event changed in the middle of the million (a superuser past the triggers) is the one
  break `verify_chain` then finds.

The seconds each step took are printed; what they must be is the bench's business
(`python -m bench audit`, `bench/README.md`), not this test's. PostgreSQL only (CI runs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from audit.chain import Actor, NewEvent, append_events, case_chain, event_hash, verify_chain
from audit.models import AuditChainHead, AuditEvent
from bench.bench_audit import VERIFY_WRAPPER
from casehub_verify import GENESIS_HASH
from tests import personas
from tests.audit_triggers import audit_triggers_suspended
from tests.conftest import _database_url

ROOT = Path(__file__).resolve().parents[2]
EVENTS = int(os.environ.get("CASEHUB_P3_EVENTS", "1000000"))
APPENDED = 1_000  # the last events, through the app's append
CASE_ID, WARMUP_CASE_ID = 910_001, 910_002
EXPORT_GROWTH_MB = 50
OFFLINE_PEAK_MB = 100


def _step_data(i: int) -> dict[str, Any]:
    """A leaf's success as execution records it: small, of plain JSON types."""
    return {
        "node": f"step-{i % 40}",
        "attempt": 1,
        "output": {"supplier": f"S-{i % 997:04d}", "amount": (i * 37) % 100_000, "ok": True},
        "released": [f"step-{(i + 1) % 40}"],
        "before": {"status": "running"},
        "after": {"status": "succeeded"},
    }


def _bulk(chain: str, count: int) -> None:
    """Write events 1..count of `chain` with one COPY and point its head at the last."""
    who, action, now, prev = Actor.of("erp-lookup"), "execution.leaf.succeeded", timezone.now(), ""
    digest = GENESIS_HASH
    columns = (
        "chain, seq, time, actor_kind, actor_label, actor_user_id, action, data, prev_hash, hash"
    )
    connection.ensure_connection()
    with (
        connection.connection.cursor() as cursor,
        cursor.copy(f"COPY {AuditEvent._meta.db_table} ({columns}) FROM STDIN") as copy,
    ):
        for seq in range(1, count + 1):
            data = _step_data(seq)
            prev, digest = digest, event_hash(
                chain=chain, seq=seq, time=now, actor_kind=who.kind, actor=who.label,
                action=action, data=data, prev_hash=digest,
            )  # fmt: skip
            copy.write_row(
                (chain, seq, now, who.kind, who.label, None, action, json.dumps(data), prev, digest)
            )
    AuditChainHead.objects.create(chain=chain, seq=count, head_hash=digest, prev_hash=prev)


def _append(chain: str, first: int, count: int) -> None:
    events = [
        NewEvent("execution.leaf.succeeded", "erp-lookup", _step_data(i))
        for i in range(first, first + count)
    ]
    with transaction.atomic():
        append_events(events, chain=chain)


@pytest.mark.slow
@pytest.mark.scenario("P3")
@pytest.mark.django_db(transaction=True)
def test_a_million_event_trail_verifies_and_exports_in_flat_memory(
    settings: Any, tmp_path: Path
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("a million events need PostgreSQL (CI runs it)")
    settings.CASEHUB_SIGNING_KEY_DIR = tmp_path / "signing-keys"
    auditor = personas.auditor()
    chain = case_chain(CASE_ID)

    started = time.perf_counter()
    _bulk(chain, EVENTS - APPENDED)
    _append(chain, EVENTS - APPENDED + 1, APPENDED)
    _append(case_chain(WARMUP_CASE_ID), 1, 50)
    appended_s = time.perf_counter() - started

    started = time.perf_counter()
    assert verify_chain(chain) == []
    verified_s = time.perf_counter() - started

    bundle = tmp_path / "bundle.zip"
    try:
        env = {
            **os.environ,
            "DATABASE_URL": _database_url(connection.settings_dict),
            "CASEHUB_SIGNING_KEY_DIR": str(settings.CASEHUB_SIGNING_KEY_DIR),
        }
        probe = subprocess.run(
            [
                sys.executable, "-m", "tests.audit.export_probe",
                str(CASE_ID), str(WARMUP_CASE_ID), str(bundle), auditor.get_username(),
            ],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
        assert probe.returncode == 0, probe.stderr[-3000:]
        exported = json.loads(probe.stdout.strip().splitlines()[-1])
        growth_mb = (exported["rss_peak_kib"] - exported["rss_before_kib"]) / 1024
        assert exported["events"] == EVENTS
        assert growth_mb <= EXPORT_GROWTH_MB, exported

        started = time.perf_counter()
        offline = subprocess.run(
            [
                sys.executable, "-c", VERIFY_WRAPPER, str(ROOT / "casehub_verify.py"), str(bundle),
                "--public-key", exported["public_key"],
            ],
            capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
        offline_s = time.perf_counter() - started
        assert offline.returncode == 0, offline.stdout[-3000:] + offline.stderr[-3000:]
        assert "INTACT" in offline.stdout and "AUTHENTIC" in offline.stdout, offline.stdout
        assert f"INTACT: {EVENTS} events of chain {chain} " in offline.stdout, offline.stdout
        peaks = [row.split()[1] for row in offline.stderr.splitlines() if row.startswith("VmHWM:")]
        offline_peak_mb = int(peaks[-1]) / 1024
        assert offline_peak_mb <= OFFLINE_PEAK_MB
        bundle_mb = bundle.stat().st_size / 2**20
    finally:
        bundle.unlink(missing_ok=True)  # about 1 GB: pytest keeps its temporary directories

    print(
        f"P3, {EVENTS:,} events: written in {appended_s:.1f} s, verified in place in "
        f"{verified_s:.1f} s; exported in {exported['seconds']:.1f} s "
        f"({bundle_mb:.0f} MB, peak RSS growth {growth_mb:.1f} MB); "
        f"checked offline in {offline_s:.1f} s (peak RSS {offline_peak_mb:.1f} MB)"
    )

    # The same check finds one event changed in the middle of the million, by its seq.
    middle = EVENTS // 2 + 7
    with transaction.atomic(), audit_triggers_suspended(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {AuditEvent._meta.db_table} SET data = data || '{{\"amount\": 1}}'"  # noqa: S608
            " WHERE chain = %s AND seq = %s",
            [chain, middle],
        )
    problems = verify_chain(chain)
    assert [(p.seq, p.problem.split(":")[0]) for p in problems] == [(middle, "changed")], problems
