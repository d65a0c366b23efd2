"""Signed checkpoints: a rewrite or a tail rollback after one is caught, with its seq."""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

import casehub_verify
from audit import checkpoints as anchors
from audit import signing
from audit.chain import SYSTEM_CHAIN, append_event, case_chain, event_hash, verify_chain
from audit.export import export_case_bundle
from audit.models import AuditChainHead, AuditEvent
from tests import personas
from tests.audit.test_export import tamper

pytestmark = pytest.mark.django_db
EVENTS = AuditEvent._meta.db_table
HEADS = AuditChainHead._meta.db_table


@pytest.fixture(autouse=True)
def anchor_dir(settings: Any, tmp_path: Path) -> Path:
    settings.CASEHUB_SIGNING_KEY_DIR = tmp_path / "signing-keys"
    settings.CASEHUB_AUDIT_ANCHOR_DIR = tmp_path / "audit-anchors"
    return settings.CASEHUB_AUDIT_ANCHOR_DIR


def _steps(case_id: int, n: int) -> None:
    for i in range(n):
        append_event("case.step", actor="erp-lookup", chain=case_chain(case_id), data={"i": i})


def _rewrite_from(chain: str, seq: int, data: dict[str, Any]) -> None:
    """Play a superuser who edits one event and recomputes every later hash and the head."""
    events = list(AuditEvent.objects.filter(chain=chain).order_by("seq"))
    prev = events[seq - 2].hash if seq > 1 else casehub_verify.GENESIS_HASH
    for event in events[seq - 1 :]:
        new_data = data if event.seq == seq else event.data
        digest = event_hash(
            chain=chain, seq=event.seq, time=event.time, actor_kind=event.actor_kind,
            actor=event.actor_label, action=event.action, data=new_data, prev_hash=prev,
        )  # fmt: skip
        tamper(
            f"UPDATE {EVENTS} SET data = %s, prev_hash = %s, hash = %s"  # noqa: S608
            " WHERE chain = %s AND seq = %s",
            [json.dumps(new_data), prev, digest, chain, event.seq],
        )
        prev = digest
    tamper(f"UPDATE {HEADS} SET head_hash = %s WHERE chain = %s", [prev, chain])  # noqa: S608


def _roll_back_to(chain: str, seq: int) -> None:
    """Play a superuser who deletes the tail of a chain and moves its head back."""
    kept = AuditEvent.objects.get(chain=chain, seq=seq)
    tamper(f"DELETE FROM {EVENTS} WHERE chain = %s AND seq > %s", [chain, seq])  # noqa: S608
    tamper(
        f"UPDATE {HEADS} SET seq = %s, head_hash = %s WHERE chain = %s",  # noqa: S608
        [seq, kept.hash, chain],
    )


def test_every_chain_gets_a_signed_checkpoint_of_its_head(anchor_dir: Path) -> None:
    _steps(1, 3)
    _steps(2, 2)
    run = anchors.write_checkpoints()
    written = {c.chain: c for c in run.written}
    assert set(written) >= {"case:1", "case:2"} and run.broken == {}
    head = AuditChainHead.objects.get(chain="case:1")
    checkpoint = anchors.latest_checkpoint("case:1")
    assert checkpoint == written["case:1"]
    assert (checkpoint.seq, checkpoint.head_hash) == (3, head.head_hash)
    key = signing.current_key()
    assert checkpoint.key_id == key.key_id
    assert casehub_verify.ed25519_verify(
        key.public_key, checkpoint.signed_bytes(), bytes.fromhex(checkpoint.signature)
    )
    assert stat.S_IMODE((anchor_dir / "case-1.jsonl").stat().st_mode) == 0o600
    # Nothing moved: nothing new to write.
    assert [c.chain for c in anchors.write_checkpoints().written] == []
    _steps(1, 1)
    assert [c.chain for c in anchors.write_checkpoints().written] == ["case:1"]
    assert len((anchor_dir / "case-1.jsonl").read_text().splitlines()) == 2


@pytest.mark.scenario("A4")
def test_a_whole_chain_rewrite_after_a_checkpoint_is_reported_at_the_checkpoint_seq() -> None:
    _steps(3, 5)
    anchors.write_checkpoints()
    _rewrite_from(case_chain(3), 2, {"i": "rewritten"})
    assert verify_chain(case_chain(3)) == []  # consistent by the chain rules alone
    problems = anchors.verify_anchored_chain(case_chain(3)).problems
    assert [(p.seq, p.problem.split(":")[0]) for p in problems] == [(5, "rewritten")]


@pytest.mark.scenario("A5")
def test_a_tail_rollback_after_a_checkpoint_is_reported() -> None:
    _steps(4, 5)
    anchors.write_checkpoints()
    _roll_back_to(case_chain(4), 3)
    assert verify_chain(case_chain(4)) == []
    problems = anchors.verify_anchored_chain(case_chain(4)).problems
    assert [(p.seq, p.problem.split(":")[0]) for p in problems] == [(5, "rollback")]
    assert "ends at seq 3" in problems[0].problem


