"""Signed checkpoints of every audit chain, kept in files outside the database.

A checkpoint records a chain's head (seq and hash) at a time, signed with the audit signing key.
Each chain's checkpoints are appended, one JSON object a line, to
`settings.CASEHUB_AUDIT_ANCHOR_DIR/<chain>.jsonl` (`var/audit-anchors/` by default). A database
superuser who rewrites a chain (recomputing every later hash and the head) or rolls its tail
back leaves chains that satisfy the chain rules; they no longer match the last checkpoint, and
verification says at which seq. `write_checkpoints` verifies every chain first: a broken chain
gets no new checkpoint and raises an `oversight.audit.broken` event in the system chain.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from audit.chain import SYSTEM_CHAIN, append_event, check_chain
from audit.models import AuditChainHead, AuditEvent
from audit.signing import SigningKey, current_key, public_keys
from casehub_verify import ChainProblem, ChainVerifier, canonical_json, ed25519_verify, format_time

_CHAIN_NAME = re.compile(r"^[a-z]+(:[0-9]+)?$")
_CHAIN_FILE = re.compile(r"^([a-z]+)(?:-([0-9]+))?\.jsonl$")
ALERT_PROBLEMS_MAX = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """One signed sighting of a chain's head."""

    chain: str
    seq: int
    head_hash: str
    time: str
    key_id: str
    signature: str = ""

    def signed_bytes(self) -> bytes:
        """Return the bytes the signature covers: the canonical JSON of every other field."""
        body = asdict(self)
        del body["signature"]
        return canonical_json(body).encode()

    def as_dict(self) -> dict[str, Any]:
        """Return the checkpoint as JSON data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Checkpoint:
        """Build a checkpoint from JSON data. Raises ValueError when a field is missing or wrong."""
        try:
            checkpoint = cls(
                chain=str(data["chain"]),
                seq=int(data["seq"]),
                head_hash=str(data["head_hash"]),
                time=str(data["time"]),
                key_id=str(data["key_id"]),
                signature=str(data["signature"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a checkpoint: {exc}") from exc
        return checkpoint


def anchor_directory() -> Path:
    """Return the checkpoint directory, created with mode 0700 if missing."""
    directory = Path(settings.CASEHUB_AUDIT_ANCHOR_DIR)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


def _path(chain: str) -> Path:
    if not _CHAIN_NAME.match(chain):
        raise ValueError(f"not a chain name: {chain!r}")
    return anchor_directory() / f"{chain.replace(':', '-')}.jsonl"


def checkpointed_chains() -> set[str]:
    """Return the chains that have a checkpoint file, whether or not the database knows them."""
    chains: set[str] = set()
    for path in anchor_directory().iterdir():
        if match := _CHAIN_FILE.match(path.name):
            name, number = match.groups()
            chains.add(f"{name}:{number}" if number else name)
    return chains


def latest_checkpoint(chain: str) -> Checkpoint | None:
    """Return the chain's last checkpoint, or None before its first.

    Raises ValueError when the last line of the chain's checkpoint file is not a checkpoint.
    """
    path = _path(chain)
    if not path.exists():
        return None
    last = ""
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                last = line
    if not last:
        return None
    try:
        return Checkpoint.from_dict(json.loads(last))
    except json.JSONDecodeError as exc:
        raise ValueError(f"the last checkpoint of {chain} is not JSON: {exc}") from exc


def sign_checkpoint(chain: str, seq: int, head_hash: str, key: SigningKey) -> Checkpoint:
    """Return a checkpoint of the given head, signed with key, timed now."""
    unsigned = Checkpoint(
        chain=chain,
        seq=seq,
        head_hash=head_hash,
        time=format_time(timezone.now()),
        key_id=key.key_id,
    )
    signature = key.sign(unsigned.signed_bytes()).hex()
    return Checkpoint(**{**unsigned.as_dict(), "signature": signature})


def _append(checkpoint: Checkpoint) -> None:
    line = (canonical_json(checkpoint.as_dict()) + "\n").encode()
    descriptor = os.open(_path(checkpoint.chain), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def checkpoint_problems(checkpoint: Checkpoint, keys: Mapping[str, bytes]) -> list[ChainProblem]:
    """Compare the stored chain with a checkpoint of it; return what no longer matches."""
    problems: list[ChainProblem] = []
    public = keys.get(checkpoint.key_id)
    try:
        signature = bytes.fromhex(checkpoint.signature)
    except ValueError:
        signature = b""
    if public is None or not ed25519_verify(public, checkpoint.signed_bytes(), signature):
        problems.append(
            ChainProblem(
                checkpoint.seq,
                f"checkpoint: the checkpoint of {checkpoint.time} does not verify "
                f"with signing key {checkpoint.key_id}",
            )
        )
    event = AuditEvent.objects.filter(chain=checkpoint.chain, seq=checkpoint.seq).first()
    if event is None:
        head = AuditChainHead.objects.filter(chain=checkpoint.chain).first()
        ends_at = head.seq if head is not None else 0
        problems.append(
            ChainProblem(
                checkpoint.seq,
                f"rollback: the chain ends at seq {ends_at}, but the checkpoint of "
                f"{checkpoint.time} saw seq {checkpoint.seq}"
                if ends_at < checkpoint.seq
                else f"missing: seq {checkpoint.seq}, seen by the checkpoint of "
                f"{checkpoint.time}, is gone",
            )
        )
    elif event.hash != checkpoint.head_hash:
        problems.append(
            ChainProblem(
                checkpoint.seq,
                f"rewritten: seq {checkpoint.seq} is not the event the checkpoint of "
                f"{checkpoint.time} saw; the chain was rewritten up to here",
            )
        )
    return problems


def verify_anchored_chain(chain: str, keys: Mapping[str, bytes] | None = None) -> ChainVerifier:
    """Check a stored chain by the chain rules and against its last checkpoint.

    Raises ValueError when the chain's last checkpoint cannot be read.
    """
    verifier = check_chain(chain)
    checkpoint = latest_checkpoint(chain)
    if checkpoint is not None:
        verifier.problems.extend(
            checkpoint_problems(checkpoint, public_keys() if keys is None else keys)
        )
    return verifier


@dataclass(slots=True)
class CheckpointRun:
    """What one round of checkpointing did: the checkpoints written, the chains found broken."""

    written: list[Checkpoint] = field(default_factory=list)
    broken: dict[str, list[ChainProblem]] = field(default_factory=dict)


@contextmanager
def _one_writer() -> Iterator[None]:
    """Hold the anchor directory's lock: two schedulers' rounds run one after the other.

    The second round then finds every chain it would checkpoint already checkpointed at the same
    head, and writes nothing (two beat processes at once, RELIABILITY F4).
    """
    descriptor = os.open(anchor_directory() / ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def write_checkpoints() -> CheckpointRun:
    """Verify every chain; checkpoint each intact one that moved, alert on each broken one.

    A broken chain (by the rules or against its last checkpoint) gets an `oversight.audit.broken`
    event in the system chain instead of a checkpoint. Every chain is every chain the database
    has and every chain with a checkpoint file: a chain whose events are all gone (an older backup
    restored, a case's rows deleted) is a rollback to seq 0, not a chain nobody looks at. One round
    runs at a time (`_one_writer`). Raises SigningKeyMissing when the signing key cannot be read.
    """
    with _one_writer():
        return _write_checkpoints()


def _write_checkpoints() -> CheckpointRun:
    key = current_key()
    keys = public_keys()
    run = CheckpointRun()
    heads = {head.chain: head for head in AuditChainHead.objects.all()}
    for chain in sorted(heads.keys() | checkpointed_chains()):
        head = heads.get(chain)
        try:
            verifier = verify_anchored_chain(chain, keys)
            problems = verifier.problems
        except ValueError as exc:
            problems = [ChainProblem(head.seq if head else 0, f"checkpoint: {exc}")]
        if problems:
            run.broken[chain] = problems
            append_event(
                "oversight.audit.broken",
                chain=SYSTEM_CHAIN,
                data={
                    "chain": chain,
                    "first_seq": problems[0].seq,
                    "problems": [
                        {"seq": p.seq, "problem": p.problem} for p in problems[:ALERT_PROBLEMS_MAX]
                    ],
                    "count": len(problems),
                },
            )
            continue
        latest = latest_checkpoint(chain)
        if head is None or (
            latest is not None and (latest.seq, latest.head_hash) == (head.seq, head.head_hash)
        ):
            continue
        checkpoint = sign_checkpoint(chain, verifier.last_seq, verifier.last_hash, key)
        _append(checkpoint)
        run.written.append(checkpoint)
    return run
