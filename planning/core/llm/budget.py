"""LLM budgets: what a call may use before it is made, and the hook that enforces it.

`LlmClient` takes a `CallGuard`: before every call it asks the guard to `reserve` the call's worst
case (`CallEstimate`: the request's size as an upper bound of its prompt tokens, plus the call's
``max_tokens`` bound), and afterwards it `settle`s the reservation to what the call really used
(a call that failed counts as a call that used no tokens; one interrupted in flight, by a leaf's
soft time limit or a shutdown, as its prompt's reserved bound and no completion tokens, since no
usage came back for what was sent), or `release`s it when no request went out. A guard that
refuses raises `LlmBudgetExhausted` (a `BudgetExceeded`), naming the budget, its limit, what is
used and what the call needs. The ledger behind a guard lives on the Django side
(`planning.budgets`); this module holds the pure parts: limits, usage, the check itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any, Literal, Protocol

from planning.core.errors import BudgetExceeded
from planning.core.llm.pricing import PriceTable

__all__ = [
    "BudgetBackend",
    "BudgetLimits",
    "BudgetUsage",
    "CallEstimate",
    "CallGuard",
    "LlmBudgetExhausted",
    "Scope",
    "ScopeStatus",
    "check_call",
    "format_usd",
    "nano_usd",
    "prompt_bound",
    "usd",
]

type Scope = Literal["case", "day"]
_NANO = Decimal(1_000_000_000)
# the chat template wraps every message in a few tokens (role, separators)
_TOKENS_PER_MESSAGE = 8
SCOPE_LABELS: Mapping[Scope, str] = {"case": "per-case", "day": "daily"}
SCOPE_SETTINGS: Mapping[Scope, str] = {"case": "CASEHUB_LLM_CASE_MAX", "day": "CASEHUB_LLM_DAY_MAX"}


def nano_usd(amount: Decimal) -> int:
    """Return an amount of dollars in whole billionths of a dollar, rounded up."""
    return int((amount * _NANO).to_integral_value(rounding=ROUND_CEILING))


def usd(nano: int) -> Decimal:
    """Return billionths of a dollar as dollars."""
    return Decimal(nano) / _NANO


def format_usd(amount: Decimal) -> str:
    """Return dollars for people: cents, or the first significant digits of a smaller amount."""
    if amount == 0 or abs(amount) >= Decimal("0.01"):
        return f"${amount:,.2f}"
    text = f"{amount:.9f}".rstrip("0")
    return f"${text}"


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}" if number == 1 else f"{number:,} {noun}s"


def prompt_bound(body: Mapping[str, Any]) -> int:
    """Return an upper bound of a request's prompt tokens: its UTF-8 bytes, plus message framing.

    Byte-level BPE tokenizers (OpenAI's, Llama's) never make more tokens than bytes; the request
    body holds the messages, the response schema and the tools the server turns into prompt.
    """
    size = len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
    messages = body.get("messages") or ()
    return size + _TOKENS_PER_MESSAGE * (len(messages) + 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallEstimate:
    """The worst case of one call, reserved before it is made."""

    model: str
    purpose: str
    prompt_tokens: int  # upper bound (`prompt_bound`)
    completion_tokens: int  # the call's max_tokens
    expires_in_s: float  # how long the call may take at most (every try, every step-down)

    @property
    def tokens(self) -> int:
        """Return the most tokens the call may use."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetLimits:
    """The limits of one scope (a case, a day); 0 is no limit."""

    calls: int = 0
    tokens: int = 0
    cost_usd: Decimal = Decimal(0)

    def __post_init__(self) -> None:
        if self.calls < 0 or self.tokens < 0 or self.cost_usd < 0:
            raise ValueError("budget limits cannot be negative")
        if not self.cost_usd.is_finite():
            raise ValueError("the cost budget must be a finite number of dollars")

    @property
    def is_set(self) -> bool:
        """Tell whether any limit is set."""
        return bool(self.calls or self.tokens or self.cost_usd)


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetUsage:
    """Calls, tokens and cost (billionths of a dollar) used or reserved in one scope."""

    calls: int = 0
    tokens: int = 0
    cost_nano: int = 0
    unpriced_calls: int = 0  # calls of models without a price: not in `cost_nano`

    @property
    def cost_usd(self) -> Decimal:
        """Return the cost in dollars."""
        return usd(self.cost_nano)


class LlmBudgetExhausted(BudgetExceeded):
    """A call would pass an LLM budget (or its cost cannot be checked); it was not made."""

    def __init__(
        self,
        message: str,
        *,
        scope: Scope,
        budget: str,
        limit: int | float,
        used: int | float,
        needed: int | float,
    ) -> None:
        super().__init__(f"llm_{scope}_{budget}", limit, used)
        self.scope = scope
        self.needed = needed
        self.message = message
        self.args = (message,)

    def __str__(self) -> str:
        return self.message


