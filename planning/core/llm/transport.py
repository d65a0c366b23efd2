"""The one module that talks to an OpenAI-compatible chat model over HTTP.

Nothing else in CaseHub imports ``openai`` or knows about HTTP to the model. A
:class:`ChatTransport` holds the SDK's client for one :class:`LlmSettings`: an explicit timeout,
a bounded number of transport retries (the SDK's own), and a connection pool that keeps a
connection alive for every call that may be in flight at once (``max_concurrency``). It builds
the request body, posts it and parses the reply into the part of a chat completion the client
reads (`planning.core.llm.structured_output.Completion`).

Every request bounds its answer (``max_tokens``, or ``max_completion_tokens`` for a server that
refuses the former and names the latter, as OpenAI's reasoning models do). Structured output
steps down, once per transport, when the server refuses a form of it: strict ``json_schema``
first; then ``json_object`` carrying the schema in ``response_format.schema`` (the form
llama.cpp's servers turn into a grammar) and in the system prompt; then plain ``json_object``
with the schema in the system prompt only. ``response_format="json_object"`` starts at the second
form.

A failed call raises one of :data:`CALL_ERRORS`; :func:`describe` words it (a refused request,
HTTP 4xx, with the server's own message, :func:`server_message`) and :func:`is_transient` tells
whether a retry later may help. :meth:`ChatTransport.start_span` and :func:`end_span` trace a
call as an OpenTelemetry client span (GenAI semantic conventions) when tracing is on; without
the OpenTelemetry API no call makes a span.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx2
import openai

try:  # tracing is optional: without the OpenTelemetry API no call makes a span
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - the API comes with the `otel` extra
    _trace = None  # type: ignore[assignment]
from pydantic import ValidationError

from planning.core.llm.records import ConversationMessage, LlmSettings, ResponseFormat
from planning.core.llm.structured_output import Completion, Usage, with_schema_in_prompt

__all__ = [
    "CALL_ERRORS",
    "TRACER_NAME",
    "ChatTransport",
    "describe",
    "end_span",
    "is_transient",
    "server_message",
]

_OPENAI_BASE_URL = "https://api.openai.com/v1"
# Local OpenAI-compatible servers (vLLM, Ollama, llama.cpp) ignore the key but the SDK wants one.
_PLACEHOLDER_KEY = "not-needed"

# the instrumentation scope of the call spans: the LLM client's, whose calls they trace
TRACER_NAME = "planning.core.llm.client"
# the forms of structured output, strongest first; a refusal steps down to the next
_JSON_SCHEMA, _JSON_OBJECT_WITH_SCHEMA, _JSON_OBJECT = range(3)
# how much of a refused request's server message is kept in the error (servers quote the prompt)
_SERVER_MESSAGE_CHARS = 500
# words in a refusal that say the server cannot do json_schema output (llama.cpp, Ollama, vLLM,
# LM Studio and proxies word it differently; all name the field or the feature)
_SCHEMA_REFUSAL = re.compile(r"json_schema|response_format|response format|schema|grammar", re.I)

# what a failed call raises: the SDK's errors, or a reply that is not a chat completion
CALL_ERRORS: tuple[type[openai.OpenAIError], type[ValidationError]] = (
    openai.OpenAIError,
    ValidationError,
)


class ChatTransport:
    """Post chat completion requests for one client's settings; thread-safe.

    `form` is the form of structured output the next request asks for; it is lowered, for good,
    when the server refuses one.
    """

    def __init__(self, settings: LlmSettings) -> None:
        """Open the connection pool for the settings' provider (no request is made yet)."""
        self.settings = settings
        self._lock = threading.Lock()
        # the form of structured output the next request asks for; lowered when one is refused
        self.form = _JSON_OBJECT_WITH_SCHEMA if settings.response_format == "json_object" else 0
        # OpenAI's reasoning models refuse max_tokens and want max_completion_tokens instead
        self._bound_key = "max_tokens"
        pool = settings.max_concurrency
        self._openai = openai.OpenAI(
            api_key=settings.api_key or _PLACEHOLDER_KEY,
            base_url=settings.base_url or _OPENAI_BASE_URL,
            timeout=settings.timeout_s,
            max_retries=settings.max_retries,
            http_client=openai.DefaultHttpxClient(
                limits=httpx2.Limits(max_connections=pool, max_keepalive_connections=pool)
            ),
        )

    @property
    def model(self) -> str:
        """Return the model name sent with every request."""
        return self.settings.model

    @property
    def response_format(self) -> ResponseFormat:
        """Return the structured output the next request asks for."""
        return "json_schema" if self.form == _JSON_SCHEMA else "json_object"

    def close(self) -> None:
        """Close the HTTP connections."""
        self._openai.close()

    def body(
        self,
        messages: Sequence[ConversationMessage],
        schema_name: str,
        schema: Mapping[str, Any] | None,
        max_tokens: int,
        form: int,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Return the request body asking for `form` of structured output, and its messages.

        With no `schema`, any JSON object will do. The messages are the caller's, with the schema
        in the system prompt for the forms the server does not enforce strictly.
        """
        format_: dict[str, Any]
        if schema is None:
            # any JSON object will do: there is no schema to enforce, only the object itself
            sent = [dict(m) for m in messages]
            format_ = {"type": "json_object"}
        elif form == _JSON_SCHEMA:
            sent = [dict(m) for m in messages]
            format_ = {
                "type": "json_schema",
                "json_schema": {"name": schema_name, "schema": dict(schema), "strict": True},
            }
        else:
            sent = with_schema_in_prompt(messages, schema_name, schema)
            format_ = {"type": "json_object"}
            if form == _JSON_OBJECT_WITH_SCHEMA:
                format_["schema"] = dict(schema)
        body = {
            "model": self.model,
            "messages": sent,
            self._bound_key: max_tokens,
            "response_format": format_,
        }
        if self.settings.temperature is not None:
            body["temperature"] = self.settings.temperature
        return body, sent

    def exchange(
        self,
        build: Callable[[int], tuple[dict[str, Any], list[dict[str, Any]]]],
        sent: list[dict[str, Any]],
    ) -> Completion:
        """Post the request `build(form)` makes, stepping down on a refusal; parse the answer.

        `sent` is filled with the messages of the last request (also when the call fails, for the
        record). Raises one of CALL_ERRORS: openai.OpenAIError or pydantic.ValidationError.
        """
        form = self.form
        while True:
            body, messages = build(form)
            sent[:] = messages
            try:
                raw = self._post(body)
                break
            except openai.APIStatusError as exc:
                if self._bound_key == "max_tokens" and _wants_completion_tokens(exc):
                    self._bound_key = "max_completion_tokens"
                elif form < _JSON_OBJECT and _refuses_structured_output(exc):
                    # the server cannot do this form of structured output: ask again, and
                    # from now on, with the next weaker one (validated the same way)
                    form += 1
                    with self._lock:
                        self.form = max(self.form, form)
                else:
                    raise
        return Completion.model_validate_json(raw)

    def start_span(self, schema_name: str, max_tokens: int) -> Any:
        """Start the call's client span (GenAI semantic conventions), or None while tracing is
        off (no tracer provider installed, or no OpenTelemetry API)."""
        if _trace is None or isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider):
            return None
        url = httpx2.URL(self.settings.base_url or _OPENAI_BASE_URL)
        # Never the prompt or the answer: they hold case data (the LlmCall rows keep them).
        return _trace.get_tracer(TRACER_NAME).start_span(
            f"chat {self.model}",
            kind=_trace.SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.system": "openai",
                "gen_ai.request.model": self.model,
                "gen_ai.request.max_tokens": max_tokens,
                "gen_ai.output.type": "json",
                "server.address": url.host,
                "server.port": url.port or (443 if url.scheme == "https" else 80),
                "casehub.llm.purpose": schema_name,
            },
        )

    def _post(self, body: Mapping[str, Any]) -> bytes:
        # `post` is the SDK's own request path (retries, timeout, errors) without
        # `chat.completions.create`'s parameter transform and typed result, which walk every
        # optional field on each call and were the largest CPU cost of concurrent planning
        return self._openai.post("/chat/completions", cast_to=bytes, body=dict(body))


def end_span(
    span: Any,
    *,
    completion: Completion | None = None,
    finish_reason: str | None = None,
    error: BaseException | None = None,
) -> None:
    """End a call's span with its usage and finish reason, or as failed with the error's type."""
    if span is None:
        return
    if error is not None:
        span.set_attribute("error.type", type(error).__name__)
        span.set_status(_trace.Status(_trace.StatusCode.ERROR, type(error).__name__))
    if completion is not None:
        usage = completion.usage or Usage()
        span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens or 0)
        span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens or 0)
        if completion.model:
            span.set_attribute("gen_ai.response.model", completion.model)
        if finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
    span.end()


def is_transient(exc: openai.OpenAIError | ValidationError) -> bool:
    """Tell whether a failed call may succeed later (timeout, connection, 408/409/429, 5xx)."""
    if isinstance(exc, openai.APITimeoutError | openai.APIConnectionError):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in (408, 409, 429)
    return False


def server_message(exc: openai.APIStatusError) -> str:
    """Return the server's own error message from a refused request, bounded in length."""
    body = exc.body
    message: Any = None
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping):
            message = error.get("message")
        elif isinstance(error, str):
            message = error
        message = message or body.get("message") or body.get("detail")
    elif isinstance(body, str):
        message = body
    if not message:
        try:
            message = exc.response.text
        except Exception:  # a streamed or closed response has no text to read
            message = ""
    text = message if isinstance(message, str) else json.dumps(message, ensure_ascii=False)
    text = " ".join(text.split()) or exc.message
    if len(text) > _SERVER_MESSAGE_CHARS:
        text = text[:_SERVER_MESSAGE_CHARS] + " …"
    return text


def _wants_completion_tokens(exc: openai.APIStatusError) -> bool:
    return exc.status_code == 400 and "max_completion_tokens" in server_message(exc)


def _refuses_structured_output(exc: openai.APIStatusError) -> bool:
    if exc.status_code not in (400, 404, 415, 422, 500, 501):
        return False
    return bool(_SCHEMA_REFUSAL.search(server_message(exc)))


def describe(exc: openai.OpenAIError | ValidationError) -> str:
    """Word why a call failed, for the record and the error the caller sees."""
    if isinstance(exc, ValidationError):
        return "the server's reply is not a chat completion"
    if isinstance(exc, openai.APITimeoutError):
        return "the request timed out"
    if isinstance(exc, openai.APIConnectionError):
        return "could not connect to the server"
    if isinstance(exc, openai.APIStatusError):
        if 400 <= exc.status_code < 500 and exc.status_code not in (408, 409, 429):
            return (
                f"the server refused the request (HTTP {exc.status_code}, not retried): "
                f"{server_message(exc)}"
            )
        return f"HTTP {exc.status_code}: {server_message(exc)}"
    return str(exc)
