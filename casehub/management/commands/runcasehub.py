"""Migrate, seed the demo, and run gunicorn, a Celery worker and Celery beat side by side."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

# Ctrl-C, a service manager and CI stop everything the same way.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True, slots=True, kw_only=True)
class Service:
    """One long-running child process: a name for the log and its command line."""

    name: str
    argv: tuple[str, ...]
    # Started again when it dies (the worker: a leaf's lease then recovers the leaf), at most
    # `MAX_RESTARTS` times a minute; otherwise its exit stops everything.
    restart: bool = False


MAX_RESTARTS = 5


class ServiceExited(RuntimeError):
    """A service stopped by itself while the others were meant to keep running."""

    def __init__(self, name: str, returncode: int) -> None:
        super().__init__(f"{name} exited with status {returncode}; the other services were stopped")
        self.name = name
        self.returncode = returncode


@dataclass(slots=True, kw_only=True)
class Supervisor:
    """Start services, forward a stop signal to each, and stop all when one of them exits."""

    services: Sequence[Service]
    out: TextIO
    stop_timeout_s: float = 20.0
    poll_interval_s: float = 0.2
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)
    _restarts: dict[str, list[float]] = field(default_factory=dict, init=False)
    _stop_signal: int | None = field(default=None, init=False)
    _is_stopping: bool = field(default=False, init=False)

    def run(self) -> None:
        """Run until a stop signal arrives or a service exits, then stop every service.

        Raises ServiceExited when a service stopped by itself.
        """
        previous = {sig: signal.signal(sig, self._request_stop) for sig in STOP_SIGNALS}
        exited: tuple[str, int] | None = None
        try:
            for service in self.services:
                if self._stop_signal is not None:
                    break
                # Each child gets its own process group: the terminal's Ctrl-C reaches only this
                # process, which then stops every child exactly once.
                self._start(service)
            self.out.flush()
            while self._stop_signal is None and exited is None:
                exited = self._first_exited()
                if exited is not None and self._restarted(*exited):
                    exited = None
                time.sleep(self.poll_interval_s)
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if exited is not None and self._stop_signal is None:
            raise ServiceExited(*exited)

    def _start(self, service: Service) -> None:
        process = subprocess.Popen(service.argv, process_group=0)
        self._processes[service.name] = process
        self.out.write(f"Started {service.name} (pid {process.pid}).\n")

    def _restarted(self, name: str, returncode: int) -> bool:
        """Start a restartable service again unless it died too often in the last minute."""
        service = next(s for s in self.services if s.name == name)
        now = time.monotonic()
        recent = [t for t in self._restarts.get(name, []) if now - t < 60]
        if not service.restart or len(recent) >= MAX_RESTARTS or self._stop_signal is not None:
            return False
        self._restarts[name] = [*recent, now]
        self.out.write(f"{name} exited with status {returncode}; starting it again.\n")
        self._start(service)
        self.out.flush()
        return True

    @property
    def returncodes(self) -> dict[str, int | None]:
        """Return each started service's exit status by name (None while it runs)."""
        return {name: process.poll() for name, process in self._processes.items()}

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        # A second Ctrl-C while the services finish their work kills them. Only SIGINT: make
        # passes its own SIGTERM on, so one `kill` can arrive twice.
        if self._is_stopping and signum == signal.SIGINT:
            for process in self._processes.values():
                if process.poll() is None:
                    process.kill()
        self._stop_signal = signum

    def _first_exited(self) -> tuple[str, int] | None:
        for name, process in self._processes.items():
            returncode = process.poll()
            if returncode is not None:
                return name, returncode
        return None

    def _stop_all(self) -> None:
        self._is_stopping = True
        # All at once: each finishes its in-flight work (requests, tasks) in parallel.
        running = [(n, p) for n, p in self._processes.items() if p.poll() is None]
        if running:
            names = ", ".join(name for name, _ in running)
            self.out.write(f"Stopping {names} (Ctrl-C again kills them).\n")
            self.out.flush()
        for _, process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for name, process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.out.write(f"{name} did not stop within {self.stop_timeout_s:g} s; killed.\n")
                process.kill()
                process.wait()
        self.out.flush()


