"""A TCP proxy on loopback that delays every byte by a fixed time in each direction.

``bench_load`` puts one in front of PostgreSQL and one in front of Redis and points gunicorn and
the Celery worker at them (RELIABILITY P4). A delay of ``d`` seconds each way adds ``2 d`` to
every round trip; a new connection also waits ``2 d`` before the upstream connection is opened,
as a TCP handshake costs one round trip on a real network. Bytes keep their order (the delay is
the same for every chunk), an end of stream is passed on after the same delay, and ``sever()``
cuts every open connection at once, as a network drop would.

It binds 127.0.0.1 only and connects to loopback targets only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
CHUNK = 64 * 1024


class DelayProxy:
    """Forward 127.0.0.1:``port`` to a loopback target, delaying each direction by ``delay_s``."""

    def __init__(self, target_host: str, target_port: int, *, delay_s: float) -> None:
        if target_host not in LOOPBACK:
            raise ValueError(f"the delay proxy forwards to loopback only, not {target_host!r}")
        if delay_s < 0:
            raise ValueError("the delay cannot be negative")
        self.target_host = target_host
        self.target_port = target_port
        self.delay_s = delay_s
        self.port = 0
        self.connections = 0  # accepted since start
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Listen on a free port of 127.0.0.1 and return it."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def sever(self) -> int:
        """Abort every open connection (both sides, no goodbye); return how many were cut."""
        writers = list(self._open)
        for writer in writers:
            writer.transport.abort()
        return len(writers) // 2

    async def close(self) -> None:
        """Stop listening and cut the open connections."""
        if self._server is not None:
            self._server.close()
        self.sever()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        self._open.add(client_w)
        upstream_w: asyncio.StreamWriter | None = None
        try:
            # The handshake's round trip; whatever the client sends meanwhile waits in the socket.
            await asyncio.sleep(2 * self.delay_s)
            try:
                upstream_r, upstream_w = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
            except OSError:
                return
            self._open.add(upstream_w)
            directions = [
                asyncio.create_task(self._direction(client_r, upstream_w)),
                asyncio.create_task(self._direction(upstream_r, client_w)),
            ]
            try:
                # Both ends passed on; or one side went away mid-write: then both are cut.
                await asyncio.wait(directions, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for direction in directions:
                    direction.cancel()
                await asyncio.gather(*directions, return_exceptions=True)
        finally:
            for writer in (client_w, upstream_w):
                if writer is not None:
                    self._open.discard(writer)
                    writer.close()
            self._tasks.discard(task)

    async def _direction(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy reader to writer, each chunk ``delay_s`` after it arrived; pass the end on."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def read() -> None:
            try:
                while chunk := await reader.read(CHUNK):
                    queue.put_nowait((loop.time() + self.delay_s, chunk))
            except (ConnectionError, OSError):
                pass  # a reset reads as the end of the stream
            finally:
                queue.put_nowait((loop.time() + self.delay_s, b""))

        reading = asyncio.create_task(read())
        try:
            while True:
                due, chunk = await queue.get()
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    if writer.can_write_eof() and not writer.transport.is_closing():
                        writer.write_eof()
                    return
                writer.write(chunk)
                await writer.drain()
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading


class ProxyThread:
    """Run delay proxies on an event loop of their own in a daemon thread, for blocking code."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="delay-proxy", daemon=True
        )
        self._thread.start()
        self.proxies: list[DelayProxy] = []

    def _call[T](self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def add(self, target_host: str, target_port: int, *, delay_s: float) -> DelayProxy:
        """Start a proxy to the target; return it (its ``port`` is set)."""
        proxy = DelayProxy(target_host, target_port, delay_s=delay_s)
        self._call(proxy.start())
        self.proxies.append(proxy)
        return proxy

    def sever_all(self) -> int:
        """Cut every open connection of every proxy; return how many were cut."""

        async def sever() -> int:
            return sum(proxy.sever() for proxy in self.proxies)

        return self._call(sever())

    def close(self) -> None:
        """Close the proxies and stop the thread."""

        async def close_all() -> None:
            await asyncio.gather(*(proxy.close() for proxy in self.proxies))

        try:
            self._call(close_all())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
