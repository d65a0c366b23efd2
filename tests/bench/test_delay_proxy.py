"""The loopback delay proxy of the load bench: what goes in comes out, ends and cuts pass on."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from bench.delay_proxy import DelayProxy

DELAY_S = 0.01


def _run[T](coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a loop of its own thread (the browser tests keep one in this thread)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    # Echo until the client's end of stream, then close: the proxy must pass both on.
    while chunk := await reader.read(4096):
        writer.write(chunk)
        await writer.drain()
    writer.close()


async def _through_proxy(payload: bytes) -> tuple[bytes, int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    proxy = DelayProxy("127.0.0.1", server.sockets[0].getsockname()[1], delay_s=DELAY_S)
    port = await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(payload)
        await writer.drain()
        writer.write_eof()
        echoed = await reader.read()  # to the end of stream: the echo server closed
        writer.close()
        return echoed, proxy.connections
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


def test_bytes_cross_the_proxy_intact_both_ways_and_the_end_of_stream_passes_on() -> None:
    payload = os.urandom(300_000)  # several chunks each way
    echoed, connections = _run(_through_proxy(payload))
    assert echoed == payload
    assert connections == 1


async def _severed() -> tuple[bytes, bytes]:
    seen_by_server: list[bytes] = []
    server_done = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            seen_by_server.append(await reader.readexactly(4))
            rest = await reader.read()  # returns at the end of stream or raises at a reset
            seen_by_server.append(b"end" + rest)
        except ConnectionError:
            seen_by_server.append(b"end")
        finally:
            server_done.set()
            writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    proxy = DelayProxy("127.0.0.1", server.sockets[0].getsockname()[1], delay_s=DELAY_S)
    port = await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        await writer.drain()
        while not proxy._open or len(proxy._open) < 2:  # wait for the upstream connection
            await asyncio.sleep(DELAY_S)
        await asyncio.sleep(4 * DELAY_S)  # the ping is delivered
        assert proxy.sever() == 1
        try:
            client_saw = await reader.read()
        except ConnectionError:
            client_saw = b""
        await server_done.wait()
        writer.close()
        return client_saw, b" ".join(seen_by_server)
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


def test_a_severed_connection_ends_on_both_sides() -> None:
    client_saw, server_saw = _run(_severed())
    assert client_saw == b""
    assert server_saw == b"ping end"


def test_the_proxy_forwards_to_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback"):
        DelayProxy("192.0.2.1", 5432, delay_s=DELAY_S)
