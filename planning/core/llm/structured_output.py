"""Structured output both ways: the schema a request asks for, and reading the answer back.

Going out: :func:`strict_json_schema` turns a pydantic model's schema into the form OpenAI's
strict ``json_schema`` output accepts, and :func:`with_schema_in_prompt` carries a schema in the
system prompt for a server that cannot enforce it. Coming back: :class:`Completion` is the part
of a chat completion the client reads (parsed without the SDK's typed model, which costs more
CPU), :func:`tool_calls_of` reads the function calls the model asks for, :func:`extract_json`
and :func:`parse_response` decode and validate a JSON answer (tolerating a code fence), and
:func:`format_problems` / :func:`format_validation_error` / :func:`truncation_error` word what
is wrong with an answer for the model to repair. Pure functions: nothing here talks to a server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from pydantic import BaseModel, ValidationError

from planning.core.errors import flatten_errors
from planning.core.llm.records import ConversationMessage, LlmToolCall

__all__ = [
    "Choice",
    "Completion",
    "Usage",
    "WireToolCall",
    "extract_json",
    "format_problems",
    "format_validation_error",
    "parse_response",
    "schema_instructions",
    "strict_json_schema",
    "tool_calls_of",
    "truncation_error",
    "with_schema_in_prompt",
]

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


def truncation_error(max_tokens: int, chars: int) -> str:
    """Say that an answer was cut off at its token bound, for the record and the repair prompt."""
    return (
        f"the answer was cut off at the limit of {max_tokens} tokens (finish_reason 'length') "
        f"after {chars} characters, before the JSON was complete"
    )


# -- the chat completion, as the server sends it ----------------------------------------------


class _Function(BaseModel):
    name: str = ""
    arguments: str | dict[str, Any] | None = None  # JSON text; some servers send the object


class WireToolCall(BaseModel):
    """One function call as the server sends it (OpenAI-compatible servers differ in detail)."""

    id: str | None = None
    function: _Function = _Function()


class _Message(BaseModel):
    content: str | None = None
    tool_calls: list[WireToolCall] | None = None


class Choice(BaseModel):
    """One choice of a chat completion: the message and why the model stopped."""

    message: _Message
    finish_reason: str | None = None


class Usage(BaseModel):
    """The tokens a call used, as far as the server reports them."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class Completion(BaseModel):
    """The part of a chat completion the client reads (the SDK's full model costs more CPU)."""

    choices: list[Choice] = []
    usage: Usage | None = None
    model: str | None = None


def tool_calls_of(raw: Sequence[WireToolCall]) -> tuple[LlmToolCall, ...]:
    """Return the function calls the model asks for, each with an id (made up when missing)."""
    calls = []
    for position, call in enumerate(raw):
        arguments = call.function.arguments
        text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        # a server that gives no id still needs one per call: the tool answers refer to it
        calls.append(
            LlmToolCall(id=call.id or f"call-{position}", name=call.function.name, arguments=text)
        )
    return tuple(calls)
