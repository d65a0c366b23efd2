"""The ERP the invoice tools read: its port, an in-memory port, and the demo dataset.

The Django side supplies a database-backed port (`planning.catalogue.DatabaseErp`) over the
same data, loaded from `DEMO_ERP`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from planning.core.catalogue import ToolCall

DEMO_ERP: Mapping[str, Any] = {
    "suppliers": (
        {
            "supplier_id": "SUP-1001",
            "name": "Acme Office Supplies",
            "status": "active",
            "bank_account": "DE89 3704 0044 0532 0130 00",
        },
        {
            "supplier_id": "SUP-1002",
            "name": "Globex Logistics",
            "status": "active",
            "bank_account": "FR14 2004 1010 0505 0001 3M02 606",
        },
        {
            "supplier_id": "SUP-1003",
            "name": "Initech Consulting",
            "status": "active",
            "bank_account": "GB29 NWBK 6016 1331 9268 19",
        },
        {
            "supplier_id": "SUP-1004",
            "name": "Umbrella Catering",
            "status": "blocked",
            "bank_account": "NL91 ABNA 0417 1643 00",
        },
    ),
    "purchase_orders": (
        {
            "po_number": "PO-5001",
            "supplier_id": "SUP-1001",
            "amount": "1000.00",
            "invoiced": "1000.00",
        },
        {"po_number": "PO-5002", "supplier_id": "SUP-1002", "amount": "500.00", "invoiced": "0.00"},
        {"po_number": "PO-5003", "supplier_id": "SUP-1003", "amount": "300.00", "invoiced": "0.00"},
    ),
    # Raw invoice documents as received; `extract_invoice_fields` parses them.
    "documents": {
        "INV-1042": (
            "INVOICE INV-1042\nSupplier: SUP-1001\nPO: PO-5001\nDate: 2026-09-28\nCurrency: EUR\n"
            "Line: A4 paper (box) | 10 | 25.00\nLine: Toner cartridge | 5 | 150.00\n"
            "Total: 1000.00\n"
        ),
        "INV-1043": (
            "INVOICE INV-1043\nSupplier: SUP-1002\nPO: PO-5002\nDate: 2026-10-03\nCurrency: EUR\n"
            "Line: Pallet transport | 4 | 125.00\nTotal: 540.00\n"
        ),
        "INV-1044": (
            "INVOICE INV-1044\nSupplier: SUP-1003\nPO: PO-5003\nDate: 2026-10-05\nCurrency: EUR\n"
            "Line: Process review workshop | 2 | 150.00\nTotal: 300.00\n"
        ),
        "INV-1045": (
            "INVOICE INV-1045\nSupplier: SUP-1004\nPO: PO-5999\nDate: 2026-10-06\nCurrency: EUR\n"
            "Line: Catering | 1 | 80.00\nTotal: 80.00\n"
        ),
    },
    # INV-1042 was paid twice, a week apart: the duplicate the checks must find.
    "payments": (
        {
            "payment_id": "PAY-7001",
            "invoice_id": "INV-1042",
            "supplier_id": "SUP-1001",
            "amount": "1000.00",
            "paid_on": "2026-10-02",
        },
        {
            "payment_id": "PAY-7002",
            "invoice_id": "INV-1042",
            "supplier_id": "SUP-1001",
            "amount": "1000.00",
            "paid_on": "2026-10-09",
        },
        {
            "payment_id": "PAY-7003",
            "invoice_id": "INV-0977",
            "supplier_id": "SUP-1002",
            "amount": "500.00",
            "paid_on": "2026-08-14",
        },
    ),
}


class ErpData(Protocol):
    """Read (and hold) access to the ERP that the invoice tools need."""

    def has_invoice(self, invoice_id: str) -> bool: ...

    def invoices(self) -> Sequence[str]:
        """Return the ids of the invoices the ERP holds, in order."""
        ...

    def invoice_document(self, invoice_id: str) -> str: ...

    def supplier(self, supplier_id: str) -> Mapping[str, Any] | None: ...

    def purchase_order(self, po_number: str) -> Mapping[str, Any] | None: ...

    def payments(self, supplier_id: str) -> Sequence[Mapping[str, Any]]: ...

    def place_hold(self, invoice_id: str, reason: str) -> str:
        """Place a payment hold and return its id; once per idempotency key of the caller."""
        ...


@dataclass
class InMemoryErp:
    """An `ErpData` port over plain Python data (the demo dataset by default)."""

    data: Mapping[str, Any] = field(default_factory=lambda: DEMO_ERP)
    holds: list[dict[str, str]] = field(default_factory=list)

    def has_invoice(self, invoice_id: str) -> bool:
        return invoice_id in self.data["documents"]

    def invoices(self) -> Sequence[str]:
        return sorted(self.data["documents"])

    def invoice_document(self, invoice_id: str) -> str:
        documents: Mapping[str, str] = self.data["documents"]
        if invoice_id not in documents:
            raise LookupError(f"no invoice document {invoice_id!r}")
        return documents[invoice_id]

    def supplier(self, supplier_id: str) -> Mapping[str, Any] | None:
        return next((s for s in self.data["suppliers"] if s["supplier_id"] == supplier_id), None)

    def purchase_order(self, po_number: str) -> Mapping[str, Any] | None:
        return next((p for p in self.data["purchase_orders"] if p["po_number"] == po_number), None)

    def payments(self, supplier_id: str) -> Sequence[Mapping[str, Any]]:
        return [p for p in self.data["payments"] if p["supplier_id"] == supplier_id]

    key: str = ""

    def with_call(self, call: ToolCall) -> InMemoryErp:
        """Return this ERP acting for one leaf: holds are recorded once per its key."""
        return InMemoryErp(data=self.data, holds=self.holds, key=call.idempotency_key)

    def place_hold(self, invoice_id: str, reason: str) -> str:
        for hold in self.holds:
            if self.key and hold.get("key") == self.key:
                return hold["hold_id"]
        hold_id = f"HOLD-{len(self.holds) + 1:04d}"
        self.holds.append(
            {"hold_id": hold_id, "invoice_id": invoice_id, "reason": reason, "key": self.key}
        )
        return hold_id
