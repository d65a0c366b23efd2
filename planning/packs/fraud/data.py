"""The account data the fraud tools read: its port, an in-memory port, and the demo dataset."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

DEMO_FRAUD_DATA: Mapping[str, Any] = {
    "transactions": (
        {"tx_id": "TX-1", "account_id": "ACC-300", "amount": "42.10", "counterparty": "Grocer"},
        {"tx_id": "TX-2", "account_id": "ACC-300", "amount": "38.75", "counterparty": "Grocer"},
        {"tx_id": "TX-3", "account_id": "ACC-300", "amount": "55.00", "counterparty": "Fuel"},
        {
            "tx_id": "TX-4",
            "account_id": "ACC-300",
            "amount": "12500.00",
            "counterparty": "Oceanic Holdings Ltd",
        },
        {
            "tx_id": "TX-5",
            "account_id": "ACC-300",
            "amount": "9900.00",
            "counterparty": "Oceanic Holdings Ltd",
        },
        {"tx_id": "TX-6", "account_id": "ACC-410", "amount": "60.00", "counterparty": "Books"},
    ),
    "accounts": ("ACC-300", "ACC-410"),
    "sanctioned": ("Oceanic Holdings Ltd",),
}


class FraudData(Protocol):
    """Account activity and watch-list access for the fraud tools."""

    def has_account(self, account_id: str) -> bool: ...

    def transactions(self, account_id: str) -> Sequence[Mapping[str, Any]]: ...

    def sanctioned(self) -> Sequence[str]: ...

    def freeze(self, account_id: str, reason: str) -> str: ...


@dataclass
class InMemoryFraudData:
    """A `FraudData` port over plain Python data (the demo dataset by default)."""

    data: Mapping[str, Any] = field(default_factory=lambda: DEMO_FRAUD_DATA)
    frozen: list[dict[str, str]] = field(default_factory=list)

    def has_account(self, account_id: str) -> bool:
        return account_id in self.data["accounts"]

    def transactions(self, account_id: str) -> Sequence[Mapping[str, Any]]:
        return [t for t in self.data["transactions"] if t["account_id"] == account_id]

    def sanctioned(self) -> Sequence[str]:
        return tuple(self.data["sanctioned"])

    def freeze(self, account_id: str, reason: str) -> str:
        freeze_id = f"FRZ-{len(self.frozen) + 1:04d}"
        self.frozen.append({"freeze_id": freeze_id, "account_id": account_id, "reason": reason})
        return freeze_id
