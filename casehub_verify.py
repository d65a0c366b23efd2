"""Verify CaseHub audit trails offline: the chain rules, export bundles, Ed25519 signatures.

This one file is the only implementation of the chain rules: CaseHub's own hashing and
verification import it. It imports nothing outside the Python standard library, so an auditor
can read it whole and run it on any machine with Python 3.12 or later:

    python casehub_verify.py bundle.zip [--public-key KEY_OR_FILE]

Exit status 0 when the bundle is intact, 1 otherwise (naming the first broken file or sequence
number and why), 2 for a usage error. Without --public-key the bundle is checked with the key it
carries, which proves integrity only: authenticity needs CaseHub's public key (hex, or a PEM
file), which the exporting CaseHub shows to its auditors.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import operator
import os
import struct
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from json.encoder import encode_basestring
from typing import Any, BinaryIO

GENESIS_HASH = "0" * 64
BUNDLE_FORMAT = "casehub-audit-bundle/1"
EVENTS_JSONL = "events.jsonl"
EVENTS_CSV = "events.csv"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
# The order the exporter writes them in; the verifier accepts no other file and no other order.
BUNDLE_FILES = (EVENTS_JSONL, EVENTS_CSV, MANIFEST, SIGNATURE)
CONTAINER = "bundle.zip"
EVENT_FIELDS = (
    "chain", "seq", "time", "actor_kind", "actor", "action", "data", "prev_hash", "hash",
)  # fmt: skip
# events.csv, for people: an event's fields and, beside its action, the action's title. No hash
# covers the title (the manifest's digest of the file does): the exporter's registry names it.
CSV_COLUMNS = (
    "chain", "seq", "time", "actor_kind", "actor", "action", "title", "data", "prev_hash", "hash",
)  # fmt: skip
_record_row = operator.itemgetter(*EVENT_FIELDS)  # a record's values in the order of EVENT_FIELDS
MANIFEST_MAX_BYTES = 1 << 16


# The chain rules ------------------------------------------------------------------------------


# One encoder, built as json.dumps builds its own for these arguments: encode() is stateless, so
# it is json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False) without the
# cost of building an encoder for every value. For a str, encode() returns
# encode_basestring(value): _json_string is that, without the detour.
_CANONICAL_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_canonical = _CANONICAL_ENCODER.encode
_json_string = encode_basestring


def canonical_json(value: Any) -> str:
    """Serialise a JSON value canonically: sorted keys, no spaces, UTF-8 kept."""
    return _canonical(value)


def _reused_c_encoder() -> Callable[[Any], str]:
    """Return canonical_json by CPython's C encoder, built once, or canonical_json itself.

    JSONEncoder.iterencode builds this very encoder for every value it encodes, with a fresh
    dict to detect circular references in; built once without that dict, it writes every value
    that is not circular identically (and a circular one, which JSON cannot hold, raises
    RecursionError instead of ValueError). Where it is missing, built differently or disagrees
    with canonical_json on a probe, canonical_json is used.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return canonical_json
    try:
        encode = make(
            None, _CANONICAL_ENCODER.default, encode_basestring, None, ":", ",", True, False, True
        )

        def reused(value: Any) -> str:
            return "".join(encode(value, 0))

        probe = {
            "z": [1, -0.0, 2.5, 1e300, 5e-324, float("nan"), float("inf"), 10**30, True, None],
            "a\u00e9": {'\u2028\x00\x1f"\\': "\ud83d\ude00\ud800", "": [{}, []]},
            "B": "=1+1",
        }
        if reused(probe) != canonical_json(probe) or reused("\x7f\u00fc") != '"\x7f\u00fc"':
            return canonical_json
    except Exception:  # any failure of the accelerator: the plain way, always
        return canonical_json
    return reused


_canonical_value = _reused_c_encoder()


