"""Export bundles: scope, signatures and key rotation, tamper evidence, hostile data, memory."""

from __future__ import annotations

import csv
import gc
import hashlib
import io
import json
import random
import stat
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.utils import timezone
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import casehub_verify
from audit import export, signing
from audit.chain import (
    SYSTEM_CHAIN,
    append_event,
    case_chain,
    event_hash,
    event_record,
    verify_chain,
)
from audit.export import FORMULA_PREFIXES, export_case_bundle, inert_cell
from audit.models import AuditChainHead, AuditEvent
from casehub_verify import BundleReport, verify_bundle
from tests import personas
from tests.audit_triggers import audit_triggers_suspended

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def key_dir(settings: Any, tmp_path: Path) -> Path:
    settings.CASEHUB_SIGNING_KEY_DIR = tmp_path / "signing-keys"
    return settings.CASEHUB_SIGNING_KEY_DIR


def tamper(sql: str, params: list[Any]) -> None:
    """Run a superuser's raw SQL on the audit table, as in psql, past its append-only triggers."""
    with transaction.atomic(), audit_triggers_suspended(), connection.cursor() as cursor:
        cursor.execute(sql, params)


def _steps(case_id: int, n: int, **data: Any) -> None:
    for i in range(n):
        append_event(
            "case.step", actor="erp-lookup", chain=case_chain(case_id), data={"i": i, **data}
        )


def _export(case_id: int, exporter: Any = None) -> bytes:
    bundle = export_case_bundle(case_id=case_id, exporter=exporter or personas.auditor())
    with bundle.file:
        return bundle.file.read()


def _verify(raw: bytes, keys: list[bytes] | None = None) -> BundleReport:
    return verify_bundle(io.BytesIO(raw), trusted_keys=keys)


def _members(raw: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(raw)) as bundle:
        return {name: bundle.read(name) for name in bundle.namelist()}


# The bundle ----------------------------------------------------------------------------------


def test_a_bundle_holds_the_events_the_csv_the_manifest_and_its_signature() -> None:
    _steps(3, 4)
    raw = _export(3)
    members = _members(raw)
    assert list(members) == ["events.jsonl", "events.csv", "manifest.json", "manifest.sig"]
    lines = members["events.jsonl"].decode().splitlines()
    events = AuditEvent.objects.filter(chain=case_chain(3)).order_by("seq")
    assert [json.loads(line)["hash"] for line in lines] == [e.hash for e in events]
    manifest = json.loads(members["manifest.json"])
    key = signing.current_key()
    assert manifest["scope"] == {"case": 3, "chain": "case:3"}
    assert (manifest["event_count"], manifest["first_seq"], manifest["last_seq"]) == (4, 1, 4)
    assert manifest["head_hash"] == events.last().hash
    assert (manifest["key_id"], manifest["public_key"]) == (key.key_id, key.public_key.hex())
    assert manifest["exported_by"] == "audrey"
    assert casehub_verify.ed25519_verify(
        key.public_key, members["manifest.json"], members["manifest.sig"]
    )
    assert _verify(raw, [key.public_key]).ok


def test_the_csv_gives_each_action_its_title_which_no_hash_covers() -> None:
    chain = case_chain(5)
    append_event("planning.case.submitted", chain=chain, data={"case": 5})
    append_event("oversight.gate.decided", chain=chain, data={"gate": 1})
    append_event("ci.audit.checked", chain=chain)
    raw = _export(5)
    assert _verify(raw).ok
    members = _members(raw)
    rows = list(csv.DictReader(io.StringIO(members["events.csv"].decode())))
    assert [(row["action"], row["title"]) for row in rows] == [
        ("planning.case.submitted", "Case submitted"),
        ("oversight.gate.decided", "Gate decided"),
        ("ci.audit.checked", "ci.audit.checked"),
    ]
    records = [json.loads(line) for line in members["events.jsonl"].splitlines()]
    assert all(tuple(sorted(r)) == tuple(sorted(casehub_verify.EVENT_FIELDS)) for r in records)


