"""What a call to the chat model takes and gives back, and how it fails.

The records every other LLM module shares and no module of them owns: the settings of a client
(:class:`LlmSettings`: where the model lives, its timeout, retries, concurrency, the bound on
every answer and the structured output asked for), the two errors of a call
(:class:`LlmNotConfigured`, :class:`LlmCallFailed`), the audit record of every call
(:class:`LlmCallRecord`), the answers (:class:`LlmResult` for ``complete_json``,
:class:`LlmToolsResult` for ``complete_with_tools``), the function-calling vocabulary
(:class:`ToolDefinition`, :class:`LlmToolCall`) and :func:`request_hash`, which identifies a
request by model, messages and response schema. Plain data: nothing here talks to a server.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from planning.core.errors import LlmPlanningError
from planning.core.serialize import canonical_json

__all__ = [
    "DEFAULT_MAX_TOKENS_PER_CALL",
    "RESPONSE_FORMATS",
    "ChatMessage",
    "ConversationMessage",
    "LlmCallFailed",
    "LlmCallRecord",
    "LlmNotConfigured",
    "LlmResult",
    "LlmSettings",
    "LlmToolCall",
    "LlmToolsResult",
    "ResponseFormat",
    "ToolChoice",
    "ToolDefinition",
    "request_hash",
]

type ChatMessage = Mapping[str, str]
# a message of a function-calling conversation: an assistant's `tool_calls` list, a tool's answer
type ConversationMessage = Mapping[str, Any]
type ToolChoice = Literal["auto", "none", "required"]
type ResponseFormat = Literal["json_schema", "json_object"]

RESPONSE_FORMATS: tuple[ResponseFormat, ...] = ("json_schema", "json_object")
DEFAULT_MAX_TOKENS_PER_CALL = 2048


class LlmNotConfigured(LlmPlanningError):
    """No LLM provider is configured (neither a base URL nor an API key)."""

    def __init__(self, purpose: str = "LLM planning", *, lead: str = "") -> None:
        super().__init__(
            (lead or f"{purpose} needs an LLM provider, and this server has none configured.")
            # Read by analysts and officers on the case: the settings are the operator's business
            # (docs/configuration.md), not theirs.
            + " Ask the operator of this server to configure an LLM provider."
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
    for (``json_object`` for servers without ``json_schema`` support); `temperature`, when set,
    goes with every request (0 makes a local server's answers repeatable).
    """

    api_key: str | None = field(default=None, repr=False)
    base_url: str | None = None
    model: str
    timeout_s: float
    max_retries: int
    max_concurrency: int
    max_tokens_per_call: int = DEFAULT_MAX_TOKENS_PER_CALL
    response_format: ResponseFormat = "json_schema"
    # sampling temperature sent with every request; None sends none (the server's default)
    temperature: float | None = None

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
        if self.temperature is not None and not 0 <= self.temperature <= 2:
            raise ValueError("temperature must be between 0 and 2")
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
