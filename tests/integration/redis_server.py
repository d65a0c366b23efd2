"""A private `redis-server` on a free loopback port, for tests that stop and restart the broker.

The machine's own Redis is never touched: other runs use it. The test process's Celery app is
pointed at the private server for the block (`celery_broker`); workers get its URL in their
environment.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server process; `stop` and `start` again on the same port and directory.

    Without persistence (the default, as many deployments run their broker) a restart loses
    every queued message; with `aof=True` every write is fsynced to an append-only file first.
    """

    def __init__(self, directory: Path, *, aof: bool = False) -> None:
        self.directory = directory
        self.aof = aof
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        if not Path(REDIS_SERVER).exists():
            pytest.fail(f"{REDIS_SERVER} is missing: these fault tests need a private Redis")
        self.directory.mkdir(parents=True, exist_ok=True)
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.aof
            else ["--appendonly", "no"]
        )
        self.starts += 1
        log = (self.directory / f"redis-{self.starts}.log").open("wb")
        self.process = subprocess.Popen(
            [
                REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(self.port),
                "--save", "", *persistence, "--dir", str(self.directory),
                "--protected-mode", "yes",
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while not self.answers():
            if self.process.poll() is not None:
                pytest.fail(f"redis-server exited early: {self.log()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"redis-server did not answer within 20 s: {self.log()[-2000:]}")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        path = self.directory / f"redis-{self.starts}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def answers(self) -> bool:
        try:
            return bool(self.client().ping())
        except Exception:
            return False

    def client(self) -> object:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """Stop the server (SIGKILL: a crash; SIGTERM: a clean shutdown) and wait for it."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def unacknowledged(self) -> int:
        """Return how many messages a worker took and has not acknowledged yet."""
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)
        return int(client.hlen("unacked"))

    def queued(self) -> int:
        """Return how many messages wait in Celery's queues (every `celery*` list)."""
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)
        return sum(
            int(client.llen(key))
            for key in client.scan_iter(match="celery*")
            if client.type(key) == b"list"
        )


def _reset_connections(app: object) -> None:
    # The app caches its connection and producer pools per broker URL: drop them.
    # kombu keeps the pools in registries of its own too: a pool closed but left there would be
    # handed out again (closed) once the app asks for the original broker's pool.
    from kombu import pools

    pools.reset()
    app._pool = None  # type: ignore[attr-defined]
    app.amqp._producer_pool = None  # type: ignore[attr-defined]


@contextmanager
def celery_broker(url: str, transport_options: dict[str, object] | None = None) -> Iterator[None]:
    """Point the test process's Celery app at another broker for the block."""
    from celery import current_app

    app = current_app._get_current_object()
    # `broker_url` reads CELERY_BROKER_URL from the environment first; the read and write URLs
    # are looked up in the configuration.
    names = ("broker_read_url", "broker_write_url", "broker_transport_options")
    saved = {name: app.conf.get(name) for name in names}
    _reset_connections(app)
    app.conf.broker_read_url = app.conf.broker_write_url = url
    app.conf.broker_transport_options = dict(transport_options or {})
    try:
        yield
    finally:
        _reset_connections(app)
        for name, value in saved.items():
            app.conf[name] = value