def test_exports_are_audited_in_the_system_chain() -> None:
    _steps(4, 2)
    auditor = personas.auditor()
    _export(4, auditor)
    event = AuditEvent.objects.filter(chain=SYSTEM_CHAIN, action="oversight.audit.exported").get()
    assert event.actor_user == auditor
    assert event.data["scope"] == {"case": 4, "chain": "case:4"}
    assert (event.data["events"], event.data["head_seq"]) == (2, 2)
    assert verify_chain(SYSTEM_CHAIN) == []


def test_the_first_key_is_generated_on_first_use_outside_the_database(key_dir: Path) -> None:
    assert not key_dir.exists()
    key = signing.current_key()
    assert signing.current_key().key_id == key.key_id
    assert key.key_id == casehub_verify.key_fingerprint(key.public_key)
    assert stat.S_IMODE((key_dir / f"{key.key_id}.pem").stat().st_mode) == 0o600
    assert (key_dir / f"{key.key_id}.pub").read_text().strip() == key.public_key.hex()
    created = AuditEvent.objects.filter(action="oversight.signing_key.created").get()
    assert created.data["key_id"] == key.key_id


@pytest.mark.scenario("A10")
def test_an_export_of_one_case_among_many_holds_only_its_events() -> None:
    for case_id in range(1, 61):
        _steps(case_id, 3, marker=f"marker-of-case-{case_id}-end")
    raw = _export(17)
    members = _members(raw)
    records = [json.loads(line) for line in members["events.jsonl"].splitlines()]
    assert [(r["chain"], r["seq"]) for r in records] == [("case:17", s) for s in (1, 2, 3)]
    rows = list(csv.DictReader(io.StringIO(members["events.csv"].decode())))
    assert {row["chain"] for row in rows} == {"case:17"} and len(rows) == 3
    leaked = [n for n in range(1, 61) if n != 17 and f"marker-of-case-{n}-end".encode() in raw]
    assert leaked == []
    assert b"marker-of-case-17-end" in raw
    assert _verify(raw).ok


# Tamper evidence -----------------------------------------------------------------------------


def _member_spans(raw: bytes) -> dict[str, tuple[int, int]]:
    with zipfile.ZipFile(io.BytesIO(raw)) as bundle:
        spans = {}
        for info in bundle.infolist():
            start = info.header_offset + 30 + len(info.filename)
            spans[info.filename] = (start, start + info.file_size)
    return spans


@pytest.mark.scenario("A9")
def test_every_single_byte_change_fails_verification_naming_the_file() -> None:
    _steps(6, 5, note="a short payload")
    raw = _export(6)
    public = signing.current_key().public_key
    assert _verify(raw, [public]).ok
    spans = _member_spans(raw)
    rng = random.Random(9)
    inside = set()
    for name, (start, end) in spans.items():
        # Every byte of the small members; a sample of the events, always their first and last.
        positions = (
            range(start, end)
            if end - start <= 200
            else sorted({start, end - 1, *rng.sample(range(start, end), 150)})
        )
        inside |= set(range(start, end))
        for position in positions:
            changed = bytearray(raw)
            changed[position] ^= rng.randrange(1, 256)
            report = _verify(bytes(changed), [public])
            assert not report.ok, (name, position - start)
            expected = {"manifest.json", "manifest.sig"} if name.startswith("manifest") else {name}
            assert report.problems[0].file in expected, (name, position - start, report.problems)
    # The container itself: every header, directory and end-record byte.
    container = [position for position in range(len(raw)) if position not in inside]
    assert len(container) > 200
    for position in container:
        for flip in (0x01, 0x80, rng.randrange(1, 256)):
            changed = bytearray(raw)
            changed[position] ^= flip
            assert not _verify(bytes(changed), [public]).ok, position


@pytest.mark.scenario("A9")
def test_a_changed_event_in_the_bundle_is_named_by_its_seq() -> None:
    _steps(7, 5)
    raw = _export(7)
    position = raw.index(b'"data":{"i":2}') + len(b'"data":{"i":')
    changed = raw[:position] + b"9" + raw[position + 1 :]
    report = _verify(changed)
    first = report.problems[0]
    assert (first.file, first.seq, first.problem.split(":")[0]) == ("events.jsonl", 3, "changed")


