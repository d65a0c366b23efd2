"""Goal-oriented invoice verification: the leaves as capabilities over facts.

`invoice_fields` → `supplier_record` → `duplicate_checked` / `totals_checked` / `po_checked`
→ `audit_report` → `hold_decided`. The hold decision can also be left to the accounts-payable
reviewer, at a higher cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from planning.core.goal import Capability
from planning.packs.invoice import leaves

CHECK_FACTS = frozenset({"invoice_fields", "supplier_record"})


def capabilities(state: Mapping[str, Any]) -> tuple[Capability, ...]:
    """Return the goal-oriented capabilities for the invoice case in `state`.

    The purchase-order check (and the report's use of it) is offered only when the case asks
    for it. Raises `KeyError` when the state has no `invoice_id`.
    """
    with_po = bool(state.get("check_purchase_order", True))
    report_facts = CHECK_FACTS | {"duplicate_checked", "totals_checked"}
    caps = [
        Capability.from_step(
            leaves.extract_fields(state["invoice_id"]),
            inputs={"invoice_id"},
            outputs={"invoice_fields"},
        ),
        Capability.from_step(
            leaves.lookup_supplier(), inputs={"invoice_fields"}, outputs={"supplier_record"}
        ),
        Capability.from_step(
            leaves.check_duplicate(), inputs=CHECK_FACTS, outputs={"duplicate_checked"}
        ),
        Capability.from_step(leaves.check_totals(), inputs=CHECK_FACTS, outputs={"totals_checked"}),
    ]
    if with_po:
        caps.append(
            Capability.from_step(leaves.check_po(), inputs=CHECK_FACTS, outputs={"po_checked"})
        )
        report_facts |= {"po_checked"}
    caps += [
        Capability.from_step(
            leaves.audit_report(with_po=with_po), inputs=report_facts, outputs={"audit_report"}
        ),
        Capability.from_step(
            leaves.place_hold(), inputs={"audit_report"}, outputs={"hold_decided"}
        ),
        Capability.from_step(
            leaves.review_hold(), inputs={"audit_report"}, outputs={"hold_decided"}, cost=5.0
        ),
    ]
    return tuple(caps)


def goal_facts(state: Mapping[str, Any]) -> frozenset[str]:
    """Return the facts that finish the invoice case in `state`."""
    wanted = {"audit_report"}
    if state.get("hold_on_findings", True):
        wanted.add("hold_decided")
    return frozenset(wanted)