# json.loads(text) is this scanner's value when it reads the whole text (JSONDecoder.raw_decode
# is the scanner, wrapped; json.loads also strips whitespace around the value and refuses more).
_scan_json: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads_or_text(text: Any) -> Any:
    """Return json.loads(text), or text itself when it is not JSON (as Django's JSONField)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def format_time(time: datetime) -> str:
    """Return an event time as it is hashed: ISO 8601 with microseconds and its UTC offset."""
    return time.isoformat(timespec="microseconds")


def _event_body(
    chain: Any,
    seq: Any,
    time: Any,
    actor_kind: Any,
    actor: Any,
    action: Any,
    data: Any,
    prev_hash: Any,
) -> dict[str, Any]:
    return {
        "chain": chain,
        "seq": seq,
        "time": time if isinstance(time, str) else format_time(time),
        "actor_kind": actor_kind,
        "actor": actor,
        "action": action,
        "data": data,
        "prev_hash": prev_hash,
    }


# The canonical JSON of an event body written out: its keys in sorted order, each value the
# canonical JSON of the field. Without indentation the encoder writes a nested value exactly as
# it writes that value alone, so for fields of the exact types str and int (seq) this is
# canonical_json(_event_body(...)), character for character; other types take the slow way.
_EVENT_TEMPLATE = (
    '{"action":%s,"actor":%s,"actor_kind":%s,"chain":%s,"data":%s,"prev_hash":%s,"seq":%d,'
    '"time":%s}'
)


def event_text(
    chain: Any,
    seq: Any,
    time: Any,
    actor_kind: Any,
    actor: Any,
    action: Any,
    data: Any,
    prev_hash: Any,
) -> str:
    """Return the canonical JSON of an event body, the text its hash is taken over."""
    if not isinstance(time, str):
        time = format_time(time)
    if (
        type(seq) is int
        and type(chain) is str
        and type(time) is str
        and type(actor_kind) is str
        and type(actor) is str
        and type(action) is str
        and type(prev_hash) is str
    ):
        return _EVENT_TEMPLATE % (
            _json_string(action),
            _json_string(actor),
            _json_string(actor_kind),
            _json_string(chain),
            _canonical_value(data),
            _json_string(prev_hash),
            seq,
            _json_string(time),
        )
    return _canonical(_event_body(chain, seq, time, actor_kind, actor, action, data, prev_hash))


def event_text_around(
    chain: str, time: datetime, actor_kind: str, actor: str, action: str, data: Any
) -> tuple[str, str, str]:
    """Return the event text's three parts around its predecessor's hash and its seq.

    `before + prev_hash + between + str(seq) + after` is `event_text(...)` for a hex prev_hash
    and an int seq: for a writer that learns both from the chain's head inside the statement
    that appends (and hashes there).
    """
    text = _EVENT_TEMPLATE % (
        _json_string(action),
        _json_string(actor),
        _json_string(actor_kind),
        _json_string(chain),
        _canonical_value(data),
        "\0",
        0,
        _json_string(format_time(time)),
    )
    before, rest = text.split('"prev_hash":\0,"seq":0,')
    return before + '"prev_hash":"', '","seq":', "," + rest


def event_hash(
    *,
    chain: str,
    seq: int,
    time: datetime | str,
    actor_kind: str,
    actor: str,
    action: str,
    data: Any,
    prev_hash: str,
) -> str:
    """Return the SHA-256 over the canonical JSON of an event and its predecessor's hash."""
    text = event_text(chain, seq, time, actor_kind, actor, action, data, prev_hash)
    return hashlib.sha256(text.encode()).hexdigest()


def record_hash(record: Mapping[str, Any]) -> str:
    """Return the hash an event record (the fields of EVENT_FIELDS) should carry."""
    return event_hash(
        chain=record["chain"],
        seq=record["seq"],
        time=record["time"],
        actor_kind=record["actor_kind"],
        actor=record["actor"],
        action=record["action"],
        data=record["data"],
        prev_hash=record["prev_hash"],
    )


@dataclass(frozen=True, slots=True)
class ChainProblem:
    """One break in a chain: the sequence number where it shows and what is wrong.

    `problem` starts with a word naming the kind of break: changed, missing, reordered,
    unlinked, foreign or head.
    """

    seq: int
    problem: str


