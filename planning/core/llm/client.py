"""The one module that talks to an OpenAI-compatible chat model.

Nothing else in CaseHub imports ``openai`` or knows about HTTP to the model. Settings come from
the environment (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``, ``CASEHUB_LLM_MODEL``, optionally
``CASEHUB_LLM_TIMEOUT_S`` and ``CASEHUB_LLM_MAX_RETRIES``); every call has an explicit timeout and
a bounded number of transport retries, asks for JSON-schema structured output (Chat Completions,
``strict``), re-validates the answer with pydantic and reports a :class:`LlmCallRecord` of every
call, successful or not, to the ``on_call`` hook so the caller can audit it.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletion
from pydantic import BaseModel, ValidationError

from planning.core.errors import LlmPlanningError

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_MODEL",
    "DEFAULT_TIMEOUT_S",
    "ChatMessage",
    "LlmCallRecord",
    "LlmClient",
    "LlmNotConfigured",
    "LlmResult",
    "LlmSettings",
    "extract_json",
    "format_validation_error",
    "jsonable",
    "parse_response",
    "request_hash",
    "strict_json_schema",
]

DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_RETRIES = 2
_OPENAI_BASE_URL = "https://api.openai.com/v1"
# Local OpenAI-compatible servers (vLLM, Ollama, llama.cpp) ignore the key but the SDK wants one.
_PLACEHOLDER_KEY = "not-needed"

type ChatMessage = Mapping[str, str]


class LlmNotConfigured(LlmPlanningError):
    """No LLM provider is configured (neither a base URL nor an API key)."""

    def __init__(self, purpose: str = "LLM planning") -> None:
        super().__init__(
            f"{purpose} needs an LLM provider, and none is configured. Set OPENAI_API_KEY "
            "(for OpenAI) or OPENAI_BASE_URL (for any OpenAI-compatible server: Azure, vLLM, "
            "Ollama, llama.cpp; add OPENAI_API_KEY if it needs one), and CASEHUB_LLM_MODEL "
            f"to choose the model (default {DEFAULT_MODEL!r})."
        )


def _env_float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from exc
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {raw!r}")
    return value


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from exc
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmSettings:
    """Where the model lives and how patiently to call it."""

    api_key: str | None = field(default=None, repr=False)
    base_url: str | None = None
    model: str = DEFAULT_MODEL
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_retries: int = DEFAULT_MAX_RETRIES

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if not 0 <= self.max_retries <= 10:
            raise ValueError("max_retries must be between 0 and 10")
        if not self.model.strip():
            raise ValueError("model must not be empty")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> LlmSettings:
        """Read the settings from an environment mapping; raise ValueError on malformed numbers."""
        return cls(
            api_key=environ.get("OPENAI_API_KEY", "").strip() or None,
            base_url=environ.get("OPENAI_BASE_URL", "").strip() or None,
            model=environ.get("CASEHUB_LLM_MODEL", "").strip() or DEFAULT_MODEL,
            timeout_s=_env_float(environ, "CASEHUB_LLM_TIMEOUT_S", DEFAULT_TIMEOUT_S),
            max_retries=_env_int(environ, "CASEHUB_LLM_MAX_RETRIES", DEFAULT_MAX_RETRIES),
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
    messages: tuple[Mapping[str, str], ...]
    response_text: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    started_at: float  # Unix time
    error: str | None = None  # transport error, or why the answer did not validate

    @property
    def total_tokens(self) -> int:
        """Return prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def prompt_hash(self) -> str:
        """Return the SHA-256 of the canonical JSON of the messages."""
        return _sha256(_canonical([dict(m) for m in self.messages]))

    @property
    def response_hash(self) -> str:
        """Return the SHA-256 of the response text."""
        return hashlib.sha256(self.response_text.encode()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmResult[T: BaseModel]:
    """The answer to one call: raw text, the validated object or the validation error, usage."""

    call_id: str
    model: str
    request_hash: str
    text: str
    parsed: T | None
    validation_error: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float

    @property
    def is_valid(self) -> bool:
        """Tell whether the text parsed and validated against the response model."""
        return self.parsed is not None

    @property
    def total_tokens(self) -> int:
        """Return prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


def jsonable(value: Any) -> Any:
    """Convert what `json` cannot serialise (read-only mappings, sets) to plain JSON values."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return str(value)


def _canonical(value: Any) -> str:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=jsonable
    )


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def request_hash(
    model: str,
    messages: Sequence[ChatMessage],
    schema_name: str,
    json_schema: Mapping[str, Any],
) -> str:
    """Return the SHA-256 identifying a request: model, messages and response schema."""
    return _sha256(
        _canonical(
            {
                "model": model,
                "messages": [dict(m) for m in messages],
                "schema_name": schema_name,
                "schema": json_schema,
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


def format_validation_error(error: ValidationError) -> str:
    """Render a pydantic ValidationError as short lines: location, message."""
    lines = []
    for item in error.errors(include_url=False, include_input=False):
        location = ".".join(str(part) for part in item.get("loc", ())) or "(root)"
        lines.append(f"- {location}: {item.get('msg', 'invalid')}")
    return f"{error.error_count()} validation error(s):\n" + "\n".join(lines)


def parse_response[T: BaseModel](text: str, model: type[T]) -> tuple[T | None, str | None]:
    """Parse and validate a model's answer; return the object, or None and the error text."""
    try:
        data = extract_json(text)
    except ValueError as exc:
        return None, str(exc)
    try:
        return model.model_validate(data), None
    except ValidationError as exc:
        return None, format_validation_error(exc)


# -- the client ---------------------------------------------------------------------------------


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
    ) -> None:
        """Build a client for the configured provider; raise LlmNotConfigured without one."""
        settings.require_configured()
        self.settings = settings
        self.on_call = on_call
        self._lock = threading.Lock()
        self._calls = 0
        self._closed = False
        self._openai = openai.OpenAI(
            api_key=settings.api_key or _PLACEHOLDER_KEY,
            base_url=settings.base_url or _OPENAI_BASE_URL,
            timeout=settings.timeout_s,
            max_retries=settings.max_retries,
        )

    @property
    def model(self) -> str:
        """Return the model name sent with every request."""
        return self.settings.model

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

    def complete_json[T: BaseModel](
        self,
        messages: Sequence[ChatMessage],
        response_model: type[T],
        *,
        schema_name: str,
        json_schema: Mapping[str, Any] | None = None,
        call_id: str = "",
    ) -> LlmResult[T]:
        """Ask for a JSON answer matching ``json_schema`` and validate it with ``response_model``.

        ``json_schema`` defaults to the strict form of ``response_model``'s schema; pass another
        to offer the model less than the validator accepts. A malformed or invalid answer is
        returned with ``validation_error`` set, for the caller to repair. Raises LlmPlanningError
        when the call itself fails after the bounded retries (timeout, connection, HTTP error).
        """
        schema = (
            dict(json_schema) if json_schema is not None else strict_json_schema(response_model)
        )
        digest = self.request_hash(messages, schema_name, schema)
        if self._closed:
            raise LlmPlanningError("the LLM client is closed")
        with self._lock:
            self._calls += 1
            label = call_id or f"call-{self._calls}"
        started_at = time.time()
        started = time.perf_counter()
        try:
            # `post` is the SDK's own request path (retries, timeout, errors, typed result)
            # without `chat.completions.create`'s parameter transform, which walks every
            # optional field on each call and was the largest CPU cost of concurrent planning
            completion = self._openai.post(
                "/chat/completions",
                cast_to=ChatCompletion,
                body={
                    "model": self.model,
                    "messages": [dict(m) for m in messages],
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": schema_name, "schema": schema, "strict": True},
                    },
                },
                options={"timeout": self.settings.timeout_s},
            )
        except openai.OpenAIError as exc:
            latency = time.perf_counter() - started
            error = f"LLM call to model {self.model!r} failed: {_describe(exc)}"
            self._report(label, schema_name, digest, messages, "", 0, 0, latency, started_at, error)
            raise LlmPlanningError(error) from exc
        latency = time.perf_counter() - started
        text = completion.choices[0].message.content or "" if completion.choices else ""
        usage = completion.usage
        prompt_tokens = usage.prompt_tokens if usage is not None else 0
        completion_tokens = usage.completion_tokens if usage is not None else 0
        parsed, validation_error = parse_response(text, response_model)
        self._report(
            label,
            schema_name,
            digest,
            messages,
            text,
            prompt_tokens,
            completion_tokens,
            latency,
            started_at,
            validation_error,
        )
        return LlmResult(
            call_id=label,
            model=self.model,
            request_hash=digest,
            text=text,
            parsed=parsed,
            validation_error=validation_error,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_s=latency,
        )

    def _report(
        self,
        call_id: str,
        schema_name: str,
        digest: str,
        messages: Sequence[ChatMessage],
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


def _describe(exc: openai.OpenAIError) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return "the request timed out"
    if isinstance(exc, openai.APIConnectionError):
        return "could not connect to the server"
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code}: {exc.message}"
    return str(exc)
