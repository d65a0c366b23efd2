"""The one module that talks to an OpenAI-compatible chat model.

Nothing else in CaseHub imports ``openai`` or knows about HTTP to the model. The caller passes
the settings in (:class:`LlmSettings`; the Django side builds them from its settings, which read
the environment). Every call has an explicit timeout and a bounded number of transport retries,
asks for JSON-schema structured output (Chat Completions, ``strict``), re-validates the answer
with the caller's validator and reports a :class:`LlmCallRecord` of every call, successful or
not, to the ``on_call`` hook so the caller can audit it. The connection pool keeps a connection
alive for every call that may be in flight at once (``max_concurrency``). A ``guard``
(`planning.core.llm.budget.CallGuard`) reserves each call's worst case before it is sent, and may
refuse it with `LlmBudgetExhausted`; the call is then settled to its usage.

Every request bounds its answer (``max_tokens``, or ``max_completion_tokens`` for a server that
refuses the former and names the latter, as OpenAI's reasoning models do); an answer the server
cut off at that bound (``finish_reason: "length"``) is reported as truncated and never parsed. A
request the server refuses (HTTP 4xx) is not retried and is reported with the server's own
message.

Structured output steps down, once per client, when the server refuses a form of it: strict
``json_schema`` first; then ``json_object`` carrying the schema in ``response_format.schema`` (the
form llama.cpp's servers turn into a grammar) and in the system prompt; then plain ``json_object``
with the schema in the system prompt only. ``response_format="json_object"`` starts at the second
form. The answer is validated the same way whatever the server enforced.

:meth:`LlmClient.complete_with_tools` is the same call with function calling (``tools``,
``tool_choice``): the answer is either the tool calls the model asks for (name, arguments as the
model wrote them, id) or a final JSON answer validated like ``complete_json``'s. The caller runs
the tools and calls again with their results; the client keeps no conversation of its own.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import httpx2
import openai

try:  # tracing is optional: without the OpenTelemetry API no call makes a span
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - the API comes with the `otel` extra
    _trace = None  # type: ignore[assignment]
from pydantic import BaseModel, ValidationError

from planning.core.errors import LlmPlanningError, flatten_errors
from planning.core.llm.budget import CallEstimate, CallGuard, prompt_bound
from planning.core.serialize import canonical_json

__all__ = [
    "ChatMessage",
    "LlmCallFailed",
    "LlmCallRecord",
    "LlmClient",
    "LlmNotConfigured",
    "LlmResult",
    "LlmSettings",
    "LlmToolCall",
    "LlmToolsResult",
    "ResponseFormat",
    "ToolDefinition",
    "extract_json",
    "format_problems",
    "format_validation_error",
    "parse_response",
    "request_hash",
    "schema_instructions",
    "server_message",
    "strict_json_schema",
    "with_schema_in_prompt",
]

_OPENAI_BASE_URL = "https://api.openai.com/v1"
# Local OpenAI-compatible servers (vLLM, Ollama, llama.cpp) ignore the key but the SDK wants one.
_PLACEHOLDER_KEY = "not-needed"

type ChatMessage = Mapping[str, str]
# a message of a function-calling conversation: an assistant's `tool_calls` list, a tool's answer
type ConversationMessage = Mapping[str, Any]
type ToolChoice = Literal["auto", "none", "required"]
type ResponseFormat = Literal["json_schema", "json_object"]

RESPONSE_FORMATS: tuple[ResponseFormat, ...] = ("json_schema", "json_object")
# the forms of structured output, strongest first; a refusal steps down to the next
_JSON_SCHEMA, _JSON_OBJECT_WITH_SCHEMA, _JSON_OBJECT = range(3)
DEFAULT_MAX_TOKENS_PER_CALL = 2048
# how much of a refused request's server message is kept in the error (servers quote the prompt)
_SERVER_MESSAGE_CHARS = 500
# words in a refusal that say the server cannot do json_schema output (llama.cpp, Ollama, vLLM,
# LM Studio and proxies word it differently; all name the field or the feature)
_SCHEMA_REFUSAL = re.compile(r"json_schema|response_format|response format|schema|grammar", re.I)


class LlmNotConfigured(LlmPlanningError):
    """No LLM provider is configured (neither a base URL nor an API key)."""

    def __init__(self, purpose: str = "LLM planning", *, lead: str = "") -> None:
        super().__init__(
            (lead or f"{purpose} needs an LLM provider, and none is configured.")
            + " An admin sets OPENAI_API_KEY (for OpenAI) or OPENAI_BASE_URL (for any "
            "OpenAI-compatible server: Azure, vLLM, Ollama, llama.cpp; add OPENAI_API_KEY if it "
            "needs one), and CASEHUB_LLM_MODEL to choose the model."
        )


class LlmCallFailed(LlmPlanningError):
    """The call itself failed; `transient` tells a retry later may help (timeout, 429, 5xx)."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmSettings:
    """Where the model lives, how patiently to call it and how many calls may run at once.

    `max_tokens_per_call` bounds every answer; `response_format` is the structured output asked
    for (``json_object`` for servers without ``json_schema`` support).
    """

    api_key: str | None = field(default=None, repr=False)
    base_url: str | None = None
    model: str
    timeout_s: float
    max_retries: int
    max_concurrency: int
    max_tokens_per_call: int = DEFAULT_MAX_TOKENS_PER_CALL
    response_format: ResponseFormat = "json_schema"

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if not 0 <= self.max_retries <= 10:
            raise ValueError("max_retries must be between 0 and 10")
        if not 1 <= self.max_concurrency <= 1024:
            raise ValueError("max_concurrency must be between 1 and 1024")
        if not self.model.strip():
            raise ValueError("model must not be empty")
        if not 16 <= self.max_tokens_per_call <= 1_000_000:
            raise ValueError("max_tokens_per_call must be between 16 and 1000000")
        if self.response_format not in RESPONSE_FORMATS:
            raise ValueError(
                f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, "
                f"not {self.response_format!r}"
            )

    @property
    def is_configured(self) -> bool:
        """Tell whether a provider is configured (a base URL or an API key)."""
        return bool(self.api_key or self.base_url)

    def require_configured(self, purpose: str = "LLM planning") -> None:
        """Raise LlmNotConfigured unless a provider is configured."""
        if not self.is_configured:
            raise LlmNotConfigured(purpose)


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmCallRecord:
    """One call to the model, successful or not, for logging and the audit trail."""

    call_id: str
    model: str
    schema_name: str
    request_hash: str
    messages: tuple[Mapping[str, Any], ...]
    response_text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    started_at: float  # Unix time
    error: str | None = None  # transport error, or why the answer did not validate

    @property
    def prompt_hash(self) -> str:
        """Return the SHA-256 of the canonical JSON of the messages."""
        return _sha256(canonical_json([dict(m) for m in self.messages]))

    @property
    def response_hash(self) -> str:
        """Return the SHA-256 of the response text."""
        return _sha256(self.response_text)


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmResult[T]:
    """The answer to one call: raw text, the validated answer or the validation error, usage."""

    call_id: str
    model: str
    request_hash: str
    text: str
    parsed: T | None
    validation_error: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    truncated: bool = False  # cut off at max_tokens: never parsed, `validation_error` says so
    max_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Return prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolDefinition:
    """A function the model may call: its name, what it does, and its arguments' JSON schema."""

    name: str
    description: str
    parameters: Mapping[str, Any]

    def as_request(self) -> dict[str, Any]:
        """Return the definition in the form Chat Completions takes in ``tools``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmToolCall:
    """One function call the model asks for; `arguments` is the JSON text it wrote, unchecked."""

    id: str
    name: str
    arguments: str

    def as_message(self) -> dict[str, Any]:
        """Return the call as it goes back to the model in the assistant message."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmToolsResult[T]:
    """The answer to a call with tools: the tool calls asked for, or the final validated answer.

    With `tool_calls` set, `parsed` and `validation_error` are None: there is no final answer yet.
    """

    call_id: str
    model: str
    request_hash: str
    text: str
    tool_calls: tuple[LlmToolCall, ...]
    parsed: T | None
    validation_error: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    finish_reason: str = ""
    truncated: bool = False
    max_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Return prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    def assistant_message(self) -> dict[str, Any]:
        """Return the assistant message that carries these tool calls back to the model."""
        return {
            "role": "assistant",
            "content": self.text or None,
            "tool_calls": [call.as_message() for call in self.tool_calls],
        }


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def request_hash(
    model: str,
    messages: Sequence[ConversationMessage],
    schema_name: str,
    json_schema: Mapping[str, Any],
) -> str:
    """Return the SHA-256 identifying a request: model, messages and response schema."""
    return _sha256(
        canonical_json(
            {
                "model": model,
                "messages": [dict(m) for m in messages],
                "schema_name": schema_name,
                "schema": dict(json_schema),
            }
        )
    )


