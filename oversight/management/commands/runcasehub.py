"""Migrate, seed the demo, and run the web server with a Celery worker beside it."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Run CaseHub: migrate, seed demo data in demo mode, start a worker and the web server."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")
        parser.add_argument("--concurrency", type=int, default=4, help="worker threads")

    def handle(self, *args: Any, addrport: str, concurrency: int, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("Database migrated.")
        if settings.DEMO:
            call_command("seed_demo")
        worker = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "casehub", "worker",
                "--loglevel", "INFO", "--pool", "threads", "--concurrency", str(concurrency),
                "--hostname", f"casehub-{addrport.rsplit(':', 1)[-1]}@%h",
            ]
        )  # fmt: skip
        # SIGTERM (a service manager, CI) ends the server the way Ctrl-C does.
        signal.signal(signal.SIGTERM, _interrupt)
        self.stdout.write(f"Worker started (pid {worker.pid}). Web server on http://{addrport}/")
        try:
            call_command("runserver", addrport, use_reloader=False)
        except KeyboardInterrupt:
            pass
        finally:
            self._stop(worker)

    def _stop(self, worker: subprocess.Popen[bytes]) -> None:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        self.stdout.write("CaseHub stopped.")