@pytest.mark.scenario("A9")
def _forge(members: dict[str, bytes], lines: list[bytes], *, fix_head: bool = False) -> bytes:
    # What a forger without CaseHub's key can do: rewrite the events, fix every digest and CRC,
    # and sign the new manifest with a key of their own.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    forger = Ed25519PrivateKey.generate()
    public = forger.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    events = b"".join(lines)
    manifest = json.loads(members["manifest.json"])
    manifest["files"]["events.jsonl"]["sha256"] = hashlib.sha256(events).hexdigest()
    manifest["public_key"] = public.hex()
    manifest["key_id"] = casehub_verify.key_fingerprint(public)
    if fix_head:
        last = json.loads(lines[-1])
        manifest.update(event_count=len(lines), last_seq=last["seq"])
        manifest.update(head_seq=last["seq"], head_hash=last["hash"])
    manifest_bytes = json.dumps(manifest).encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as bundle:
        for name, data in (
            ("events.jsonl", events),
            ("events.csv", members["events.csv"]),
            ("manifest.json", manifest_bytes),
            ("manifest.sig", forger.sign(manifest_bytes)),
        ):
            bundle.writestr(export._member(name), data)
    return out.getvalue()


@pytest.mark.scenario("A5")
def test_a_forged_bundle_with_events_removed_or_swapped_fails_naming_the_seq() -> None:
    _steps(8, 4)
    members = _members(_export(8))
    public = signing.current_key().public_key
    lines = members["events.jsonl"].splitlines(keepends=True)
    for forged, expected in (
        (lines[:2] + lines[3:], {(4, "missing"), (4, "unlinked")}),  # a middle event deleted
        (lines[:3], {(4, "head")}),  # the tail rolled back
        ([lines[0], lines[2], lines[1], lines[3]], {(3, "missing"), (2, "reordered")}),
    ):
        raw = _forge(members, forged)
        # Integrity alone (the forger's key inside): the chain rules name the break.
        found = {(p.seq, p.problem.split(":")[0]) for p in _verify(raw).problems}
        assert expected <= found, found
        # With CaseHub's key: the forgery is refused on its signature too.
        kinds = [p.problem.split(":")[0] for p in _verify(raw, [public]).problems]
        assert kinds[0] == "bad signature"
    # A tail rollback with the manifest's head rewritten to match is consistent by the chain
    # rules; only CaseHub's signature (or a checkpoint) tells.
    rolled_back = _forge(members, lines[:3], fix_head=True)
    assert _verify(rolled_back).ok
    assert [p.problem.split(":")[0] for p in _verify(rolled_back, [public]).problems] == [
        "bad signature"
    ]


@pytest.mark.scenario("A4")
def test_an_in_place_edit_of_one_event_fails_verification_at_exactly_that_seq() -> None:
    _steps(9, 6)
    table = AuditEvent._meta.db_table
    tamper(
        f"UPDATE {table} SET data = %s WHERE chain = %s AND seq = 4",  # noqa: S608
        ['{"i": 999}', case_chain(9)],
    )
    problems = verify_chain(case_chain(9))
    assert [(p.seq, p.problem.split(":")[0]) for p in problems] == [(4, "changed")]
    report = _verify(_export(9))
    assert [(p.file, p.seq) for p in report.problems] == [("events.jsonl", 4)]


# Keys ----------------------------------------------------------------------------------------


