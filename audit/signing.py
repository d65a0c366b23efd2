"""The Ed25519 keys that sign audit export bundles, kept in files outside the database.

The directory is `settings.CASEHUB_SIGNING_KEY_DIR` (`var/signing-keys/` by default). Each key is
a PEM private key `<key id>.pem` (mode 0600) and its public half `<key id>.pub` (hex); the file
`current` names the key in use. A key is generated on first use. Rotation retires the current
key: its private half is deleted, its public half kept, so bundles it signed still verify.
The key id is the public key's fingerprint (`casehub_verify.key_fingerprint`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings

from audit.chain import SYSTEM_CHAIN, append_event
from casehub_verify import key_fingerprint, parse_public_key

CURRENT = "current"


class SigningKeyMissing(RuntimeError):
    """The key directory names a current key whose files are gone or unreadable."""


@dataclass(frozen=True, slots=True)
class SigningKey:
    """The key in use: its id, its raw public key and the private key that signs."""

    key_id: str
    public_key: bytes
    private_key: Ed25519PrivateKey

    def sign(self, message: bytes) -> bytes:
        """Return the detached Ed25519 signature (64 bytes) of message."""
        return self.private_key.sign(message)


def key_directory() -> Path:
    """Return the signing key directory, created with mode 0700 if missing."""
    directory = Path(settings.CASEHUB_SIGNING_KEY_DIR)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


def _raw_public(private_key: Ed25519PrivateKey) -> bytes:
    return private_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


def _write_new(path: Path, content: bytes, mode: int) -> None:
    # O_EXCL: a key file is written once and never overwritten.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())


def _generate(directory: Path) -> str:
    private_key = Ed25519PrivateKey.generate()
    public_key = _raw_public(private_key)
    key_id = key_fingerprint(public_key)
    pem = private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write_new(directory / f"{key_id}.pub", f"{public_key.hex()}\n".encode(), 0o644)
    _write_new(directory / f"{key_id}.pem", pem, 0o600)
    return key_id


def _point_current_at(directory: Path, key_id: str, *, replace: bool) -> bool:
    pending = directory / f".{CURRENT}.{key_id}"
    _write_new(pending, f"{key_id}\n".encode(), 0o600)
    if replace:
        os.replace(pending, directory / CURRENT)
        return True
    try:
        # link() fails if `current` exists: of two processes generating the first key, one wins.
        os.link(pending, directory / CURRENT)
        return True
    except FileExistsError:
        return False
    finally:
        pending.unlink(missing_ok=True)


def _load(directory: Path, key_id: str) -> SigningKey:
    try:
        loaded = serialization.load_pem_private_key(
            (directory / f"{key_id}.pem").read_bytes(), password=None
        )
    except (OSError, ValueError) as exc:
        raise SigningKeyMissing(
            f"signing key {key_id} in {directory} cannot be read: {exc}"
        ) from exc
    if not isinstance(loaded, Ed25519PrivateKey):
        raise SigningKeyMissing(f"signing key {key_id} in {directory} is not an Ed25519 key")
    public_key = _raw_public(loaded)
    if key_fingerprint(public_key) != key_id:
        raise SigningKeyMissing(f"signing key {key_id} in {directory} does not match its id")
    return SigningKey(key_id=key_id, public_key=public_key, private_key=loaded)


def current_key() -> SigningKey:
    """Return the key in use, generating the first one if there is none.

    A generated key is recorded in the system chain. Raises SigningKeyMissing when the current
    key's files are gone or damaged.
    """
    directory = key_directory()
    pointer = directory / CURRENT
    if not pointer.exists():
        key_id = _generate(directory)
        if _point_current_at(directory, key_id, replace=False):
            key = _load(directory, key_id)
            append_event(
                "oversight.signing_key.created",
                chain=SYSTEM_CHAIN,
                data={"key_id": key_id, "public_key": key.public_key.hex()},
            )
            return key
        # Another process made the first key at the same moment; use theirs, drop ours.
        (directory / f"{key_id}.pem").unlink(missing_ok=True)
        (directory / f"{key_id}.pub").unlink(missing_ok=True)
    return _load(directory, pointer.read_text().strip())


def rotate_key() -> tuple[str | None, SigningKey]:
    """Put a new key in use and retire the current one; return the old key id and the new key.

    The retired key's private half is deleted and its public half kept. Raises
    SigningKeyMissing when the new key cannot be read back.
    """
    directory = key_directory()
    pointer = directory / CURRENT
    old_id = pointer.read_text().strip() if pointer.exists() else None
    new_id = _generate(directory)
    _point_current_at(directory, new_id, replace=True)
    new_key = _load(directory, new_id)
    if old_id is not None and old_id != new_id:
        (directory / f"{old_id}.pem").unlink(missing_ok=True)
    return old_id, new_key


def current_key_id() -> str | None:
    """Return the id of the key in use, or None before the first export made one."""
    pointer = key_directory() / CURRENT
    return pointer.read_text().strip() if pointer.exists() else None


def public_keys() -> dict[str, bytes]:
    """Return every public key this installation has signed with, current and retired, by id."""
    keys: dict[str, bytes] = {}
    for path in sorted(key_directory().glob("*.pub")):
        try:
            raw = parse_public_key(path.read_text())
        except (OSError, ValueError):
            continue
        if key_fingerprint(raw) == path.stem:
            keys[path.stem] = raw
    return keys


def rotate_signing_key() -> tuple[str | None, SigningKey]:
    """Rotate the signing key (see rotate_key) and record the rotation in the system chain.

    Raises SigningKeyMissing when the new key cannot be read back.
    """
    old_id, key = rotate_key()
    append_event(
        "oversight.signing_key.rotated",
        chain=SYSTEM_CHAIN,
        data={"retired_key_id": old_id, "key_id": key.key_id, "public_key": key.public_key.hex()},
    )
    return old_id, key
