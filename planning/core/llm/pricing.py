"""What LLM calls cost: a price table per model, in US dollars per million tokens.

Configured by `CASEHUB_LLM_PRICES`, a comma-separated list of ``model=input/output`` entries
(``gpt-4o-mini=0.15/0.60,local-llama=0/0``); a model with no entry costs the ``*`` entry when
there is one, else nothing is known of its price (`cost` returns None: callers say "price
unknown", they never guess zero). Pure Python: the planning core and the Django apps share it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from types import MappingProxyType

__all__ = ["ModelPrice", "PriceTable", "PriceTableInvalid"]

_MILLION = Decimal(1_000_000)


class PriceTableInvalid(ValueError):
    """The price table's text is malformed (the message names the entry)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelPrice:
    """US dollars per million prompt (input) and completion (output) tokens."""

    input_per_million: Decimal
    output_per_million: Decimal

    def cost(self, prompt_tokens: int, completion_tokens: int) -> Decimal:
        """Return the cost of one call with these token counts."""
        return (
            self.input_per_million * prompt_tokens + self.output_per_million * completion_tokens
        ) / _MILLION


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Prices per model name; ``*`` is the price of any model not named."""

    prices: Mapping[str, ModelPrice] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def parse(cls, text: str) -> PriceTable:
        """Return the table for ``model=input/output,…``.

        Raises PriceTableInvalid naming the entry that is not ``model=number/number`` with
        non-negative numbers, or a model named twice.
        """
        prices: dict[str, ModelPrice] = {}
        for raw in text.split(","):
            entry = raw.strip()
            if not entry:
                continue
            model, sep, pair = entry.rpartition("=")
            model = model.strip()
            input_text, slash, output_text = pair.partition("/")
            if not sep or not model or not slash:
                raise PriceTableInvalid(
                    f"price entry {entry!r} is not model=input/output "
                    "(dollars per million tokens, e.g. gpt-4o-mini=0.15/0.60)"
                )
            try:
                price = ModelPrice(
                    input_per_million=Decimal(input_text.strip()),
                    output_per_million=Decimal(output_text.strip()),
                )
            except InvalidOperation:
                raise PriceTableInvalid(
                    f"price entry {entry!r}: {input_text.strip()!r} and "
                    f"{output_text.strip()!r} must be numbers"
                ) from None
            if not (price.input_per_million.is_finite() and price.output_per_million.is_finite()):
                raise PriceTableInvalid(f"price entry {entry!r}: prices must be finite")
            if price.input_per_million < 0 or price.output_per_million < 0:
                raise PriceTableInvalid(f"price entry {entry!r}: prices cannot be negative")
            if model in prices:
                raise PriceTableInvalid(f"price entry {entry!r}: {model!r} is priced twice")
            prices[model] = price
        return cls(MappingProxyType(prices))

    def price_of(self, model: str) -> ModelPrice | None:
        """Return the model's price (or the ``*`` price), None when unknown."""
        return self.prices.get(model) or self.prices.get("*")

    def cost(self, model: str, prompt_tokens: int, completion_tokens: int) -> Decimal | None:
        """Return what one call cost, None when the model's price is unknown."""
        price = self.price_of(model)
        return None if price is None else price.cost(prompt_tokens, completion_tokens)

    def __bool__(self) -> bool:
        return bool(self.prices)