class ChainVerifier:
    """Check events one at a time, in order, against the chain rules; collect every break."""

    def __init__(self, chain: str) -> None:
        self.chain = chain
        self.problems: list[ChainProblem] = []
        self.count = 0
        self.first_seq: int | None = None
        self.last_seq = 0
        self.last_hash = GENESIS_HASH
        self.counted_before = 0  # of count: events a resumed verifier stands after
        self._expected_seq = 1

    @classmethod
    def resumed(cls, chain: str, after: tuple[int, str] | None) -> ChainVerifier:
        """Return a verifier for the events of a chain that follow a stored event.

        `after` is that event's seq and hash (None: the chain's first events follow). For
        events read in seq order the verifier finds what one that had checked every event
        up to `after` would find from there on; `join` hands its findings to that one.
        """
        verifier = cls(chain)
        if after is not None:
            verifier.count = verifier.counted_before = 1  # an event came before: no first one
            verifier.last_seq, verifier.last_hash = after
            verifier._expected_seq = after[0] + 1
        return verifier

    def join(self, later: ChainVerifier) -> None:
        """Take over the findings of a verifier resumed after this one's last event."""
        added = later.count - later.counted_before
        if added:
            if self.first_seq is None:
                self.first_seq = later.first_seq
            self.count += added
            self.last_seq, self.last_hash = later.last_seq, later.last_hash
            self._expected_seq = later._expected_seq
        self.problems.extend(later.problems)

    def state(self) -> dict[str, Any]:
        """Return what the verifier found and where it stands, as JSON values."""
        return {
            "chain": self.chain,
            "problems": [[problem.seq, problem.problem] for problem in self.problems],
            "count": self.count,
            "counted_before": self.counted_before,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "last_hash": self.last_hash,
            "expected_seq": self._expected_seq,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ChainVerifier:
        """Return a verifier as `state` describes it (the inverse of `state`)."""
        verifier = cls(str(state["chain"]))
        verifier.problems = [ChainProblem(int(seq), str(text)) for seq, text in state["problems"]]
        verifier.count = int(state["count"])
        verifier.counted_before = int(state["counted_before"])
        first = state["first_seq"]
        verifier.first_seq = None if first is None else int(first)
        verifier.last_seq = int(state["last_seq"])
        verifier.last_hash = str(state["last_hash"])
        verifier._expected_seq = int(state["expected_seq"])
        return verifier

    def add(self, record: Mapping[str, Any]) -> None:
        """Check one event record (the fields of EVENT_FIELDS) after the ones added before."""
        self.add_row(_record_row(record))

    def add_row(self, row: Sequence[Any]) -> None:
        """Check one event given as the values of EVENT_FIELDS, in that order."""
        chain, seq, time, actor_kind, actor, action, data, prev_hash, digest = row
        self.count += 1
        if self.first_seq is None:
            self.first_seq = seq
        if chain != self.chain:
            self.problems.append(
                ChainProblem(seq, f"foreign: belongs to chain {chain!r}, not {self.chain!r}")
            )
            return
        if seq > self._expected_seq:
            missing = (
                f"seq {self._expected_seq}"
                if seq == self._expected_seq + 1
                else f"seq {self._expected_seq}-{seq - 1}"
            )
            self.problems.append(ChainProblem(seq, f"missing: {missing} should come before it"))
        elif seq < self._expected_seq:
            self.problems.append(
                ChainProblem(seq, f"reordered: comes after seq {self._expected_seq - 1}")
            )
        if prev_hash != self.last_hash:
            self.problems.append(
                ChainProblem(seq, "unlinked: prev_hash does not match the previous event's hash")
            )
        text = event_text(chain, seq, time, actor_kind, actor, action, data, prev_hash)
        if hashlib.sha256(text.encode()).hexdigest() != digest:
            self.problems.append(
                ChainProblem(seq, "changed: the hash does not match the event's content")
            )
        self._expected_seq = max(self._expected_seq, seq + 1)
        self.last_seq = seq
        self.last_hash = digest

    def add_rows(self, rows: Iterable[Sequence[Any]]) -> None:
        """Check events given as the values of EVENT_FIELDS, in order, as add_row would each.

        An event that follows its predecessor as the chain rules want (same chain, next seq,
        linked by prev_hash) needs only its hash checked, here; any other goes through add_row,
        which names what is wrong with it.
        """
        own_chain = self.chain
        sha256 = hashlib.sha256
        text_of = event_text
        expected, last_seq, last_hash = self._expected_seq, self.last_seq, self.last_hash
        count = self.count
        try:
            for row in rows:
                chain, seq, time, actor_kind, actor, action, data, prev_hash, digest = row
                if (
                    count
                    and type(seq) is int
                    and seq == expected
                    and prev_hash == last_hash
                    and chain == own_chain
                    and sha256(
                        text_of(
                            chain, seq, time, actor_kind, actor, action, data, prev_hash
                        ).encode()
                    ).hexdigest()
                    == digest
                ):
                    count += 1
                    expected = seq + 1
                    last_seq = seq
                    last_hash = digest
                    continue
                self._expected_seq, self.last_seq, self.last_hash = expected, last_seq, last_hash
                self.count = count
                self.add_row(row)
                expected, last_seq, last_hash = self._expected_seq, self.last_seq, self.last_hash
                count = self.count
        finally:
            self._expected_seq, self.last_seq, self.last_hash = expected, last_seq, last_hash
            self.count = count

    def add_stored_rows(self, rows: Iterable[Sequence[Any]]) -> None:
        """Check stored events of this chain given with `data` as its JSON text, in order.

        Each row is (seq, time, actor_kind, actor, action, data_text, prev_hash, hash): the
        values of EVENT_FIELDS but the chain. `data` is decoded as json.loads decodes it (a
        text that is not JSON stays the text, as a JSON model field leaves it); then each
        event is checked exactly as add_rows checks it, the hash written out here by the
        template of event_text.
        """
        own_chain = self.chain
        chain_json = _json_string(own_chain)
        quote = _json_string
        canonical = _canonical_value
        scan_json = _scan_json
        sha256 = hashlib.sha256
        template = _EVENT_TEMPLATE
        expected, last_seq, last_hash = self._expected_seq, self.last_seq, self.last_hash
        count = self.count
        try:
            for seq, time, kind, actor, action, data_text, prev_hash, digest in rows:
                try:
                    data, end = scan_json(data_text, 0)
                except Exception:  # not JSON, or not text: json.loads says which
                    end = -1
                if end != len(data_text):
                    data = _loads_or_text(data_text)
                if (
                    count
                    and seq == expected
                    and prev_hash == last_hash
                    and type(seq) is int
                    and type(time) is str
                    and type(kind) is str
                    and type(actor) is str
                    and type(action) is str
                    and type(prev_hash) is str
                    and sha256(
                        (
                            template
                            % (
                                quote(action),
                                quote(actor),
                                quote(kind),
                                chain_json,
                                canonical(data),
                                quote(prev_hash),
                                seq,
                                quote(time),
                            )
                        ).encode()
                    ).hexdigest()
                    == digest
                ):
                    count += 1
                    expected = seq + 1
                    last_seq = seq
                    last_hash = digest
                    continue
                self._expected_seq, self.last_seq, self.last_hash = expected, last_seq, last_hash
                self.count = count
                self.add_row((own_chain, seq, time, kind, actor, action, data, prev_hash, digest))
                expected, last_seq, last_hash = self._expected_seq, self.last_seq, self.last_hash
                count = self.count
        finally:
            self._expected_seq, self.last_seq, self.last_hash = expected, last_seq, last_hash
            self.count = count

    def check_head(self, head_seq: int, head_hash: str, where: str = "the chain head") -> None:
        """Check that the recorded head (seq and hash of the last event) matches the last event."""
        if head_seq != self.last_seq or head_hash != self.last_hash:
            self.problems.append(
                ChainProblem(
                    max(head_seq, self.last_seq),
                    f"head: {where} (seq {head_seq}) does not match the last event "
                    f"(seq {self.last_seq}): events were removed, added or changed at the end",
                )
            )


def verify_events(events: Iterable[Mapping[str, Any]], chain: str) -> list[ChainProblem]:
    """Check that event records form one chain from the genesis hash; return every break."""
    verifier = ChainVerifier(chain)
    verifier.add_rows(map(_record_row, events))
    return verifier.problems


# Ed25519 verification (RFC 8032, section 5.1.7), after the reference code of its section 6 ----

_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
_Point = tuple[int, int, int, int]  # extended homogeneous coordinates (X, Y, Z, T)


def _point_add(p: _Point, q: _Point) -> _Point:
    a = (p[1] - p[0]) * (q[1] - q[0]) % _P
    b = (p[1] + p[0]) * (q[1] + q[0]) % _P
    c = 2 * p[3] * q[3] * _D % _P
    d = 2 * p[2] * q[2] % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f, g * h, f * g, e * h)


