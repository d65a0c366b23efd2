"""The account data the fraud tools read: its port, an in-memory port, and the demo dataset.

The Django side supplies a database-backed port (`planning.catalogue.DatabaseFraudData`) over the
same data, loaded from `DEMO_FRAUD_DATA`: a freeze lasts, once per the acting leaf's idempotency
key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from planning.core.catalogue import ToolCall

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
    # ACC-300 sent two large payments to a sanctioned company; ACC-410's activity is ordinary.
    "accounts": {
        "ACC-300": "two large payments to Oceanic Holdings Ltd, a sanctioned company",
        "ACC-410": "ordinary activity: one small payment",
    },
    "sanctioned": ("Oceanic Holdings Ltd",),
}


class FraudData(Protocol):
    """Account activity and watch-list access for the fraud tools and the pack's goal check.

    `freeze` happens once per idempotency key of the leaf the port acts for (`with_call`); a
    repeated call returns the first freeze's id.
    """

    def has_account(self, account_id: str) -> bool: ...

    def accounts(self) -> Mapping[str, str]:
        """Return the accounts by id, each with what it is (for people choosing one)."""
        ...

    def transactions(self, account_id: str) -> Sequence[Mapping[str, Any]]: ...

    def sanctioned(self) -> Sequence[str]: ...

    def freeze(self, account_id: str, reason: str) -> str: ...

    def freezes(self, account_id: str) -> Sequence[str]:
        """Return the ids of the freezes recorded on the account, oldest first."""
        ...


@dataclass
class InMemoryFraudData:
    """A `FraudData` port over plain Python data (the demo dataset by default)."""

    data: Mapping[str, Any] = field(default_factory=lambda: DEMO_FRAUD_DATA)
    frozen: list[dict[str, str]] = field(default_factory=list)
    key: str = ""

    def with_call(self, call: ToolCall) -> InMemoryFraudData:
        """Return this data acting for one leaf: a freeze is recorded once per its key."""
        return InMemoryFraudData(data=self.data, frozen=self.frozen, key=call.idempotency_key)

    def has_account(self, account_id: str) -> bool:
        return account_id in self.data["accounts"]

    def accounts(self) -> Mapping[str, str]:
        return dict(self.data["accounts"])

    def transactions(self, account_id: str) -> Sequence[Mapping[str, Any]]:
        return [t for t in self.data["transactions"] if t["account_id"] == account_id]

    def sanctioned(self) -> Sequence[str]:
        return tuple(self.data["sanctioned"])

    def freeze(self, account_id: str, reason: str) -> str:
        for done in self.frozen:
            if self.key and done.get("key") == self.key:
                return done["freeze_id"]
        freeze_id = f"FRZ-{len(self.frozen) + 1:04d}"
        self.frozen.append(
            {"freeze_id": freeze_id, "account_id": account_id, "reason": reason, "key": self.key}
        )
        return freeze_id

    def freezes(self, account_id: str) -> Sequence[str]:
        return tuple(f["freeze_id"] for f in self.frozen if f["account_id"] == account_id)
