"""The LLM client: JSON answers, and function calling, from a chat model, every call accounted for.

:class:`LlmClient` is what the rest of CaseHub calls. The caller passes the settings in
(`planning.core.llm.records.LlmSettings`; the Django side builds them from its settings, which
read the environment); the HTTP to the server is `planning.core.llm.transport`'s, the only module
that imports ``openai``. Every call asks for JSON-schema structured output (Chat Completions,
``strict``, stepping down for servers that refuse it), re-validates the answer with the caller's
validator and reports a `LlmCallRecord` of every call, successful or not, to the ``on_call`` hook
so the caller can audit it. A ``guard`` (`planning.core.llm.budget.CallGuard`) reserves each
call's worst case before it is sent, and may refuse it with `LlmBudgetExhausted`; the call is
then settled to its usage. A call interrupted in flight (a leaf's soft time limit, a shutdown) is
still reported, as interrupted, and settled for what was sent (its prompt at the reserved bound)
before the interruption goes on.

Every request bounds its answer (``max_tokens``); an answer the server cut off at that bound
(``finish_reason: "length"``) is reported as truncated and never parsed. A request the server
refuses (HTTP 4xx) is not retried and is reported with the server's own message. The answer is
validated the same way whatever form of structured output the server enforced.

:meth:`LlmClient.complete_with_tools` is the same call with function calling (``tools``,
``tool_choice``): the answer is either the tool calls the model asks for (name, arguments as the
model wrote them, id) or a final JSON answer validated like ``complete_json``'s. The caller runs
the tools and calls again with their results; the client keeps no conversation of its own. Both
entry points share one path (``_call``): reserve with the guard, send, record, settle.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planning.core.errors import LlmPlanningError
from planning.core.llm.budget import CallEstimate, CallGuard, prompt_bound
from planning.core.llm.records import (
    ChatMessage,
    ConversationMessage,
    LlmCallFailed,
    LlmCallRecord,
    LlmResult,
    LlmSettings,
    LlmToolCall,
    LlmToolsResult,
    ResponseFormat,
    ToolChoice,
    ToolDefinition,
    request_hash,
)
from planning.core.llm.structured_output import (
    Choice,
    Usage,
    parse_response,
    tool_calls_of,
    truncation_error,
)
from planning.core.llm.transport import (
    CALL_ERRORS,
    ChatTransport,
    describe,
    end_span,
    is_transient,
)
from planning.core.serialize import canonical_json

__all__ = ["LlmClient"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Reply:
    """A completed call's answer as the server sent it, before the caller reads it."""

    choice: Choice | None
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


class LlmClient:
    """Call a chat model for JSON answers; report every call to ``on_call``.

    Safe to share between threads: the underlying HTTP client is thread-safe and the hook may be
    called from several threads at once. `transport` is the client's `ChatTransport`, which
    holds the connections and the form of structured output the server accepts.
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
        self.transport = ChatTransport(settings)

    @property
    def model(self) -> str:
        """Return the model name sent with every request."""
        return self.settings.model

    @property
    def response_format(self) -> ResponseFormat:
        """Return the structured output the next request asks for."""
        return self.transport.response_format

    def request_hash(
        self, messages: Sequence[ChatMessage], schema_name: str, json_schema: Mapping[str, Any]
    ) -> str:
        """Return the hash identifying this request for this client's model."""
        return request_hash(self.model, messages, schema_name, json_schema)

    def close(self) -> None:
        """Close the HTTP connections; later calls raise LlmPlanningError."""
        self._closed = True
        self.transport.close()

    def __enter__(self) -> LlmClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _begin(self, call_id: str, max_tokens: int | None) -> tuple[str, int]:
        if self._closed:
            raise LlmPlanningError("the LLM client is closed")
        ceiling = self.settings.max_tokens_per_call
        bound = ceiling if max_tokens is None else max(1, min(max_tokens, ceiling))
        with self._lock:
            self._calls += 1
            label = call_id or f"call-{self._calls}"
        return label, bound

    def _reserve(self, prompt_tokens: Callable[[], int], purpose: str, bound: int) -> object:
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
                prompt_tokens=prompt_tokens(),
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
                return _Reading(None, reply.text, truncation_error(bound, len(reply.text)))
            parsed, error = parse_response(reply.text, validate)
            return _Reading(parsed, reply.text, error)

        reply, reading = self._call(
            messages,
            lambda form: self.transport.body(messages, schema_name, schema, bound, form),
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
            body, messages_sent = self.transport.body(messages, schema_name, schema, bound, form)
            if offered:  # servers refuse an empty list of tools
                body["tools"] = offered
                body["tool_choice"] = tool_choice
            return body, messages_sent

        def read(reply: _Reply) -> _Reading[tuple[tuple[LlmToolCall, ...], T | None]]:
            if reply.truncated:
                # cut off: neither a final answer nor tool calls whose arguments may be whole
                return _Reading(((), None), reply.text, truncation_error(bound, len(reply.text)))
            choice = reply.choice
            calls = tool_calls_of(choice.message.tool_calls or []) if choice is not None else ()
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

        A call interrupted while in flight (by anything else the exchange raises: a soft time
        limit's signal, KeyboardInterrupt, SystemExit) is recorded as interrupted and settled
        for what was sent, its prompt at the upper bound reserved for it (`prompt_bound`) and no
        completion tokens, before the interruption goes on: the request may have reached the
        server, which reports no usage for it. Nothing is recorded or counted for a request that
        was never sent (refused by the guard).
        """
        sent: list[dict[str, Any]] = [dict(m) for m in messages]
        first_form = self.transport.form
        # the prompt's upper bound, worked out once and only when needed (the body is large)
        prompt_tokens = functools.cache(lambda: prompt_bound(build(first_form)[0]))
        ticket = self._reserve(prompt_tokens, schema_name, bound)
        started_at = time.time()
        started = time.perf_counter()
        span = self.transport.start_span(schema_name, bound)
        try:
            completion = self.transport.exchange(build, sent)
        except CALL_ERRORS as exc:
            end_span(span, error=exc)
            latency = time.perf_counter() - started
            error = f"LLM call to model {self.model!r} failed: {describe(exc)}"
            self._report(label, schema_name, digest, sent, "", 0, 0, latency, started_at, error)
            self._settle(ticket, 0, 0)  # made and failed: a call that used no tokens
            raise LlmCallFailed(error, transient=is_transient(exc)) from exc
        except BaseException as exc:
            end_span(span, error=exc)
            latency = time.perf_counter() - started
            why = str(exc) or type(exc).__name__
            charged = prompt_tokens()
            error = (
                f"LLM call to model {self.model!r} interrupted after {latency:.1f} s ({why}): "
                f"no answer was read; counted as sent, {charged:,} prompt tokens (the "
                "request's upper bound) and no completion tokens"
            )
            self._report(
                label, schema_name, digest, sent, "", charged, 0, latency, started_at, error
            )
            # what was sent is charged: the prompt, at its reserved bound; the answer never came
            self._settle(ticket, charged, 0)
            raise
        latency = time.perf_counter() - started
        choice = completion.choices[0] if completion.choices else None
        finish_reason = (choice.finish_reason or "") if choice is not None else ""
        end_span(span, completion=completion, finish_reason=finish_reason or None)
        usage = completion.usage or Usage()
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
