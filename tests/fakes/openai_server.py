"""A scripted, recording OpenAI-compatible HTTP server for tests (stdlib only, loopback).

Use it through the real ``openai`` client: point ``OPENAI_BASE_URL`` at ``server.base_url``.

    with FakeOpenAIServer(latency_s=0.05) as server:
        server.enqueue('{"steps": []}')                   # queued replies, FIFO
        server.responder = lambda request: FakeReply(...)  # or a callable, sees every request
        ...                                                # run code that calls the model
        server.requests                                    # every recorded request, in order

Endpoints: ``POST /v1/chat/completions`` (the reply is a chat completion whose message content is
the scripted text, with ``usage`` figures) and ``GET /v1/models``. A queued reply is used first;
when the queue is empty the ``responder`` answers; with neither, the server answers HTTP 500 with
an explanatory error (so a test that forgot to script a reply fails loudly).

A reply is a ``str`` (the assistant message content), a ``dict``/``list`` (serialised to JSON and
used as the content) or a :class:`FakeReply` (content plus status code, token counts, extra
latency, ``finish_reason``, tool calls, a connection reset, a ``Retry-After``).
``FakeReply(tool_calls=[{"name": ..., "arguments": {...}}])`` answers with function calls instead of
content (``finish_reason: "tool_calls"``; arguments may be a dict or JSON text, ids are made up
when absent); ``FakeReply(reset=True)`` drops the connection with a TCP reset and answers nothing;
``retry_after_s`` sends ``retry-after-ms`` with an error status (so retries need not wait the SDK's
backoff). ``refuse_json_schema=True`` makes the server answer every
``json_schema`` request with HTTP 400, as servers without structured output support do;
``refuse_response_schema=True`` refuses a ``schema`` inside a ``json_object`` response format.
Every request is recorded as a :class:`RecordedRequest` (body, messages, monotonic start
and end times) whatever its outcome; :meth:`FakeOpenAIServer.max_overlap` reports how many requests
were in flight at once, which is how tests check concurrency without timing assertions.

``fake_openai_process(latency_s=..., responder=...)`` runs the same server in a spawned process
(for benchmarks, so the fake's own work does not compete for the GIL) and yields its environment;
``fake_stats(env)`` reads its request count, peak overlap and sequential rounds over HTTP.

The pytest fixture ``fake_openai`` (in ``tests/fakes/fixtures.py``) yields a started server and
resets nothing between tests because each test gets its own server.
"""

from __future__ import annotations

import json
import multiprocessing
import socket
import struct
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from types import TracebackType
from typing import Any