def casehub_services(
    *, host: str, port: int, web_workers: int, web_threads: int, concurrency: int
) -> tuple[Service, ...]:
    """Return the web server, the worker and the scheduler that make one CaseHub."""
    python = sys.executable
    celery = (python, "-m", "celery", "-A", "casehub")
    # Few processes, several threads: SQLite in WAL mode takes one writer at a time.
    web = (
        python, "-m", "gunicorn", "casehub.wsgi:application", "--bind", f"{host}:{port}",
        "--workers", str(web_workers), "--threads", str(web_threads), "--worker-class", "gthread",
        "--graceful-timeout", "10", "--no-control-socket", "--error-logfile", "-",
        "--config", "python:observability.gunicorn",
    )  # fmt: skip
    worker = (
        *celery, "worker", "--loglevel", "INFO", "--pool", "threads",
        "--concurrency", str(concurrency), "--hostname", f"casehub-{port}@%h",
        "--without-mingle", "--without-gossip",
    )  # fmt: skip
    beat = (
        *celery, "beat", "--loglevel", "INFO",
        "--schedule", str(settings.VAR_DIR / "celerybeat-schedule"),
    )  # fmt: skip
    return (
        Service(name="web server (gunicorn)", argv=web),
        Service(name="Celery worker", argv=worker, restart=True),
        Service(name="Celery beat", argv=beat),
    )


def prepare_metrics_dir() -> Path:
    """Point the services' metrics at one fresh multiprocess directory; return it.

    prometheus-client's multiprocess mode: every process (each gunicorn worker, the Celery
    worker) writes its metrics to files under `PROMETHEUS_MULTIPROC_DIR`, and a scrape of any
    web worker adds them up. The children inherit the variable (a directory given in the
    environment is kept, else `metrics/` under the var directory); the files of an earlier run
    are removed, so the counters start again at zero with the processes.
    """
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip()
    directory = Path(given) if given else settings.VAR_DIR / "metrics"
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    return directory


def _parse_addrport(addrport: str) -> tuple[str, int]:
    host, _, port = addrport.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise CommandError(f"{addrport!r} is not HOST:PORT with a port between 1 and 65535")
    return host or "127.0.0.1", int(port)


class Command(BaseCommand):
    help = (
        "Run CaseHub: migrate, seed the demo in demo mode, then serve through gunicorn with a "
        "Celery worker and Celery beat; Ctrl-C or SIGTERM stops all three."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")
        parser.add_argument("--web-workers", type=int, default=2, help="gunicorn processes")
        parser.add_argument("--web-threads", type=int, default=4, help="threads per process")
        parser.add_argument("--concurrency", type=int, default=4, help="Celery worker threads")

    def handle(
        self,
        *args: Any,
        addrport: str,
        web_workers: int,
        web_threads: int,
        concurrency: int,
        **options: Any,
    ) -> None:
        """Migrate, seed the demo, then supervise the services until stopped.

        Raises CommandError for a malformed address or when a service exits by itself.
        """
        host, port = _parse_addrport(addrport)
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("Database migrated.")
        if settings.DEMO:
            call_command("seed_demo")
        services = casehub_services(
            host=host,
            port=port,
            web_workers=web_workers,
            web_threads=web_threads,
            concurrency=concurrency,
        )
        prepare_metrics_dir()
        self.stdout.write(f"CaseHub on http://{host}:{port}/ (Ctrl-C stops it).")
        self.stdout.flush()
        supervisor = Supervisor(services=services, out=sys.stdout)
        try:
            supervisor.run()
        except ServiceExited as exc:
            raise CommandError(str(exc), returncode=max(exc.returncode, 1)) from exc
        self.stdout.write("CaseHub stopped.")