def _point_mul(scalar: int, point: _Point) -> _Point:
    result: _Point = (0, 1, 1, 0)
    while scalar > 0:
        if scalar & 1:
            result = _point_add(result, point)
        point = _point_add(point, point)
        scalar >>= 1
    return result


def _point_equal(p: _Point, q: _Point) -> bool:
    return (p[0] * q[2] - q[0] * p[2]) % _P == 0 and (p[1] * q[2] - q[1] * p[2]) % _P == 0


def _recover_x(y: int, sign: int) -> int | None:
    if y >= _P:
        return None
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P)
    if x2 % _P == 0:
        return None if sign else 0
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P != 0:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P != 0:
        return None
    if (x & 1) != sign:
        x = _P - x
    return x


def _point_decompress(encoded: bytes) -> _Point | None:
    y = int.from_bytes(encoded, "little")
    sign = y >> 255
    y &= (1 << 255) - 1
    x = _recover_x(y, sign)
    return None if x is None else (x, y, 1, x * y % _P)


_G_Y = 4 * pow(5, _P - 2, _P) % _P
_G_X = _recover_x(_G_Y, 0)
assert _G_X is not None
_G: _Point = (_G_X, _G_Y, 1, _G_X * _G_Y % _P)


def ed25519_verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """Return whether signature is a valid Ed25519 signature of message by public_key.

    Strict per RFC 8032: a key or R that does not decode, or S not below the group order, is
    invalid, as are keys and signatures of the wrong length.
    """
    if len(public_key) != 32 or len(signature) != 64:
        return False
    a = _point_decompress(public_key)
    r = _point_decompress(signature[:32])
    if a is None or r is None:
        return False
    s = int.from_bytes(signature[32:], "little")
    if s >= _L:
        return False
    digest = hashlib.sha512(signature[:32] + public_key + message).digest()
    k = int.from_bytes(digest, "little") % _L
    return _point_equal(_point_mul(s, _G), _point_add(r, _point_mul(k, a)))


def key_fingerprint(public_key: bytes) -> str:
    """Return a public key's id: the first 16 hex digits of the SHA-256 of its 32 raw bytes."""
    return hashlib.sha256(public_key).hexdigest()[:16]


# DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410); the raw key's 32 bytes follow.
_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")


