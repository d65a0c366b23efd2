"""Verify every audit chain and write a signed checkpoint of each intact one."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.checkpoints import write_checkpoints


class Command(BaseCommand):
    help = (
        "Verify every audit chain (by the chain rules and against its last checkpoint) and "
        "append a signed checkpoint of each intact chain that moved to CASEHUB_AUDIT_ANCHOR_DIR. "
        "Exit 1 when a chain is broken; each broken chain raises an oversight.audit.broken event. "
        "Celery beat runs the same every CASEHUB_AUDIT_CHECKPOINT_INTERVAL_S seconds."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        """Write the checkpoints and report them.

        Raises CommandError (exit status 1) naming the first break of every broken chain.
        """
        run = write_checkpoints()
        for checkpoint in run.written:
            self.stdout.write(
                f"checkpoint {checkpoint.chain} seq {checkpoint.seq} {checkpoint.head_hash}"
            )
        if run.broken:
            raise CommandError(
                "\n".join(
                    f"BROKEN: {chain}, seq {problems[0].seq}: {problems[0].problem}"
                    for chain, problems in run.broken.items()
                )
            )
        self.stdout.write(f"{len(run.written)} checkpoints written; every chain is intact.")