# -- structured output --------------------------------------------------------------------------

_SUBSCHEMA_LIST_KEYS = ("anyOf", "allOf", "prefixItems")
_SUBSCHEMA_KEYS = ("items", "not", "additionalProperties")
_DROPPED_KEYS = frozenset({"default", "title", "discriminator"})


def _strict(node: Any) -> Any:
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "oneOf":  # strict mode knows anyOf only; pydantic validates exclusivity itself
            out["anyOf"] = [_strict(v) for v in value]
        elif key in _SUBSCHEMA_LIST_KEYS:
            out[key] = [_strict(v) for v in value]
        elif key in _SUBSCHEMA_KEYS and isinstance(value, Mapping):
            out[key] = _strict(value)
        elif key in ("properties", "$defs"):
            out[key] = {name: _strict(sub) for name, sub in value.items()}
        else:
            out[key] = value
    if out.get("type") == "object" or "properties" in out:
        properties: dict[str, Any] = out.setdefault("properties", {})
        required = set(node.get("required", ()))
        for name, sub in list(properties.items()):
            if name not in required and not _accepts_null(sub):
                # strict mode wants every property required; optional ones become nullable
                properties[name] = {"anyOf": [sub, {"type": "null"}]}
        out["required"] = list(properties)
        out["additionalProperties"] = False
    return out