def parse_public_key(text: str) -> bytes:
    """Return the raw 32 bytes of an Ed25519 public key given in hex or as a PEM public key.

    Raises ValueError for anything else.
    """
    text = text.strip()
    if "-----BEGIN PUBLIC KEY-----" in text:
        body = text.split("-----BEGIN PUBLIC KEY-----", 1)[1].split("-----END PUBLIC KEY-----")[0]
        try:
            der = base64.b64decode("".join(body.split()), validate=True)
        except binascii.Error:
            raise ValueError("the PEM public key is not valid base64") from None
        if len(der) != len(_SPKI_PREFIX) + 32 or not der.startswith(_SPKI_PREFIX):
            raise ValueError("the PEM public key is not an Ed25519 key")
        return der[len(_SPKI_PREFIX) :]
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ValueError("a public key is 64 hex digits or a PEM public key") from None
    if len(raw) != 32:
        raise ValueError("an Ed25519 public key is 32 bytes (64 hex digits)")
    return raw


def load_public_key(key_or_file: str) -> bytes:
    """Return a public key given inline or as the path of a file holding it.

    Raises ValueError when it is neither, and OSError when the file cannot be read.
    """
    if os.path.isfile(key_or_file):
        with open(key_or_file, encoding="ascii", errors="replace") as handle:
            return parse_public_key(handle.read(4096))
    return parse_public_key(key_or_file)


# Reading a bundle ----------------------------------------------------------------------------
# The exporter writes a zip of stored (uncompressed) members with fixed metadata, and the reader
# accepts exactly that layout: every byte of the container is either a fixed value, a copy
# checked against another, or member content checked by CRC-32 and by the signed manifest's
# SHA-256 digests. So no byte of a bundle can change unnoticed.

_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_END = struct.Struct("<4sHHHHIIH")
ZIP_VERSION = 20
ZIP_MADE_BY = (3 << 8) | ZIP_VERSION  # Unix, version 2.0
ZIP_DOS_TIME = 0
ZIP_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01
ZIP_FILE_ATTR = 0o100644 << 16
_CHUNK = 1 << 20


class BundleError(Exception):
    """The bundle's container is not the layout the exporter writes."""

    def __init__(self, file: str, problem: str) -> None:
        self.file = file
        self.problem = problem
        super().__init__(f"{file}: {problem}")


@dataclass(frozen=True, slots=True)
class _Member:
    name: str
    data_offset: int
    size: int
    crc: int


def _read_exactly(handle: BinaryIO, offset: int, size: int, container: str = CONTAINER) -> bytes:
    handle.seek(offset)
    data = handle.read(size)
    if len(data) != size:
        raise BundleError(container, f"truncated at byte {offset + len(data)}")
    return data


def _members(handle: BinaryIO, container: str = CONTAINER) -> list[_Member]:
    total = handle.seek(0, os.SEEK_END)
    if total < _END.size:
        raise BundleError(container, "too short to be a zip file")
    end = _END.unpack(_read_exactly(handle, total - _END.size, _END.size, container))
    signature, disk, cd_disk, count_here, count, cd_size, cd_offset, comment = end
    if signature != b"PK\x05\x06" or (disk, cd_disk, comment) != (0, 0, 0):
        raise BundleError(container, "the end of the zip directory is not where it should be")
    if count_here != count or count != len(BUNDLE_FILES):
        raise BundleError(container, f"holds {count} files, not {len(BUNDLE_FILES)}")
    if cd_offset + cd_size != total - _END.size:
        raise BundleError(container, "the zip directory's size or offset is wrong")
    directory = _read_exactly(handle, cd_offset, cd_size, container)
    members: list[_Member] = []
    position = 0
    next_offset = 0
    for expected_name in BUNDLE_FILES:
        if position + _CENTRAL.size > len(directory):
            raise BundleError(container, "the zip directory is truncated")
        (
            signature, made_by, needed, flags, method, time, date, crc, csize, size,
            name_len, extra_len, comment_len, disk_start, internal, external, offset,
        ) = _CENTRAL.unpack_from(directory, position)  # fmt: skip
        name_bytes = directory[position + _CENTRAL.size : position + _CENTRAL.size + name_len]
        position += _CENTRAL.size + name_len
        fixed = (signature, made_by, needed, flags, method, time, date)
        if fixed != (b"PK\x01\x02", ZIP_MADE_BY, ZIP_VERSION, 0, 0, ZIP_DOS_TIME, ZIP_DOS_DATE):
            raise BundleError(expected_name, "its zip directory entry has unexpected fields")
        if (extra_len, comment_len, disk_start, internal, external) != (0, 0, 0, 0, ZIP_FILE_ATTR):
            raise BundleError(expected_name, "its zip directory entry has unexpected attributes")
        if name_bytes != expected_name.encode():
            found = name_bytes.decode(errors="replace")
            raise BundleError(container, f"expected {expected_name} next, found {found!r}")
        if csize != size or offset != next_offset:
            raise BundleError(expected_name, "its size or position in the zip is wrong")
        local = _LOCAL.unpack(_read_exactly(handle, offset, _LOCAL.size, container))
        local_name = _read_exactly(handle, offset + _LOCAL.size, name_len, container)
        expected_local = (
            b"PK\x03\x04", ZIP_VERSION, 0, 0, ZIP_DOS_TIME, ZIP_DOS_DATE,
            crc, size, size, name_len, 0,
        )  # fmt: skip
        if local != expected_local or local_name != name_bytes:
            raise BundleError(expected_name, "its zip header does not match the zip directory")
        data_offset = offset + _LOCAL.size + name_len
        members.append(_Member(expected_name, data_offset, size, crc))
        next_offset = data_offset + size
    if position != len(directory) or next_offset != cd_offset:
        raise BundleError(container, "there are bytes between the files or after them")
    return members