@pytest.mark.scenario("A5", "F6")
def test_a_chain_gone_from_the_database_is_a_rollback_its_checkpoint_reports() -> None:
    _steps(7, 3)
    _steps(8, 2)
    anchors.write_checkpoints()
    _roll_back_to(case_chain(7), 1)
    tamper(f"DELETE FROM {EVENTS} WHERE chain = %s", [case_chain(7)])  # noqa: S608
    tamper(f"DELETE FROM {HEADS} WHERE chain = %s", [case_chain(7)])  # noqa: S608
    run = anchors.write_checkpoints()
    assert list(run.broken) == [case_chain(7)]
    assert [p.problem for p in run.broken[case_chain(7)]] == [
        f"rollback: the chain ends at seq 0, but the checkpoint of "
        f"{anchors.latest_checkpoint(case_chain(7)).time} saw seq 3"  # type: ignore[union-attr]
    ]
    alert = AuditEvent.objects.get(chain=SYSTEM_CHAIN, action="oversight.audit.broken")
    assert (alert.data["chain"], alert.data["first_seq"]) == (case_chain(7), 3)
    assert anchors.checkpointed_chains() >= {case_chain(7), case_chain(8), SYSTEM_CHAIN}


@pytest.mark.scenario("F4")
@pytest.mark.django_db(transaction=True)
def test_a_second_checkpoint_round_waits_for_the_first_and_writes_nothing_twice(
    anchor_dir: Path,
) -> None:
    import fcntl
    import os
    import threading

    _steps(9, 2)
    rounds: list[anchors.CheckpointRun] = []
    anchor_dir.mkdir(parents=True, exist_ok=True)
    held = os.open(anchor_dir / ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # a first round in progress, as another beat's would be

    def another_round() -> None:
        try:
            rounds.append(anchors.write_checkpoints())
        finally:
            connection.close()

    second = threading.Thread(target=another_round)
    second.start()
    second.join(timeout=1)
    assert second.is_alive() and rounds == []  # it waits for the first round
    os.close(held)
    second.join(timeout=10)
    assert case_chain(9) in {c.chain for c in rounds[0].written}
    assert [c.chain for c in anchors.write_checkpoints().written] == []


@pytest.mark.scenario("A4")
def test_a_broken_chain_gets_an_alert_event_and_no_new_checkpoint() -> None:
    _steps(5, 4)
    anchors.write_checkpoints()
    before = anchors.latest_checkpoint(case_chain(5))
    tamper(
        f"UPDATE {EVENTS} SET data = %s WHERE chain = %s AND seq = 2",  # noqa: S608
        ['{"i": 42}', case_chain(5)],
    )
    _steps(5, 1)
    run = anchors.write_checkpoints()
    assert [p.seq for p in run.broken[case_chain(5)]] == [2]
    assert anchors.latest_checkpoint(case_chain(5)) == before
    alert = AuditEvent.objects.get(chain=SYSTEM_CHAIN, action="oversight.audit.broken")
    assert (alert.data["chain"], alert.data["first_seq"]) == (case_chain(5), 2)
    assert alert.data["problems"][0]["problem"].startswith("changed")
    with pytest.raises(CommandError, match=r"BROKEN: case:5, seq 2: changed"):
        call_command("audit_checkpoint", stdout=io.StringIO())


def test_a_forged_checkpoint_line_is_reported(anchor_dir: Path) -> None:
    _steps(6, 2)
    anchors.write_checkpoints()
    path = anchor_dir / "case-6.jsonl"
    forged = json.loads(path.read_text())
    forged["seq"] = 1
    forged["head_hash"] = AuditEvent.objects.get(chain=case_chain(6), seq=1).hash
    path.write_text(path.read_text() + json.dumps(forged) + "\n")
    problems = anchors.verify_anchored_chain(case_chain(6)).problems
    assert [p.problem.split(":")[0] for p in problems] == ["checkpoint"]


def test_the_command_writes_checkpoints_of_intact_chains() -> None:
    _steps(7, 2)
    out = io.StringIO()
    call_command("audit_checkpoint", stdout=out)
    assert "checkpoint case:7 seq 2" in out.getvalue()
    assert "every chain is intact" in out.getvalue()


@pytest.mark.scenario("A5")
def test_an_export_carries_the_checkpoint_and_a_rewritten_chain_fails_against_it() -> None:
    _steps(8, 4)
    anchors.write_checkpoints()
    auditor = personas.auditor()
    bundle = export_case_bundle(case_id=8, exporter=auditor)
    with bundle.file:
        report = casehub_verify.verify_bundle(bundle.file)
    assert report.ok, report.problems
    assert report.manifest["checkpoint"]["seq"] == 4

    _rewrite_from(case_chain(8), 3, {"i": "rewritten"})
    bundle = export_case_bundle(case_id=8, exporter=auditor)
    with bundle.file:
        report = casehub_verify.verify_bundle(bundle.file)
    assert [(p.file, p.seq, p.problem.split(":")[0]) for p in report.problems] == [
        ("events.jsonl", 4, "rewritten")
    ]


def test_the_verify_endpoint_reports_a_rollback() -> None:
    from django.test import Client

    from accounts import tokens as api_tokens
    from planning.models import Case, Strategy

    analyst = personas.analyst()
    case = Case.objects.create(
        title="A case", goal="Find out", strategy=Strategy.STATIC, domain="", submitter=analyst
    )
    _steps(case.pk, 4)
    anchors.write_checkpoints()
    _roll_back_to(case_chain(case.pk), 2)
    token = api_tokens.issue_api_token(personas.auditor())
    body = (
        Client(headers={"Authorization": f"Bearer {token}"})
        .get(f"/api/audit/verify?case={case.pk}")
        .json()
    )
    assert (body["ok"], body["events"]) == (False, 2)
    assert [(p["seq"], p["problem"].split(":")[0]) for p in body["problems"]] == [(4, "rollback")]