@pytest.mark.scenario("A11")
def test_after_rotation_an_old_bundle_verifies_with_the_old_key_and_not_the_new(
    key_dir: Path, tmp_path: Path
) -> None:
    _steps(10, 3)
    old_key = signing.current_key()
    auditor = personas.auditor()
    old_bundle = _export(10, auditor)
    old_id, new_key = signing.rotate_signing_key()
    assert old_id == old_key.key_id != new_key.key_id
    new_bundle = _export(10, auditor)

    assert _verify(old_bundle, [old_key.public_key]).ok
    refused = _verify(old_bundle, [new_key.public_key])
    assert [p.problem.split(":")[0] for p in refused.problems] == ["bad signature"]
    assert _verify(new_bundle, [new_key.public_key]).ok
    assert not _verify(new_bundle, [old_key.public_key]).ok

    assert signing.public_keys() == {
        old_key.key_id: old_key.public_key,
        new_key.key_id: new_key.public_key,
    }
    assert not (key_dir / f"{old_key.key_id}.pem").exists()
    rotated = AuditEvent.objects.filter(action="oversight.signing_key.rotated").get()
    assert rotated.data["retired_key_id"] == old_key.key_id

    # The management command trusts this installation's keys, current and retired.
    for name, raw in (("old.zip", old_bundle), ("new.zip", new_bundle)):
        (tmp_path / name).write_bytes(raw)
        out = io.StringIO()
        call_command("audit_verify", str(tmp_path / name), stdout=out)
        assert "INTACT: 3 events" in out.getvalue()
    with pytest.raises(CommandError, match="bad signature"):
        call_command(
            "audit_verify", str(tmp_path / "old.zip"), "--public-key", new_key.public_key.hex()
        )


def test_audit_verify_exits_1_naming_the_break(tmp_path: Path) -> None:
    _steps(11, 3)
    raw = bytearray(_export(11))
    raw[raw.index(b'"i":1') + 4] = ord("5")
    (tmp_path / "bad.zip").write_bytes(raw)
    with pytest.raises(CommandError, match=r"BROKEN: events.jsonl, seq 2: changed") as caught:
        call_command("audit_verify", str(tmp_path / "bad.zip"))
    assert caught.value.returncode == 1


def test_audit_rotate_key_command_prints_the_new_key() -> None:
    signing.current_key()
    out = io.StringIO()
    call_command("audit_rotate_key", stdout=out)
    assert signing.current_key().key_id in out.getvalue()


# Hostile data --------------------------------------------------------------------------------

HOSTILE = [
    "=1+1",
    "+SUM(A1:A9)",
    "-2+3",
    "@cmd",
    "\tleading tab",
    "\rleading carriage return",
    "line one\r\nline two\nthree",
    "\x1b[31mred\x1b[0m \x1b]0;title\x07",
    '=HYPERLINK("http://evil.example","click")',
]


def test_formula_prefixes_are_made_inert() -> None:
    assert [inert_cell(value)[:1] for value in HOSTILE[:6]] == ["'"] * 6
    assert inert_cell("plain") == "plain"


@hypothesis_settings(max_examples=300, deadline=None)
@given(st.text())
def test_a_cell_is_escaped_as_when_every_cell_was_translated(value: str) -> None:
    # inert_cell skips the translation for printable text; every control character is not
    translated = value.translate(export._CONTROLS)
    expected = f"'{translated}" if translated.startswith(FORMULA_PREFIXES) else translated
    assert inert_cell(value) == expected


def test_the_export_reads_each_event_as_its_record() -> None:
    chain = case_chain(15)
    auditor = personas.auditor()
    for n, value in enumerate(HOSTILE):
        append_event(f"case.value{n}", actor=value, chain=chain, data={"value": value, "n": n})
    append_event(
        "case.by_user", actor=auditor, chain=chain, data={"floats": [1.5, 2], "none": None}
    )
    head = AuditChainHead.objects.get(chain=chain)
    stored = AuditEvent.objects.filter(chain=chain).order_by("seq")
    assert list(export._records(chain, head.seq)) == [event_record(event) for event in stored]
    assert list(export._records(chain, head.seq - 2))[-1]["seq"] == head.seq - 2