class _MemberReader:
    """Stream one member's bytes, computing its CRC-32 and SHA-256 on the way."""

    def __init__(self, handle: BinaryIO, member: _Member) -> None:
        self.handle = handle
        self.member = member
        self.crc = 0
        self.sha256 = hashlib.sha256()

    def chunks(self) -> Iterator[bytes]:
        """Yield the member's bytes in chunks of at most 1 MiB."""
        offset, remaining = self.member.data_offset, self.member.size
        while remaining:
            chunk = _read_exactly(self.handle, offset, min(remaining, _CHUNK), self.member.name)
            offset += len(chunk)
            remaining -= len(chunk)
            self.crc = binascii.crc32(chunk, self.crc)
            self.sha256.update(chunk)
            yield chunk

    def lines(self) -> Iterator[bytes]:
        """Yield the member's lines, each with its line feed (the last may lack one)."""
        pending = b""
        for chunk in self.chunks():
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line + b"\n"
        if pending:
            yield pending

    def read(self) -> bytes:
        """Return the member's bytes."""
        return b"".join(self.chunks())

    def crc_matches(self) -> bool:
        """Return whether the bytes read so far match the CRC-32 of the zip directory."""
        return self.crc == self.member.crc


# Verifying a bundle --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BundleProblem:
    """One reason a bundle is not intact: the file, the event's seq where known, and why."""

    file: str
    seq: int | None
    problem: str

    def __str__(self) -> str:
        where = self.file if self.seq is None else f"{self.file}, seq {self.seq}"
        return f"{where}: {self.problem}"


@dataclass(slots=True)
class BundleReport:
    """What verification of one bundle found."""

    problems: list[BundleProblem] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    key_id: str = ""
    events: int = 0
    authenticated: bool = False

    @property
    def ok(self) -> bool:
        """Return whether the bundle is intact."""
        return not self.problems


def _event_shape_problem(record: Any) -> str | None:
    if not isinstance(record, dict) or set(record) != set(EVENT_FIELDS):
        return f"an event has exactly the fields {', '.join(EVENT_FIELDS)}"
    if type(record["seq"]) is not int or record["seq"] < 1:
        return "seq is not a positive integer"
    for name in ("chain", "time", "actor_kind", "actor", "action", "prev_hash", "hash"):
        if not isinstance(record[name], str):
            return f"{name} is not a string"
    return None


def _verify_events_file(
    reader: _MemberReader, chain: str, report: BundleReport, hashes_wanted: Collection[int] = ()
) -> tuple[ChainVerifier, dict[int, str]]:
    verifier = ChainVerifier(chain)
    hashes: dict[int, str] = {}
    for number, line in enumerate(reader.lines(), start=1):
        try:
            record = json.loads(line)
        except ValueError:
            report.problems.append(
                BundleProblem(EVENTS_JSONL, None, f"changed: line {number} is not valid JSON")
            )
            continue
        shape = _event_shape_problem(record)
        if shape is not None:
            report.problems.append(
                BundleProblem(EVENTS_JSONL, None, f"changed: line {number}: {shape}")
            )
            continue
        if (canonical_json(record) + "\n").encode() != line:
            report.problems.append(
                BundleProblem(
                    EVENTS_JSONL, record["seq"], f"changed: line {number} is not canonical JSON"
                )
            )
        verifier.add(record)
        if record["seq"] in hashes_wanted:
            hashes[record["seq"]] = record["hash"]
    report.problems.extend(
        BundleProblem(EVENTS_JSONL, problem.seq, problem.problem) for problem in verifier.problems
    )
    return verifier, hashes


