"""The standalone verifier: its chain rules, its Ed25519 against `cryptography`, its CLI offline."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

import casehub_verify
from casehub_verify import (
    GENESIS_HASH,
    ed25519_verify,
    event_hash,
    key_fingerprint,
    parse_public_key,
    verify_events,
)

ROOT = Path(__file__).resolve().parent.parent
VERIFIER = ROOT / "casehub_verify.py"

# RFC 8032, section 7.1: secret key, public key, message, signature (hex).
RFC8032_VECTORS = [
    (
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
        "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    (
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
        "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
    (
        "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
        "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
        "af82",
        "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac"
        "18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
    ),
    (
        "833fe62409237b9d62ec77587520911e9a759cec1d19755b7da901b96dca3d42",
        "ec172b93ad5e563bf4932c70e1245034c35467ef2efd4d64ebf819683467e2bf",
        hashlib.sha512(b"abc").hexdigest(),
        "dc2a4459e7369633a52b1bf277839a00201009a3efbf3ecb69bea2186c26b589"
        "09351fc9ac90b3ecfdfbc7c66431e0303dca179c138ac17ad9bef1177331a704",
    ),
]
GROUP_ORDER = 2**252 + 27742317777372353535851937790883648493


def _raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _cryptography_verifies(public: bytes, message: bytes, signature: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


# Ed25519 -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("secret", "public", "message", "signature"), RFC8032_VECTORS)
def test_rfc8032_vectors_verify_and_match_what_cryptography_signs(
    secret: str, public: str, message: str, signature: str
) -> None:
    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(secret))
    assert _raw(key.public_key()).hex() == public
    assert key.sign(bytes.fromhex(message)).hex() == signature
    assert ed25519_verify(bytes.fromhex(public), bytes.fromhex(message), bytes.fromhex(signature))
    assert not ed25519_verify(
        bytes.fromhex(public), bytes.fromhex(message) + b"x", bytes.fromhex(signature)
    )


def test_random_keys_and_messages_agree_with_cryptography_including_wrong_signatures() -> None:
    rng = random.Random(8032)
    for _ in range(40):
        key = Ed25519PrivateKey.generate()
        other = Ed25519PrivateKey.generate()
        public = _raw(key.public_key())
        message = rng.randbytes(rng.randrange(0, 300))
        signature = key.sign(message)
        flipped = bytearray(signature)
        flipped[rng.randrange(64)] ^= 1 << rng.randrange(8)
        s_plus_order = signature[:32] + (
            int.from_bytes(signature[32:], "little") + GROUP_ORDER
        ).to_bytes(32, "little")
        candidates = [
            (public, message, signature),
            (public, message + b"\0", signature),
            (public, message, bytes(flipped)),
            (_raw(other.public_key()), message, signature),
            (public, message, other.sign(message)),
            (public, message, s_plus_order),  # malleated S: not below the group order
            (public, message, signature[:63]),
        ]
        for candidate in candidates:
            assert ed25519_verify(*candidate) == _cryptography_verifies(*candidate), candidate
        assert ed25519_verify(public, message, signature)
        assert not ed25519_verify(public, message, bytes(flipped))
        assert not ed25519_verify(public, message, s_plus_order)


def test_public_keys_parse_from_hex_and_pem_and_are_named_by_fingerprint() -> None:
    key = Ed25519PrivateKey.generate().public_key()
    raw = _raw(key)
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    assert parse_public_key(raw.hex()) == raw
    assert parse_public_key(f"  {raw.hex().upper()}\n") == raw
    assert parse_public_key(pem) == raw
    assert key_fingerprint(raw) == hashlib.sha256(raw).hexdigest()[:16]
    for bad in (
        "",
        "xyz",
        raw.hex()[:-2],
        "-----BEGIN PUBLIC KEY-----\n!!\n-----END PUBLIC KEY-----",
    ):
        with pytest.raises(ValueError):
            parse_public_key(bad)


# The chain rules -----------------------------------------------------------------------------


def _record(seq: int, prev_hash: str, *, chain: str = "case:1", data: Any = None) -> dict[str, Any]:
    record = {
        "chain": chain,
        "seq": seq,
        "time": f"2026-12-01T09:00:{seq:02d}.000001+00:00",
        "actor_kind": "user",
        "actor": "ana",
        "action": "case.step",
        "data": {"n": seq} if data is None else data,
        "prev_hash": prev_hash,
    }
    return {**record, "hash": casehub_verify.record_hash(record)}


def _chain(n: int) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for seq in range(1, n + 1):
        records.append(_record(seq, records[-1]["hash"] if records else GENESIS_HASH))
    return records


def test_the_event_hash_is_sha256_over_the_canonical_json_of_the_event_and_prev_hash() -> None:
    # Written out by hand, so that a change to the rule (which would orphan every stored chain)
    # cannot slip in through a shared helper.
    from datetime import UTC, datetime

    time = datetime(2026, 12, 1, 9, 0, 0, 5, tzinfo=UTC)
    body = (
        '{"action":"case.submitted","actor":"ana","actor_kind":"user","chain":"case:7",'
        '"data":{"title":"Prüfung","z":[1,2.5,null]},"prev_hash":"' + GENESIS_HASH + '",'
        '"seq":1,"time":"2026-12-01T09:00:00.000005+00:00"}'
    )
    assert (
        event_hash(
            chain="case:7",
            seq=1,
            time=time,
            actor_kind="user",
            actor="ana",
            action="case.submitted",
            data={"z": [1, 2.5, None], "title": "Prüfung"},
            prev_hash=GENESIS_HASH,
        )
        == hashlib.sha256(body.encode()).hexdigest()
    )


def test_an_intact_chain_has_no_problems() -> None:
    assert verify_events(_chain(5), "case:1") == []


def test_a_changed_event_is_named_by_its_seq() -> None:
    records = _chain(5)
    records[2]["data"] = {"n": 99}
    problems = verify_events(records, "case:1")
    assert [(p.seq, p.problem.split(":")[0]) for p in problems] == [(3, "changed")]


def test_a_missing_event_is_named_where_the_gap_shows() -> None:
    records = _chain(5)
    del records[1]
    kinds = {(p.seq, p.problem.split(":")[0]) for p in verify_events(records, "case:1")}
    assert kinds == {(3, "missing"), (3, "unlinked")}


def test_swapped_events_are_reported_as_reordered() -> None:
    records = _chain(5)
    records[1], records[2] = records[2], records[1]
    kinds = [p.problem.split(":")[0] for p in verify_events(records, "case:1")]
    assert "reordered" in kinds
    assert kinds[0] in {"missing", "unlinked"}


def test_an_event_of_another_chain_is_foreign() -> None:
    records = _chain(2)
    records.append(_record(3, records[-1]["hash"], chain="case:2"))
    assert [p.problem.split(":")[0] for p in verify_events(records, "case:1")] == ["foreign"]


def test_a_rewritten_chain_is_intact_by_the_rules_alone() -> None:
    # What only a signature or a checkpoint can catch: the rules see a consistent chain.
    records = _chain(3)
    records[1] = _record(2, records[0]["hash"], data={"n": "rewritten"})
    records[2] = _record(3, records[1]["hash"])
    assert verify_events(records, "case:1") == []


# Standard library only -----------------------------------------------------------------------


def test_the_verifier_imports_only_the_standard_library_in_its_source() -> None:
    tree = ast.parse(VERIFIER.read_text())
    names = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
    }
    assert names, "the walk found no imports at all"
    assert sorted(names - sys.stdlib_module_names - {"__future__"}) == []


# Bundles end to end --------------------------------------------------------------------------


@pytest.fixture
def bundle_path(tmp_path: Path, db: None) -> tuple[Path, bytes]:
    """Write a real export of a small case chain; return its path and the signing public key."""
    from audit.chain import append_event, case_chain
    from audit.export import write_case_bundle
    from audit.signing import SigningKey
    from tests import personas

    private = Ed25519PrivateKey.generate()
    public = _raw(private.public_key())
    key = SigningKey(key_id=key_fingerprint(public), public_key=public, private_key=private)
    for n in range(6):
        append_event("case.step", actor="erp-lookup", chain=case_chain(5), data={"n": n})
    path = tmp_path / "bundle.zip"
    with path.open("wb") as handle:
        write_case_bundle(handle, case_id=5, exporter=personas.auditor(), key=key)
    return path, public


def _run_isolated(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", str(VERIFIER), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


@pytest.mark.scenario("A9")
def test_a_clean_bundle_verifies_offline_in_an_isolated_interpreter(
    bundle_path: tuple[Path, bytes],
) -> None:
    path, public = bundle_path
    bare = _run_isolated(str(path))
    assert bare.returncode == 0, bare.stdout + bare.stderr
    assert "INTACT: 6 events of chain case:5" in bare.stdout
    assert key_fingerprint(public) in bare.stdout
    assert "integrity only" in bare.stdout

    with_key = _run_isolated(str(path), "--public-key", public.hex())
    assert with_key.returncode == 0, with_key.stdout + with_key.stderr
    assert "AUTHENTIC" in with_key.stdout

    stranger = _raw(Ed25519PrivateKey.generate().public_key()).hex()
    refused = _run_isolated(str(path), "--public-key", stranger)
    assert refused.returncode == 1
    assert "BROKEN: manifest.json: bad signature" in refused.stdout


@pytest.mark.scenario("A9")
def test_a_changed_byte_makes_the_cli_exit_1_naming_the_seq(
    bundle_path: tuple[Path, bytes],
) -> None:
    path, _ = bundle_path
    raw = path.read_bytes()
    # Inside event 4's data, in events.jsonl: {"n":3}.
    position = raw.index(b'"data":{"n":3}') + len(b'"data":{"n":')
    path.write_bytes(raw[:position] + b"7" + raw[position + 1 :])
    result = _run_isolated(str(path))
    assert result.returncode == 1
    assert result.stdout.startswith("BROKEN: events.jsonl, seq 4: changed"), result.stdout


def test_running_the_verifier_loads_no_module_outside_the_standard_library(
    bundle_path: tuple[Path, bytes],
) -> None:
    # The interpreter's own start-up (site, a venv's .pth files) is not the verifier's doing:
    # compare the modules loaded before and after running it as a script.
    path, public = bundle_path
    probe = (
        "import json, runpy, sys\n"
        "before = set(sys.modules)\n"
        f"sys.argv = [{str(VERIFIER)!r}, {str(path)!r}, '--public-key', {public.hex()!r}]\n"
        "try:\n"
        f"    runpy.run_path({str(VERIFIER)!r}, run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    code = exit.code\n"
        "loaded = sorted({name.split('.')[0] for name in set(sys.modules) - before})\n"
        "print(json.dumps({'code': code, 'loaded': loaded}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=120, cwd="/"
    )
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["code"] == 0, result.stdout + result.stderr
    assert outcome["loaded"], "the probe saw no import at all"
    assert "django" not in outcome["loaded"]
    assert [name for name in outcome["loaded"] if name not in sys.stdlib_module_names] == []


def test_a_missing_or_unreadable_bundle_exits_1(tmp_path: Path) -> None:
    assert casehub_verify.main([str(tmp_path / "nothing.zip")]) == 1
    (tmp_path / "junk.zip").write_bytes(b"not a zip at all, not even close to one")
    assert casehub_verify.main([str(tmp_path / "junk.zip")]) == 1


def test_main_accepts_the_public_key_as_a_pem_file(
    bundle_path: tuple[Path, bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, public = bundle_path
    pem = Ed25519PublicKey.from_public_bytes(public).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    key_file = tmp_path / "casehub.pem"
    key_file.write_bytes(pem)
    assert casehub_verify.main([str(path), "--public-key", str(key_file)]) == 0
    assert "AUTHENTIC" in capsys.readouterr().out


def test_verify_bundle_reads_from_any_seekable_file(bundle_path: tuple[Path, bytes]) -> None:
    path, public = bundle_path
    report = casehub_verify.verify_bundle(io.BytesIO(path.read_bytes()), trusted_keys=[public])
    assert (report.ok, report.events, report.authenticated) == (True, 6, True)


def test_a_broken_container_is_named_by_the_file_name_it_was_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "case-12-trail.zip"
    junk.write_bytes(b"not a zip at all, not even close to one")
    assert casehub_verify.main([str(junk)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"BROKEN: {junk}: changed:"), out
    assert "bundle.zip" not in out
