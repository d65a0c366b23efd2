"""Export a case's audit chain as a signed bundle that verifies offline with casehub_verify.py.

The bundle is a zip of stored members, in this order: `events.jsonl` (one event a line in
canonical JSON, every field its hash covers), `events.csv` (the same events for spreadsheets,
every cell made inert), `manifest.json` (scope, counts, head, the chain's latest checkpoint,
exporter, time, key and the SHA-256 of both event files) and `manifest.sig` (the Ed25519
signature of manifest.json's bytes). Events are read in chunks and written straight into a
temporary file, so memory stays flat whatever the chain's length. Beside each action the CSV
gives its title (audit.codes), for people: no hash covers it, the manifest's digest does.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

import casehub_verify
from audit.chain import EVENT_COLUMNS, SYSTEM_CHAIN, append_event, case_chain
from audit.checkpoints import latest_checkpoint
from audit.codes import title
from audit.models import AuditChainHead, AuditEvent
from audit.signing import SigningKey, current_key
from casehub_verify import canonical_json

CHUNK_SIZE = 2000
# Spreadsheets run a cell that starts with one of these as a formula (OWASP's CSV injection list).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


# Control characters but tab, CR and LF (which CSV quoting keeps) are written as JSON writes them,
# `\u001b`, so that an ANSI escape in a cell cannot drive the terminal of whoever prints the file.
_CONTROLS = {
    code: f"\\u{code:04x}"
    for code in (*range(0x20), *range(0x7F, 0xA0))
    if chr(code) not in "\t\r\n"
}


def inert_cell(value: str) -> str:
    """Return a CSV cell shown as text: formula characters get a leading quote, controls escaped."""
    if not value.isprintable():  # every control character is unprintable: most cells skip this
        value = value.translate(_CONTROLS)
    return f"'{value}" if value.startswith(FORMULA_PREFIXES) else value


def _member(name: str) -> zipfile.ZipInfo:
    # Fixed metadata: casehub_verify.py accepts exactly this layout (see its "Reading a bundle").
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3
    info.external_attr = casehub_verify.ZIP_FILE_ATTR
    return info


@dataclass(frozen=True, slots=True)
class BundleSummary:
    """What a bundle holds: its manifest as written and the key that signed it."""

    manifest: dict[str, Any]
    key_id: str


def _records(chain: str, head_seq: int) -> Iterator[dict[str, Any]]:
    """Yield the chain's events as `event_record` gives them, read as plain rows: a long chain's
    export builds no model instance for each of its events.

    Bounded by the head read first: events appended during the export are left for the next.
    """
    rows = (
        AuditEvent.objects.filter(chain=chain, seq__lte=head_seq)
        .order_by("seq")
        .values_list(*EVENT_COLUMNS)
        .iterator(chunk_size=CHUNK_SIZE)
    )
    for chain_, seq, time, actor_kind, actor, action, data, prev_hash, digest in rows:
        yield {
            "chain": chain_,
            "seq": seq,
            "time": casehub_verify.format_time(time),
            "actor_kind": actor_kind,
            "actor": actor,
            "action": action,
            "data": data,
            "prev_hash": prev_hash,
            "hash": digest,
        }


def _write_jsonl(
    target: IO[bytes], records: Iterator[dict[str, Any]]
) -> tuple[str, int, int | None, int | None]:
    digest = hashlib.sha256()
    count, first, last = 0, None, None
    for record in records:
        line = (canonical_json(record) + "\n").encode()
        digest.update(line)
        target.write(line)
        count += 1
        first = record["seq"] if first is None else first
        last = record["seq"]
    return digest.hexdigest(), count, first, last


def _write_csv(target: IO[bytes], records: Iterator[dict[str, Any]]) -> str:
    digest = hashlib.sha256()
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")

    def flush() -> None:
        data = buffer.getvalue().encode()
        digest.update(data)
        target.write(data)
        buffer.seek(0)
        buffer.truncate()

    writer.writerow(casehub_verify.CSV_COLUMNS)
    for n, record in enumerate(records, start=1):
        record["data"] = canonical_json(record["data"])
        record["title"] = title(record["action"])
        writer.writerow([inert_cell(str(record[column])) for column in casehub_verify.CSV_COLUMNS])
        if n % CHUNK_SIZE == 0:
            flush()
    flush()
    return digest.hexdigest()


def write_case_bundle(
    target: IO[bytes], *, case_id: int, exporter: AbstractBaseUser, key: SigningKey
) -> BundleSummary:
    """Write the bundle of one case's audit chain to a seekable binary file.

    The manifest carries the chain's latest checkpoint (or null). Raises ValueError when that
    checkpoint cannot be read, RuntimeError (from zipfile) when an events file would pass 2 GiB.
    """
    chain = case_chain(case_id)
    checkpoint = latest_checkpoint(chain)
    head = AuditChainHead.objects.filter(chain=chain).first()
    head_seq, head_hash = (head.seq, head.head_hash) if head else (0, casehub_verify.GENESIS_HASH)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as bundle:
        with bundle.open(_member(casehub_verify.EVENTS_JSONL), "w") as member:
            jsonl_sha256, count, first_seq, last_seq = _write_jsonl(
                member, _records(chain, head_seq)
            )
        with bundle.open(_member(casehub_verify.EVENTS_CSV), "w") as member:
            csv_sha256 = _write_csv(member, _records(chain, head_seq))
        manifest: dict[str, Any] = {
            "format": casehub_verify.BUNDLE_FORMAT,
            "scope": {"case": case_id, "chain": chain},
            "event_count": count,
            "first_seq": first_seq,
            "last_seq": last_seq,
            "head_seq": head_seq,
            "head_hash": head_hash,
            "checkpoint": checkpoint.as_dict() if checkpoint is not None else None,
            "exported_by": exporter.get_username(),
            "exported_at": casehub_verify.format_time(timezone.now()),
            "key_id": key.key_id,
            "public_key": key.public_key.hex(),
            "files": {
                casehub_verify.EVENTS_JSONL: {"sha256": jsonl_sha256},
                casehub_verify.EVENTS_CSV: {"sha256": csv_sha256},
            },
        }
        manifest_bytes = (
            json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        ).encode()
        bundle.writestr(_member(casehub_verify.MANIFEST), manifest_bytes)
        bundle.writestr(_member(casehub_verify.SIGNATURE), key.sign(manifest_bytes))
    return BundleSummary(manifest=manifest, key_id=key.key_id)


def _file_sha256(handle: IO[bytes]) -> str:
    digest = hashlib.sha256()
    handle.seek(0)
    while chunk := handle.read(1 << 16):
        digest.update(chunk)
    handle.seek(0)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class ExportedBundle:
    """A bundle in a temporary file (deleted when closed), positioned at its start."""

    file: IO[bytes]
    filename: str
    summary: BundleSummary


def export_case_bundle(*, case_id: int, exporter: AbstractBaseUser) -> ExportedBundle:
    """Export one case's chain to a temporary file and audit the export in the system chain.

    The caller checks that the exporter may export it. Raises SigningKeyMissing when the
    signing key cannot be read, RuntimeError when an events file would pass 2 GiB.
    """
    key = current_key()
    handle = tempfile.TemporaryFile()  # noqa: SIM115 (closed by whoever sends it)
    try:
        summary = write_case_bundle(handle, case_id=case_id, exporter=exporter, key=key)
        bundle_sha256 = _file_sha256(handle)
        manifest = summary.manifest
        append_event(
            "oversight.audit.exported",
            actor=exporter,
            chain=SYSTEM_CHAIN,
            data={
                "scope": manifest["scope"],
                "events": manifest["event_count"],
                "head_seq": manifest["head_seq"],
                "head_hash": manifest["head_hash"],
                "key_id": summary.key_id,
                "bundle_sha256": bundle_sha256,
            },
        )
    except BaseException:
        handle.close()
        raise
    return ExportedBundle(
        file=handle, filename=f"casehub-case-{case_id}-audit.zip", summary=summary
    )