def _checkpoint_seq(manifest: Mapping[str, Any], chain: str, report: BundleReport) -> int | None:
    checkpoint = manifest.get("checkpoint")
    if checkpoint is None:
        return None
    if (
        not isinstance(checkpoint, dict)
        or checkpoint.get("chain") != chain
        or type(checkpoint.get("seq")) is not int
        or not isinstance(checkpoint.get("head_hash"), str)
    ):
        report.problems.append(
            BundleProblem(MANIFEST, None, "changed: its checkpoint is not one of this chain")
        )
        return None
    seq: int = checkpoint["seq"]
    return seq


def _check_checkpoint(
    manifest: Mapping[str, Any], seq: int, hashes: Mapping[int, str], report: BundleReport
) -> None:
    checkpoint = manifest["checkpoint"]
    if seq not in hashes:
        report.problems.append(
            BundleProblem(
                EVENTS_JSONL,
                seq,
                f"rollback: the checkpoint of {checkpoint.get('time')} saw seq {seq}, "
                "which the file does not hold",
            )
        )
    elif hashes[seq] != checkpoint["head_hash"]:
        report.problems.append(
            BundleProblem(
                EVENTS_JSONL,
                seq,
                f"rewritten: seq {seq} is not the event the checkpoint of "
                f"{checkpoint.get('time')} saw",
            )
        )


def _check_manifest_counts(
    manifest: Mapping[str, Any], verifier: ChainVerifier, report: BundleReport
) -> None:
    claimed = (manifest.get("event_count"), manifest.get("first_seq"), manifest.get("last_seq"))
    last = verifier.last_seq if verifier.count else None
    if claimed != (verifier.count, verifier.first_seq, last):
        report.problems.append(
            BundleProblem(
                EVENTS_JSONL,
                None,
                f"missing: the manifest lists {claimed[0]} events (seq {claimed[1]}-{claimed[2]}), "
                f"the file has {verifier.count} (seq {verifier.first_seq}-{last})",
            )
        )
    head_seq, head_hash = manifest.get("head_seq"), manifest.get("head_hash")
    if type(head_seq) is not int or not isinstance(head_hash, str):
        report.problems.append(BundleProblem(MANIFEST, None, "changed: it names no head"))
        return
    problems_before = len(verifier.problems)
    verifier.check_head(head_seq, head_hash, "the manifest's head")
    report.problems.extend(
        BundleProblem(EVENTS_JSONL, problem.seq, problem.problem)
        for problem in verifier.problems[problems_before:]
    )


def _check_digest(manifest: Mapping[str, Any], reader: _MemberReader, report: BundleReport) -> None:
    name = reader.member.name
    if not reader.crc_matches():
        report.problems.append(
            BundleProblem(name, None, "changed: its CRC-32 does not match the zip directory")
        )
    files = manifest.get("files")
    listed = files.get(name) if isinstance(files, dict) else None
    expected = listed.get("sha256") if isinstance(listed, dict) else None
    if expected != reader.sha256.hexdigest():
        report.problems.append(
            BundleProblem(name, None, f"changed: its SHA-256 does not match {MANIFEST}")
        )


def _check_signature(
    manifest_bytes: bytes,
    signature: bytes,
    manifest: Mapping[str, Any],
    trusted_keys: Collection[bytes] | None,
    report: BundleReport,
) -> None:
    try:
        bundle_key = parse_public_key(str(manifest.get("public_key", "")))
    except ValueError as exc:
        report.problems.append(BundleProblem(MANIFEST, None, f"bad signature: {exc}"))
        return
    report.key_id = key_fingerprint(bundle_key)
    if manifest.get("key_id") != report.key_id:
        report.problems.append(
            BundleProblem(MANIFEST, None, "bad signature: key_id is not the public key's id")
        )
    if trusted_keys is not None and bundle_key not in trusted_keys:
        known = ", ".join(sorted(key_fingerprint(key) for key in trusted_keys)) or "none"
        report.problems.append(
            BundleProblem(
                MANIFEST,
                None,
                f"bad signature: signed by key {report.key_id}, not a trusted key ({known})",
            )
        )
        return
    if not ed25519_verify(bundle_key, manifest_bytes, signature):
        report.problems.append(
            BundleProblem(
                SIGNATURE,
                None,
                f"bad signature: it does not verify {MANIFEST} with key {report.key_id}",
            )
        )
        return
    report.authenticated = trusted_keys is not None


