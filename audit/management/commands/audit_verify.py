"""Verify an audit export bundle with casehub_verify.py, trusting this installation's keys."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

import casehub_verify
from audit.signing import public_keys


class Command(BaseCommand):
    help = (
        "Verify an audit export bundle: exit 0 when intact, 1 naming the first broken file or "
        "seq. Without --public-key the bundle must be signed by one of this CaseHub's keys "
        "(the current one or a retired one)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("bundle", help="the bundle .zip")
        parser.add_argument(
            "--public-key",
            metavar="KEY_OR_FILE",
            help="trust only this Ed25519 public key (64 hex digits, or a file in hex or PEM)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Verify the bundle and print what was found.

        Raises CommandError (exit status 1) when the bundle is not intact or cannot be read.
        """
        try:
            if options["public_key"] is not None:
                trusted = [casehub_verify.load_public_key(options["public_key"])]
            else:
                trusted = list(public_keys().values())
            report = casehub_verify.verify_bundle_file(options["bundle"], trusted_keys=trusted)
        except (OSError, ValueError) as exc:
            raise CommandError(f"BROKEN: cannot verify {options['bundle']}: {exc}") from exc
        lines = casehub_verify.describe(report)
        if not report.ok:
            raise CommandError("\n".join(lines))
        self.stdout.write("\n".join(lines))
