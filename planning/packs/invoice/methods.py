"""The static method of invoice verification (seed 002's shape).

Extract the fields → look up the supplier → duplicate, totals and purchase-order checks in
parallel → audit report → payment hold. The reads and effects let forward planning derive the
same DAG from the state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from planning.core.static import Method, MethodLibrary, Step
from planning.packs.invoice import leaves

SUPPLIER_CHECKED = frozenset({"supplier_checked"})


def _verify(state: Mapping[str, Any]) -> list[Step]:
    with_po = bool(state.get("check_purchase_order", True))
    checks = [
        replace(leaves.check_duplicate(), effects={"duplicate_checked": True}),
        replace(leaves.check_totals(), effects={"totals_checked": True}),
    ]
    if with_po:
        checks.append(replace(leaves.check_po(), effects={"po_checked": True}))
    steps = [
        replace(leaves.extract_fields(state["invoice_id"]), effects={"fields_extracted": True}),
        replace(
            leaves.lookup_supplier(),
            reads=frozenset({"fields_extracted"}),
            effects={"supplier_checked": True},
        ),
        *(replace(c, depends_on=("lookup-supplier",), reads=SUPPLIER_CHECKED) for c in checks),
        replace(
            leaves.audit_report(with_po=with_po),
            depends_on=tuple(c.key for c in checks),
            reads=frozenset({"duplicate_checked", "totals_checked", "po_checked"}),
            effects={"report_ready": True},
        ),
    ]
    if state.get("hold_on_findings", True):
        steps.append(
            replace(
                leaves.place_hold(),
                reads=frozenset({"report_ready"}),
                effects={"hold_decided": True},
            )
        )
    return steps


METHODS = MethodLibrary(
    [
        Method(
            name="verify-invoice-standard",
            task="verify-invoice",
            decompose=_verify,
            cost=1.0,
            duration_s=30.0,
            description="extract → supplier → parallel checks → report → hold",
        ),
    ]
)