def verify_bundle(
    handle: BinaryIO, *, trusted_keys: Collection[bytes] | None = None, name: str = CONTAINER
) -> BundleReport:
    """Verify an export bundle read from a seekable binary file; report every problem found.

    `name` is what problems of the zip container itself are reported against (the file name).

    With trusted_keys the manifest must be signed by one of them (authenticity); without, by
    the key the manifest names (integrity only). Raises OSError when the file cannot be read.
    """
    report = BundleReport()
    try:
        members = {member.name: member for member in _members(handle, name)}
    except BundleError as exc:
        report.problems.append(BundleProblem(exc.file, None, f"changed: {exc.problem}"))
        return report
    try:
        manifest_reader = _MemberReader(handle, members[MANIFEST])
        signature_reader = _MemberReader(handle, members[SIGNATURE])
        if members[MANIFEST].size > MANIFEST_MAX_BYTES:
            raise BundleError(MANIFEST, f"larger than {MANIFEST_MAX_BYTES} bytes")
        manifest_bytes = manifest_reader.read()
        signature = signature_reader.read()
        events_reader = _MemberReader(handle, members[EVENTS_JSONL])
        csv_reader = _MemberReader(handle, members[EVENTS_CSV])
    except BundleError as exc:
        report.problems.append(BundleProblem(exc.file, None, f"changed: {exc.problem}"))
        return report
    for reader in (manifest_reader, signature_reader):
        if not reader.crc_matches():
            report.problems.append(
                BundleProblem(
                    reader.member.name, None, "changed: its CRC-32 does not match the zip directory"
                )
            )
    try:
        manifest = json.loads(manifest_bytes)
        if not isinstance(manifest, dict):
            raise ValueError("not an object")
    except ValueError:
        report.problems.append(BundleProblem(MANIFEST, None, "changed: not a JSON object"))
        return report
    report.manifest = manifest
    _check_signature(manifest_bytes, signature, manifest, trusted_keys, report)
    if manifest.get("format") != BUNDLE_FORMAT:
        report.problems.append(
            BundleProblem(MANIFEST, None, f"changed: the format is not {BUNDLE_FORMAT!r}")
        )
    scope = manifest.get("scope")
    chain = scope.get("chain") if isinstance(scope, dict) else None
    if not isinstance(chain, str):
        report.problems.append(BundleProblem(MANIFEST, None, "changed: the scope names no chain"))
        return report
    checkpoint_seq = _checkpoint_seq(manifest, chain, report)
    wanted = () if checkpoint_seq is None else (checkpoint_seq,)
    verifier, hashes = _verify_events_file(events_reader, chain, report, wanted)
    report.events = verifier.count
    _check_digest(manifest, events_reader, report)
    for _ in csv_reader.chunks():
        pass
    _check_digest(manifest, csv_reader, report)
    _check_manifest_counts(manifest, verifier, report)
    if checkpoint_seq is not None:
        _check_checkpoint(manifest, checkpoint_seq, hashes, report)
    return report


def verify_bundle_file(path: str, *, trusted_keys: Collection[bytes] | None = None) -> BundleReport:
    """Verify the export bundle at path. Raises OSError when it cannot be read."""
    with open(path, "rb") as handle:
        return verify_bundle(handle, trusted_keys=trusted_keys, name=path)


def describe(report: BundleReport, *, limit: int = 20) -> list[str]:
    """Return the lines that tell a person what verification of a bundle found."""
    if not report.ok:
        first = report.problems[0]
        lines = [f"BROKEN: {first}"]
        if len(report.problems) > 1:
            lines.append(f"{len(report.problems)} problems:")
            lines += [f"  {problem}" for problem in report.problems[:limit]]
            if len(report.problems) > limit:
                lines.append(f"  ... and {len(report.problems) - limit} more")
        return lines
    manifest = report.manifest
    chain = manifest.get("scope", {}).get("chain")
    lines = [
        f"INTACT: {report.events} events of chain {chain} "
        f"(seq {manifest.get('first_seq')}-{manifest.get('last_seq')}, "
        f"head {manifest.get('head_hash')})",
        f"Exported by {manifest.get('exported_by')} at {manifest.get('exported_at')}.",
    ]
    if report.authenticated:
        lines.append(f"AUTHENTIC: signed by the trusted public key {report.key_id}.")
    else:
        lines.append(
            f"Checked with the key inside the bundle, fingerprint {report.key_id}: this proves "
            "integrity only. For authenticity, compare the fingerprint with the one CaseHub shows "
            "auditors, or pass CaseHub's public key with --public-key."
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Verify the bundle named on the command line; return 0 when intact, 1 otherwise."""
    parser = argparse.ArgumentParser(
        prog="casehub_verify.py", description="Verify a CaseHub audit export bundle offline."
    )
    parser.add_argument("bundle", help="the bundle .zip exported by CaseHub")
    parser.add_argument(
        "--public-key",
        metavar="KEY_OR_FILE",
        help="CaseHub's Ed25519 public key (64 hex digits, or a file with it in hex or PEM)",
    )
    args = parser.parse_args(argv)
    trusted: list[bytes] | None = None
    try:
        if args.public_key is not None:
            trusted = [load_public_key(args.public_key)]
        report = verify_bundle_file(args.bundle, trusted_keys=trusted)
    except (OSError, ValueError) as exc:
        print(f"BROKEN: cannot verify {args.bundle}: {exc}", file=sys.stderr)
        return 1
    for line in describe(report):
        print(line)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