__all__ = [
    "FakeOpenAIServer",
    "FakeReply",
    "RecordedRequest",
    "Reply",
    "Responder",
    "fake_openai_process",
    "fake_stats",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class FakeReply:
    """One scripted answer: message content, HTTP status and usage figures."""

    content: str = ""
    status: int = 200
    prompt_tokens: int | None = None  # None: estimated from the request (chars / 4)
    completion_tokens: int | None = None  # None: estimated from the content (chars / 4)
    extra_latency_s: float = 0.0
    error_message: str = "fake server error"
    should_retry: bool | None = None  # sent as ``x-should-retry``; None: the client decides
    finish_reason: str = "stop"  # "length": the answer was cut off at max_tokens
    # function calls instead of content: {"name", "arguments" (dict or JSON text), "id"?}
    tool_calls: tuple[Mapping[str, Any], ...] | list[Mapping[str, Any]] = ()
    reset: bool = False  # drop the connection with a TCP reset, answer nothing
    retry_after_s: float | None = None  # sent as ``retry-after-ms`` with an error status


Reply = str | dict[str, Any] | list[Any] | FakeReply
Responder = Callable[["RecordedRequest"], Reply]


@dataclass(slots=True, kw_only=True)
class RecordedRequest:
    """A request as the server saw it, with its monotonic start and end times."""

    index: int
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    started_at: float
    finished_at: float = 0.0
    status: int = 0
    reply_content: str = ""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """Return the chat messages of the request."""
        messages = self.body.get("messages", [])
        return messages if isinstance(messages, list) else []

    @property
    def system_prompt(self) -> str:
        """Return the concatenated system messages."""
        return "\n".join(_text(m) for m in self.messages if m.get("role") == "system")

    @property
    def user_prompt(self) -> str:
        """Return the first user message (the planning prompt)."""
        for message in self.messages:
            if message.get("role") == "user":
                return _text(message)
        return ""

    @property
    def last_user_prompt(self) -> str:
        """Return the last user message (a repair request, when there is one)."""
        users = [m for m in self.messages if m.get("role") == "user"]
        return _text(users[-1]) if users else ""

    @property
    def response_format(self) -> dict[str, Any]:
        """Return the ``response_format`` the client asked for ({} when absent)."""
        value = self.body.get("response_format") or {}
        return value if isinstance(value, dict) else {}

    @property
    def max_tokens(self) -> int | None:
        """Return the ``max_tokens`` the client asked for (None when absent)."""
        value = self.body.get("max_tokens")
        return value if isinstance(value, int) else None

    @property
    def tools(self) -> list[str]:
        """Return the names of the functions the client offered ([] when none)."""
        tools = self.body.get("tools") or []
        return [str(t.get("function", {}).get("name", "")) for t in tools if isinstance(t, dict)]

    @property
    def tool_choice(self) -> Any:
        """Return the ``tool_choice`` the client asked for (None when absent)."""
        return self.body.get("tool_choice")

    @property
    def json_schema(self) -> dict[str, Any]:
        """Return the JSON schema of a ``json_schema`` response format ({} when absent)."""
        spec = self.response_format.get("json_schema") or {}
        schema = spec.get("schema") if isinstance(spec, dict) else None
        return schema if isinstance(schema, dict) else {}


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


class FakeOpenAIServer:
    """Serve scripted chat completions on 127.0.0.1 and record every request."""

    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        model: str = "fake-model",
        api_key: str = "test-key",
        responder: Responder | None = None,
        refuse_json_schema: bool = False,
        refuse_response_schema: bool = False,
    ) -> None:
        self.latency_s = latency_s
        self.refuse_json_schema = refuse_json_schema
        self.refuse_response_schema = refuse_response_schema
        self.model = model
        self.api_key = api_key
        self.responder = responder
        self._queue: deque[Reply] = deque()
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> FakeOpenAIServer:
        """Bind a random loopback port and serve in a daemon thread."""
        if self._httpd is not None:
            return self
        handler = _make_handler(self)
        httpd = _Server(("127.0.0.1", 0), handler)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, args=(0.05,), name="fake-openai", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- configuration ---------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """Return the bound port (the server must be started)."""
        if self._httpd is None:
            raise RuntimeError("FakeOpenAIServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """Return the OpenAI base URL, e.g. ``http://127.0.0.1:5123/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def env(self) -> dict[str, str]:
        """Return the environment variables that point CaseHub at this server."""
        return {
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_KEY": self.api_key,
            "CASEHUB_LLM_MODEL": self.model,
        }

    def enqueue(self, *replies: Reply) -> None:
        """Queue replies, answered in order before the responder is consulted."""
        with self._lock:
            self._queue.extend(replies)

    # -- inspection ------------------------------------------------------------------------------
    @property
    def requests(self) -> list[RecordedRequest]:
        """Return a snapshot of the recorded chat-completion requests, in arrival order."""
        with self._lock:
            return [r for r in self._requests if r.path.endswith("/chat/completions")]

    @property
    def all_requests(self) -> list[RecordedRequest]:
        """Return a snapshot of every recorded request (any path)."""
        with self._lock:
            return list(self._requests)

    def max_overlap(self) -> int:
        """Return the largest number of chat-completion requests that were in flight at once."""
        events: list[tuple[float, int]] = []
        for request in self.requests:
            events.append((request.started_at, 1))
            events.append((request.finished_at, -1))
        # ends sort before starts at the same instant so touching intervals do not overlap
        events.sort(key=lambda event: (event[0], event[1]))
        current = peak = 0
        for _, delta in events:
            current += delta
            peak = max(peak, current)
        return peak

    def sequential_rounds(self) -> int:
        """Return the longest chain of requests each starting after the previous one ended.

        With a fixed latency this is the number of call latencies the work took end to end,
        however many requests ran in parallel.
        """
        ordered = sorted(self.requests, key=lambda r: r.finished_at)
        chain: list[int] = []
        for i, request in enumerate(ordered):
            best = 0
            for j in range(i):
                if ordered[j].finished_at <= request.started_at:
                    best = max(best, chain[j])
            chain.append(best + 1)
        return max(chain, default=0)

    # -- internals -------------------------------------------------------------------------------
    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            request.index = len(self._requests)
            self._requests.append(request)

    def _next_reply(self, request: RecordedRequest) -> Reply | None:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            responder = self.responder
        if responder is None:
            return None
        return responder(request)


def _serve_in_child(
    latency_s: float,
    responder: Responder | None,
    model: str,
    ready: Connection,
    stop: Event,
) -> None:
    with FakeOpenAIServer(latency_s=latency_s, model=model, responder=responder) as server:
        ready.send(server.base_url)
        stop.wait()


@contextmanager
def fake_openai_process(
    *,
    latency_s: float = 0.0,
    responder: Responder | None = None,
    model: str = "fake-model",
    api_key: str = "test-key",
) -> Iterator[dict[str, str]]:
    """Run a fake server in a separate process; yield the environment that points at it.

    The responder must be importable (a module-level function) because the child process is
    spawned. Use this when the server's own work must not compete with the code under test for
    the GIL (benchmarks). ``GET {base_url}/../_fake/stats`` reports the request count, the peak
    overlap and the sequential rounds.
    """
    context = multiprocessing.get_context("spawn")
    parent_end, child_end = context.Pipe(duplex=False)
    stop = context.Event()
    process = context.Process(
        target=_serve_in_child,
        args=(latency_s, responder, model, child_end, stop),
        name="fake-openai",
        daemon=True,
    )
    process.start()
    try:
        if not parent_end.poll(30):
            raise RuntimeError("the fake OpenAI server process did not start")
        base_url = parent_end.recv()
        yield {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "CASEHUB_LLM_MODEL": model}
    finally:
        stop.set()
        process.join(timeout=10)
        if process.is_alive():
            process.terminate()


def fake_stats(env: Mapping[str, str]) -> dict[str, int]:
    """Return the request statistics of a fake server (in this process or another)."""
    root = env["OPENAI_BASE_URL"].removesuffix("/v1")
    with urllib.request.urlopen(root + "/_fake/stats", timeout=10) as response:
        data: dict[str, int] = json.loads(response.read())
    return data


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # the default backlog of 5 drops connections when dozens of calls arrive at once,
    # and the client's SYN retry then adds a second to the benchmark
    request_queue_size = 256


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _as_reply(reply: Reply) -> FakeReply:
    if isinstance(reply, FakeReply):
        return reply
    if isinstance(reply, str):
        return FakeReply(content=reply)
    return FakeReply(content=json.dumps(reply))


def _make_handler(server: FakeOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body go out in separate writes; with Nagle's algorithm on, the body
        # waits for the client's delayed ACK (~40 ms) and distorts every latency figure
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return  # keep test output quiet

        def do_GET(self) -> None:
            started = time.monotonic()
            record = RecordedRequest(
                index=0,
                method="GET",
                path=self.path,
                headers=dict(self.headers.items()),
                body={},
                started_at=started,
            )
            server._record(record)
            if self.path.rstrip("/") == "/_fake/stats":
                payload = {
                    "chat_requests": len(server.requests),
                    "max_overlap": server.max_overlap(),
                    "sequential_rounds": server.sequential_rounds(),
                }
                self._send(200, payload, record)
            elif self.path.rstrip("/").endswith("/models"):
                payload = {
                    "object": "list",
                    "data": [
                        {"id": server.model, "object": "model", "created": 0, "owned_by": "fake"}
                    ],
                }
                self._send(200, payload, record)
            else:
                self._send(404, _error("not found: " + self.path), record)

        def do_POST(self) -> None:
            started = time.monotonic()
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                body = {"_unparseable": raw.decode("utf-8", "replace")}
            record = RecordedRequest(
                index=0,
                method="POST",
                path=self.path,
                headers=dict(self.headers.items()),
                body=body if isinstance(body, dict) else {"_body": body},
                started_at=started,
            )
            server._record(record)
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, _error("not found: " + self.path), record)
                return
            if server.refuse_json_schema and record.response_format.get("type") == "json_schema":
                message = "response_format type must be one of: text, json_object"
                self._send(400, _error(message), record)
                return
            if server.refuse_response_schema and "schema" in record.response_format:
                message = "Unrecognized request argument supplied: response_format.schema"
                self._send(400, _error(message), record)
                return
            try:
                scripted = server._next_reply(record)
            except Exception as exc:  # a responder bug must surface in the test, not hang it
                message = f"fake server responder raised {exc!r}"
                self._send(500, _error(message), record, retry=False)
                return
            if scripted is None:
                message = "fake server: no scripted reply for this request"
                self._send(500, _error(message), record, retry=False)
                return
            reply = _as_reply(scripted)
            delay = server.latency_s + reply.extra_latency_s
            if delay > 0:
                time.sleep(delay)
            if reply.reset:
                self._reset(record)
                return
            if reply.status != 200:
                self._send(
                    reply.status,
                    _error(reply.error_message),
                    record,
                    retry=reply.should_retry,
                    retry_after_s=reply.retry_after_s,
                )
                return
            prompt_text = "".join(_text(m) for m in record.messages)
            prompt_tokens = (
                reply.prompt_tokens
                if reply.prompt_tokens is not None
                else _estimate_tokens(prompt_text)
            )
            completion_tokens = (
                reply.completion_tokens
                if reply.completion_tokens is not None
                else _estimate_tokens(reply.content)
            )
            record.reply_content = reply.content
            message: dict[str, Any] = {"role": "assistant", "content": reply.content}
            finish_reason = reply.finish_reason
            if reply.tool_calls:
                message["content"] = reply.content or None
                message["tool_calls"] = _tool_calls(reply.tool_calls, record.index)
                finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
                record.reply_content = json.dumps(message["tool_calls"])
            payload = {
                "id": f"chatcmpl-fake-{record.index}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": str(record.body.get("model") or server.model),
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": finish_reason,
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
            self._send(200, payload, record)

        def _send(
            self,
            status: int,
            payload: Mapping[str, Any],
            record: RecordedRequest,
            *,
            retry: bool | None = None,
            retry_after_s: float | None = None,
        ) -> None:
            data = json.dumps(payload).encode()
            record.status = status
            record.finished_at = time.monotonic()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if retry is not None:
                self.send_header("x-should-retry", "true" if retry else "false")
            if retry_after_s is not None:
                self.send_header("retry-after-ms", str(round(retry_after_s * 1000)))
            self.end_headers()
            self.wfile.write(data)

        def _reset(self, record: RecordedRequest) -> None:
            # SO_LINGER with a zero timeout makes close() send RST instead of FIN: the client
            # sees "connection reset by peer" with no answer at all
            record.status = 0
            record.finished_at = time.monotonic()
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

    return Handler


def _tool_calls(calls: Any, index: int) -> list[dict[str, Any]]:
    out = []
    for position, call in enumerate(calls):
        arguments = call.get("arguments", {})
        out.append(
            {
                "id": str(call.get("id") or f"call-{index}-{position}"),
                "type": "function",
                "function": {
                    "name": str(call.get("name", "")),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    return out


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "fake_error", "code": None}}
