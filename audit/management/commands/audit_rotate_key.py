"""Put a new audit signing key in use; the retired key's public half stays for old bundles."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from audit.signing import rotate_signing_key


class Command(BaseCommand):
    help = (
        "Rotate the Ed25519 key that signs audit export bundles. The old private key is deleted, "
        "its public key kept, so bundles signed before still verify with it."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        """Rotate the key and audit the rotation in the system chain."""
        old_id, key = rotate_signing_key()
        self.stdout.write(f"Signing key {key.key_id} is now in use (retired: {old_id or 'none'}).")
        self.stdout.write(f"Public key: {key.public_key.hex()}")