def _accepts_null(schema: Any) -> bool:
    if not isinstance(schema, Mapping):
        return False
    if schema.get("type") == "null":
        return True
    return any(_accepts_null(option) for option in schema.get("anyOf", ()))


def strict_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Return the model's JSON schema in the form OpenAI's strict structured output accepts."""
    return cast(dict[str, Any], _strict(model.model_json_schema()))


_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\r?\n?(.*?)```", re.DOTALL)


def extract_json(text: str) -> Any:
    """Parse JSON from a model's answer, tolerating a surrounding ``` code fence.

    Raises ValueError (with the parser's position) when no JSON can be read.
    """
    candidate = text.strip()
    if not candidate:
        raise ValueError("the response was empty; expected a JSON object")
    match = _FENCE.search(candidate)
    if match is not None:
        candidate = match.group(1).strip()
    try:
        return json.loads(candidate)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"the response is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from exc


def format_problems(problems: Mapping[str, Sequence[str]]) -> str:
    """Render problems by location (``flatten_errors`` output) as short lines: location, message."""
    lines = [f"- {path}: {message}" for path, messages in problems.items() for message in messages]
    return f"{len(lines)} validation error(s):\n" + "\n".join(lines)


def format_validation_error(error: ValidationError) -> str:
    """Render a pydantic ValidationError as short lines: location, message."""
    return format_problems(flatten_errors(error.errors(include_url=False, include_input=False)))


def parse_response[T](text: str, validate: Callable[[Any], T]) -> tuple[T | None, str | None]:
    """Parse a model's answer and validate it; return the answer, or None and the error text.

    `validate` takes the decoded JSON and returns the answer or raises ValueError (a pydantic
    ValidationError is one) saying what is wrong.
    """
    try:
        return validate(extract_json(text)), None
    except ValidationError as exc:
        return None, format_validation_error(exc)
    except ValueError as exc:
        return None, str(exc)


# -- the client ---------------------------------------------------------------------------------


class _Function(BaseModel):
    name: str = ""
    arguments: str | dict[str, Any] | None = None  # JSON text; some servers send the object


class _ToolCall(BaseModel):
    id: str | None = None
    function: _Function = _Function()


class _Message(BaseModel):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(BaseModel):
    message: _Message
    finish_reason: str | None = None


class _Usage(BaseModel):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Completion(BaseModel):
    """The part of a chat completion the client reads (the SDK's full model costs more CPU)."""

    choices: list[_Choice] = []
    usage: _Usage | None = None
    model: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class _Reply:
    """A completed call's answer as the server sent it, before the caller reads it."""

    choice: _Choice | None
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float

    @property
    def truncated(self) -> bool:
        """Tell whether the answer was cut off at its token bound."""
        return self.finish_reason == "length"


@dataclass(frozen=True, slots=True)
class _Reading[R]:
    """What a caller made of a reply: its value, the response text to record, the error."""

    value: R
    record_text: str
    error: str | None


def schema_instructions(schema_name: str, json_schema: Mapping[str, Any]) -> str:
    """Return the system-prompt text that carries the schema when the server cannot enforce it."""
    return (
        f"Your answer must be one JSON object (named {schema_name!r}) that matches this JSON "
        "schema exactly: every property it lists, no others.\n"
        + json.dumps(json_schema, separators=(",", ":"), ensure_ascii=False)
    )


def with_schema_in_prompt(
    messages: Sequence[ConversationMessage], schema_name: str, json_schema: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Return the messages with the schema appended to the system message (or one added)."""
    text = schema_instructions(schema_name, json_schema)
    out = [dict(m) for m in messages]
    for message in out:
        if message.get("role") == "system":
            message["content"] = f"{message.get('content', '')}\n\n{text}"
            return out
    return [{"role": "system", "content": text}, *out]


class LlmClient:
    """Call a chat model for JSON answers; report every call to ``on_call``.

    Safe to share between threads: the underlying HTTP client is thread-safe and the hook may be
    called from several threads at once.
    """

    def __init__(
        self,
        settings: LlmSettings,
        *,
        on_call: Callable[[LlmCallRecord], None] | None = None,
        guard: CallGuard | None = None,
    ) -> None:
        """Build a client for the configured provider; raise LlmNotConfigured without one.

        `guard`, when given, reserves every call's worst case before it is made (and may refuse
        it with LlmBudgetExhausted), then settles it to the call's usage.
        """
        settings.require_configured()
        self.settings = settings
        self.on_call = on_call
        self.guard = guard
        self._lock = threading.Lock()
        self._calls = 0
        self._closed = False
        # the form of structured output the next request asks for; lowered when one is refused
        self._form = _JSON_OBJECT_WITH_SCHEMA if settings.response_format == "json_object" else 0
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
        return "json_schema" if self._form == _JSON_SCHEMA else "json_object"

    def request_hash(
        self, messages: Sequence[ChatMessage], schema_name: str, json_schema: Mapping[str, Any]
    ) -> str:
        """Return the hash identifying this request for this client's model."""
        return request_hash(self.model, messages, schema_name, json_schema)

    def close(self) -> None:
        """Close the HTTP connections; later calls raise LlmPlanningError."""
        self._closed = True
        self._openai.close()

    def __enter__(self) -> LlmClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _body(
        self,
        messages: Sequence[ConversationMessage],
        schema_name: str,
        schema: Mapping[str, Any] | None,
        max_tokens: int,
        form: int,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
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
        return body, sent

    def _exchange(
        self,
        build: Callable[[int], tuple[dict[str, Any], list[dict[str, Any]]]],
        sent: list[dict[str, Any]],
    ) -> _Completion:
        """Post the request `build(form)` makes, stepping down on a refusal; parse the answer.

        `sent` is filled with the messages of the last request (also when the call fails, for the
        record). Raises openai.OpenAIError or pydantic.ValidationError.
        """
        form = self._form
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
                        self._form = max(self._form, form)
                else:
                    raise
        return _Completion.model_validate_json(raw)

    def _begin(self, call_id: str, max_tokens: int | None) -> tuple[str, int]:
        if self._closed:
            raise LlmPlanningError("the LLM client is closed")
        ceiling = self.settings.max_tokens_per_call
        bound = ceiling if max_tokens is None else max(1, min(max_tokens, ceiling))
        with self._lock:
            self._calls += 1
            label = call_id or f"call-{self._calls}"
        return label, bound

    def _reserve(self, body: Callable[[], Mapping[str, Any]], purpose: str, bound: int) -> object:
        """Reserve the call's worst case with the guard; return its ticket (None: no guard).

        Raises LlmBudgetExhausted when the guard refuses the call.
        """
        if self.guard is None:
            return None
        settings = self.settings
        one_try = settings.timeout_s * (settings.max_retries + 1) + 8 * settings.max_retries
        return self.guard.reserve(
            CallEstimate(
                model=self.model,
                purpose=purpose,
                prompt_tokens=prompt_bound(body()),
                completion_tokens=bound,
                # a refused form of structured output or token bound is asked again (up to 4)
                expires_in_s=4 * one_try,
            )
        )

    def _settle(self, ticket: object, prompt_tokens: int, completion_tokens: int) -> None:
        if self.guard is not None:
            self.guard.settle(
                ticket, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
            )

    def _release(self, ticket: object) -> None:
        if self.guard is not None:
            self.guard.release(ticket)

    def complete_json[T](
        self,
        messages: Sequence[ChatMessage],
        validate: Callable[[Any], T],
        *,
        schema_name: str,
        json_schema: Mapping[str, Any],
        call_id: str = "",
        digest: str = "",
        max_tokens: int | None = None,
    ) -> LlmResult[T]:
        """Ask for a JSON answer matching ``json_schema`` and check it with ``validate``.

        ``validate`` takes the decoded JSON and returns the answer or raises ValueError; it may
        accept less than the schema allows or check what no schema can. ``digest`` is this
        request's hash when the caller already computed it. ``max_tokens`` bounds the answer
        (never above the per-call ceiling of the settings). A malformed, invalid or truncated
        answer is returned with ``validation_error`` set, for the caller to repair. Raises
        LlmPlanningError when the call itself fails: after the bounded retries of a timeout,
        connection or server error, or at once when the server refuses the request (HTTP 4xx).
        """
        schema = dict(json_schema)
        digest = digest or self.request_hash(messages, schema_name, schema)
        label, bound = self._begin(call_id, max_tokens)

        def read(reply: _Reply) -> _Reading[T | None]:
            if reply.truncated:
                # a cut-off answer is never parsed: its JSON error would blame the model's syntax
                return _Reading(None, reply.text, _truncation_error(bound, len(reply.text)))
            parsed, error = parse_response(reply.text, validate)
            return _Reading(parsed, reply.text, error)

        reply, reading = self._call(
            messages,
            lambda form: self._body(messages, schema_name, schema, bound, form),
            read,
            label=label,
            bound=bound,
            schema_name=schema_name,
            digest=digest,
        )
        return LlmResult(
            call_id=label,
            model=self.model,
            request_hash=digest,
            text=reply.text,
            parsed=reading.value,
            validation_error=reading.error,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            latency_s=reply.latency_s,
            truncated=reply.truncated,
            max_tokens=bound,
        )

    def complete_with_tools[T](
        self,
        messages: Sequence[ConversationMessage],
        validate: Callable[[Any], T],
        *,
        tools: Sequence[ToolDefinition],
        schema_name: str,
        json_schema: Mapping[str, Any] | None,
        tool_choice: ToolChoice = "auto",
        call_id: str = "",
        max_tokens: int | None = None,
    ) -> LlmToolsResult[T]:
        """Ask for tool calls or a final JSON answer, offering only ``tools``.

        ``messages`` may carry earlier rounds (assistant messages with ``tool_calls``, ``tool``
        messages with their results). The final answer is asked for like ``complete_json``'s:
        matching ``json_schema``, or any JSON object when it is None, then checked with
        ``validate``. Tool calls come back as the model wrote them: the caller checks that each is
        one it offered and validates the arguments. Same timeout, retries, ``max_tokens`` bound
        and ``on_call`` record as ``complete_json`` (the record's response is the content, or the
        tool calls as JSON). Raises LlmCallFailed when the call itself fails (``transient`` after
        the bounded retries of a timeout, reset, 429 or 5xx; not transient for a refusal, HTTP 4xx).
        """
        schema = None if json_schema is None else dict(json_schema)
        offered = [tool.as_request() for tool in tools]
        digest = request_hash(
            self.model,
            messages,
            schema_name,
            {"response": schema or {}, "tools": offered, "tool_choice": tool_choice},
        )
        label, bound = self._begin(call_id, max_tokens)

        def build(form: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            body, messages_sent = self._body(messages, schema_name, schema, bound, form)
            if offered:  # servers refuse an empty list of tools
                body["tools"] = offered
                body["tool_choice"] = tool_choice
            return body, messages_sent

        def read(reply: _Reply) -> _Reading[tuple[tuple[LlmToolCall, ...], T | None]]:
            if reply.truncated:
                # cut off: neither a final answer nor tool calls whose arguments may be whole
                return _Reading(((), None), reply.text, _truncation_error(bound, len(reply.text)))
            choice = reply.choice
            calls = _tool_calls(choice.message.tool_calls or []) if choice is not None else ()
            if not calls:
                parsed, error = parse_response(reply.text, validate)
                return _Reading(((), parsed), reply.text, error)
            record = canonical_json(
                {
                    "content": reply.text,
                    "tool_calls": [
                        {"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls
                    ],
                }
            )
            return _Reading((calls, None), record, None)

        reply, reading = self._call(
            messages,
            build,
            read,
            label=label,
            bound=bound,
            schema_name=schema_name,
            digest=digest,
        )
        calls, parsed = reading.value
        return LlmToolsResult(
            call_id=label,
            model=self.model,
            request_hash=digest,
            text=reply.text,
            tool_calls=calls,
            parsed=parsed,
            validation_error=reading.error,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            latency_s=reply.latency_s,
            finish_reason=reply.finish_reason,
            truncated=reply.truncated,
            max_tokens=bound,
        )

    def _call[R](
        self,
        messages: Sequence[ConversationMessage],
        build: Callable[[int], tuple[dict[str, Any], list[dict[str, Any]]]],
        read: Callable[[_Reply], _Reading[R]],
        *,
        label: str,
        bound: int,
        schema_name: str,
        digest: str,
    ) -> tuple[_Reply, _Reading[R]]:
        """Reserve the call with the guard, send it, record it, settle it to its usage.

        `build(form)` makes the request body (and the messages it sends) for a form of structured
        output; `read` makes of the reply what the caller returns, the response text to record
        and the validation error. Return the reply and what `read` made of it. Raises
        LlmBudgetExhausted when the guard refuses the call, and LlmCallFailed when the call
        itself fails (recorded, and settled as a call that used no tokens).
        """
        sent: list[dict[str, Any]] = [dict(m) for m in messages]
        ticket = self._reserve(lambda: build(self._form)[0], schema_name, bound)
        started_at = time.time()
        started = time.perf_counter()
        span = self._start_span(schema_name, bound)
        try:
            completion = self._exchange(build, sent)
        except (openai.OpenAIError, ValidationError) as exc:
            _end_span(span, error=exc)
            latency = time.perf_counter() - started
            error = f"LLM call to model {self.model!r} failed: {_describe(exc)}"
            self._report(label, schema_name, digest, sent, "", 0, 0, latency, started_at, error)
            self._settle(ticket, 0, 0)  # made and failed: a call that used no tokens
            raise LlmCallFailed(error, transient=_is_transient(exc)) from exc
        except BaseException:
            self._release(ticket)
            raise
        latency = time.perf_counter() - started
        choice = completion.choices[0] if completion.choices else None
        finish_reason = (choice.finish_reason or "") if choice is not None else ""
        _end_span(span, completion=completion, finish_reason=finish_reason or None)
        usage = completion.usage or _Usage()
        reply = _Reply(
            choice=choice,
            text=(choice.message.content or "") if choice is not None else "",
            finish_reason=finish_reason,
            prompt_tokens=usage.prompt_tokens or 0,
            completion_tokens=usage.completion_tokens or 0,
            latency_s=latency,
        )
        reading = read(reply)
        self._report(
            label,
            schema_name,
            digest,
            sent,
            reading.record_text,
            reply.prompt_tokens,
            reply.completion_tokens,
            latency,
            started_at,
            reading.error,
        )
        # counted once it is in the record: a failing ledger loses no call of the trail
        self._settle(ticket, reply.prompt_tokens, reply.completion_tokens)
        return reply, reading

    def _start_span(self, schema_name: str, max_tokens: int) -> Any:
        """Start the call's client span (GenAI semantic conventions), or None while tracing is
        off (no tracer provider installed, or no OpenTelemetry API)."""
        if _trace is None or isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider):
            return None
        url = httpx2.URL(self.settings.base_url or _OPENAI_BASE_URL)
        # Never the prompt or the answer: they hold case data (the LlmCall rows keep them).
        return _trace.get_tracer(__name__).start_span(
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

    def _report(
        self,
        call_id: str,
        schema_name: str,
        digest: str,
        messages: Sequence[ConversationMessage],
        text: str,
        prompt_tokens: int,
        completion_tokens: int,
        latency: float,
        started_at: float,
        error: str | None,
    ) -> None:
        if self.on_call is None:
            return
        self.on_call(
            LlmCallRecord(
                call_id=call_id,
                model=self.model,
                schema_name=schema_name,
                request_hash=digest,
                messages=tuple(dict(m) for m in messages),
                response_text=text,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                latency_s=latency,
                started_at=started_at,
                error=error,
            )
        )


def _end_span(
    span: Any,
    *,
    completion: _Completion | None = None,
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
        usage = completion.usage or _Usage()
        span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens or 0)
        span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens or 0)
        if completion.model:
            span.set_attribute("gen_ai.response.model", completion.model)
        if finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
    span.end()


def _tool_calls(raw: Sequence[_ToolCall]) -> tuple[LlmToolCall, ...]:
    calls = []
    for position, call in enumerate(raw):
        arguments = call.function.arguments
        text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        # a server that gives no id still needs one per call: the tool answers refer to it
        calls.append(
            LlmToolCall(id=call.id or f"call-{position}", name=call.function.name, arguments=text)
        )
    return tuple(calls)


def _is_transient(exc: openai.OpenAIError | ValidationError) -> bool:
    """Tell whether a failed call may succeed later (timeout, connection, 408/409/429, 5xx)."""
    if isinstance(exc, openai.APITimeoutError | openai.APIConnectionError):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in (408, 409, 429)
    return False


def _truncation_error(max_tokens: int, chars: int) -> str:
    return (
        f"the answer was cut off at the limit of {max_tokens} tokens (finish_reason 'length') "
        f"after {chars} characters, before the JSON was complete"
    )


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


def _describe(exc: openai.OpenAIError | ValidationError) -> str:
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