def check_call(
    scope: Scope,
    limits: BudgetLimits,
    used: BudgetUsage,
    in_flight: BudgetUsage,
    estimate: CallEstimate,
    prices: PriceTable,
) -> int | None:
    """Check one call against a scope's limits; return its worst cost in billionths, None unpriced.

    Raises LlmBudgetExhausted naming the first budget the call could pass (calls, tokens, cost),
    or the cost budget that cannot be checked because the model has no price (fail closed).
    """
    label = SCOPE_LABELS[scope]
    setting = SCOPE_SETTINGS[scope]
    price = prices.price_of(estimate.model)
    cost_nano = (
        None
        if price is None
        else nano_usd(price.cost(estimate.prompt_tokens, estimate.completion_tokens))
    )
    if limits.calls and used.calls + in_flight.calls + 1 > limits.calls:
        raise LlmBudgetExhausted(
            f"The {label} LLM call budget of {_count(limits.calls, 'call')} is reached: "
            f"{used.calls:,} made, {in_flight.calls:,} in flight, and this call would be one "
            f"more ({setting}_CALLS).",
            scope=scope,
            budget="calls",
            limit=limits.calls,
            used=used.calls + in_flight.calls,
            needed=1,
        )
    if limits.tokens and used.tokens + in_flight.tokens + estimate.tokens > limits.tokens:
        raise LlmBudgetExhausted(
            f"The {label} LLM token budget of {_count(limits.tokens, 'token')} is reached: "
            f"{used.tokens:,} used, {in_flight.tokens:,} reserved by calls in flight, and this "
            f"call may use up to {estimate.tokens:,} ({setting}_TOKENS).",
            scope=scope,
            budget="tokens",
            limit=limits.tokens,
            used=used.tokens + in_flight.tokens,
            needed=estimate.tokens,
        )
    if limits.cost_usd:
        if cost_nano is None:
            raise LlmBudgetExhausted(
                f"The model {estimate.model!r} has no price in CASEHUB_LLM_PRICES, so the "
                f"{label} LLM cost budget {format_usd(limits.cost_usd)} cannot be checked and "
                "the call is not made: the operator adds its price (or a '*' entry) there.",
                scope=scope,
                budget="price",
                limit=float(limits.cost_usd),
                used=float(usd(used.cost_nano + in_flight.cost_nano)),
                needed=0,
            )
        if used.cost_nano + in_flight.cost_nano + cost_nano > nano_usd(limits.cost_usd):
            in_flight_text = (
                f" ({format_usd(in_flight.cost_usd)} more reserved by calls in flight)"
                if in_flight.cost_nano
                else ""
            )
            raise LlmBudgetExhausted(
                f"The {label} LLM cost budget {format_usd(limits.cost_usd)} is reached: "
                f"{format_usd(used.cost_usd)} used{in_flight_text}, and this call could cost "
                f"{format_usd(usd(cost_nano))} ({setting}_COST_USD).",
                scope=scope,
                budget="cost",
                limit=float(limits.cost_usd),
                used=float(usd(used.cost_nano + in_flight.cost_nano)),
                needed=float(usd(cost_nano)),
            )
    return cost_nano


@dataclass(frozen=True, slots=True, kw_only=True)
class ScopeStatus:
    """A scope's limits, what settled calls used and what calls in flight reserve."""

    scope: Scope
    limits: BudgetLimits
    used: BudgetUsage
    in_flight: BudgetUsage

    @property
    def label(self) -> str:
        """Return "per-case" or "daily"."""
        return SCOPE_LABELS[self.scope]

    @property
    def calls_left(self) -> int | None:
        """Return the calls left, None without a call limit."""
        if not self.limits.calls:
            return None
        return max(0, self.limits.calls - self.used.calls - self.in_flight.calls)

    @property
    def tokens_left(self) -> int | None:
        """Return the tokens left, None without a token limit."""
        if not self.limits.tokens:
            return None
        return max(0, self.limits.tokens - self.used.tokens - self.in_flight.tokens)

    @property
    def cost_left_usd(self) -> Decimal | None:
        """Return the dollars left, None without a cost limit."""
        if not self.limits.cost_usd:
            return None
        spent = usd(self.used.cost_nano + self.in_flight.cost_nano)
        return max(Decimal(0), self.limits.cost_usd - spent)


class BudgetBackend(Protocol):
    """The ledger behind the budgets (``CASEHUB_LLM_BUDGET_BACKEND``, loaded by dotted path)."""

    def guard(self, case_id: int, purpose: str) -> CallGuard | None:
        """Return the guard of a case's calls, None when no budget is set."""
        ...

    def day_status(self) -> ScopeStatus:
        """Return today's usage against the daily budgets."""
        ...

    def case_status(self, case_id: int) -> ScopeStatus:
        """Return a case's usage against the per-case budgets."""
        ...


class CallGuard(Protocol):
    """Reserve a call's worst case before it is made; settle or release it afterwards."""

    def reserve(self, estimate: CallEstimate) -> object:
        """Reserve the call; return a ticket for `settle`/`release`. Raises LlmBudgetExhausted."""
        ...

    def settle(self, ticket: object, *, prompt_tokens: int, completion_tokens: int) -> None:
        """Replace the reservation by what the call used (a failed call: 0 and 0)."""
        ...

    def release(self, ticket: object) -> None:
        """Drop the reservation of a call that was never sent."""
        ...