@pytest.mark.scenario("A12")
def test_hostile_strings_survive_export_with_inert_csv_cells_and_the_bundle_verifies() -> None:
    huge = "x" * 1_000_000
    chain = case_chain(12)
    for n, value in enumerate(HOSTILE):
        append_event(
            f"{value[:1]}hostile.value{n}", actor=value, chain=chain, data={"value": value}
        )
    append_event("case.huge", chain=chain, data={"huge": huge, "nested": {"=k": HOSTILE}})
    raw = _export(12)
    assert _verify(raw).ok

    members = _members(raw)
    records = [json.loads(line) for line in members["events.jsonl"].splitlines()]
    assert [r["data"]["value"] for r in records[: len(HOSTILE)]] == HOSTILE
    assert [r["actor"] for r in records[: len(HOSTILE)]] == HOSTILE
    assert records[-1]["data"]["huge"] == huge

    text = members["events.csv"].decode()
    assert "\x1b" not in text  # control characters are escaped in the JSON cells
    limit = csv.field_size_limit(2_000_000)  # Python's csv refuses cells over 128 KiB by default
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    finally:
        csv.field_size_limit(limit)
    assert rows[0] == list(casehub_verify.CSV_COLUMNS)
    cells = [cell for row in rows[1:] for cell in row]
    assert [cell for cell in cells if cell.startswith(FORMULA_PREFIXES)] == []
    actors = [row[rows[0].index("actor")] for row in rows[1 : len(HOSTILE) + 1]]
    assert actors == [
        "'=1+1",
        "'+SUM(A1:A9)",
        "'-2+3",
        "'@cmd",
        "'\tleading tab",
        "'\rleading carriage return",
        "line one\r\nline two\nthree",
        "\\u001b[31mred\\u001b[0m \\u001b]0;title\\u0007",
        '\'=HYPERLINK("http://evil.example","click")',
    ]
    assert json.loads(rows[-1][rows[0].index("data")])["huge"] == huge


# Memory --------------------------------------------------------------------------------------


def _bulk_chain(case_id: int, n: int) -> None:
    # Hashes by the one rule, written in bulk: appending one by one would dominate the test.
    chain, prev, now, batch = case_chain(case_id), casehub_verify.GENESIS_HASH, timezone.now(), []
    for seq in range(1, n + 1):
        data = {"step": seq, "note": f"event {seq} of a long chain"}
        digest = event_hash(
            chain=chain, seq=seq, time=now, actor_kind="system", actor="system",
            action="case.step", data=data, prev_hash=prev,
        )  # fmt: skip
        batch.append(
            AuditEvent(
                chain=chain, seq=seq, time=now, actor_kind="system", actor_label="system",
                action="case.step", data=data, prev_hash=prev, hash=digest,
            )
        )  # fmt: skip
        prev = digest
        if len(batch) == 5000:
            AuditEvent.objects.bulk_create(batch)
            batch = []
    AuditEvent.objects.bulk_create(batch)
    AuditChainHead.objects.create(chain=chain, seq=n, head_hash=prev)


def _export_peak(case_id: int, exporter: Any) -> tuple[int, BundleReport]:
    gc.collect()
    tracemalloc.start()
    try:
        bundle = export_case_bundle(case_id=case_id, exporter=exporter)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    with bundle.file:
        return peak, verify_bundle(bundle.file)


def _peak(measured: tuple[int, BundleReport]) -> int:
    return measured[0]


def test_a_long_chain_exports_in_flat_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export, "CHUNK_SIZE", 100)
    short, long = 2 * export.CHUNK_SIZE, 60 * export.CHUNK_SIZE
    _bulk_chain(13, short)
    _bulk_chain(14, long)
    signing.current_key()
    auditor = personas.auditor()
    _export_peak(13, auditor)  # warm-up: first-use allocations (imports, caches) are not counted
    # tracemalloc counts every thread's allocations (other tests may leave servers running): the
    # lower of two runs is the export's own peak.
    short_peak, short_report = min(_export_peak(13, auditor), _export_peak(13, auditor), key=_peak)
    long_peak, long_report = min(_export_peak(14, auditor), _export_peak(14, auditor), key=_peak)
    assert (short_report.ok, short_report.events) == (True, short)
    assert (long_report.ok, long_report.events) == (True, long)
    # Thirty times the events, about the same memory: the export holds one chunk at a time (a
    # list of all 6,000 events would add ~1 KB an event, ~6 MB here).
    assert long_peak < short_peak + 1536 * 1024, (short_peak, long_peak)
