"""Rows for page tests, written directly with bulk_create (big plans and long case lists)."""

from __future__ import annotations

from typing import Any

from planning.models import Case, CaseStatus, NodeStatus, PlanNode, PlanVersion, Strategy


def make_case(submitter: Any, *, title: str = "Check invoice INV-1042", **fields: Any) -> Case:
    """Create one case row (no audit event, no planning: for read-side tests only)."""
    values: dict[str, Any] = {
        "goal": "Verify the invoice",
        "domain": "invoice",
        "strategy": Strategy.STATIC,
        "status": CaseStatus.AWAITING_APPROVAL,
        "inputs": {"invoice_id": "INV-1042"},
    }
    values.update(fields)
    return Case.objects.create(title=title, submitter=submitter, **values)


def make_cases(submitter: Any, count: int, **fields: Any) -> list[Case]:
    """Create `count` cases in one statement."""
    values: dict[str, Any] = {
        "goal": "Verify the invoice",
        "domain": "invoice",
        "strategy": Strategy.STATIC,
        "status": CaseStatus.AWAITING_APPROVAL,
    }
    values.update(fields)
    return Case.objects.bulk_create(
        [Case(title=f"Case {n}", submitter=submitter, **values) for n in range(count)],
        batch_size=500,
    )


def make_plan(
    case: Case,
    *,
    leaves: int = 5,
    groups: int = 1,
    labels: dict[int, dict[str, Any]] | None = None,
    status: str = NodeStatus.PENDING,
) -> PlanVersion:
    """Give `case` a current plan version: a root compound, `groups` sub-compounds, `leaves`
    leaves spread over them, each leaf after the previous one of its group.

    `labels` overrides fields of leaf number n (name, task, key…), e.g. hostile text.
    """
    version = PlanVersion.objects.create(
        case=case,
        number=1,
        strategy=case.strategy,
        content_hash="0" * 64,
        leaf_count=leaves,
        critical_path=leaves,
        width=groups,
        warnings=[],
    )
    provenance = {"strategy": case.strategy, "source": "test-method", "depth": 1}
    (root,) = PlanNode.objects.bulk_create(
        [
            PlanNode(
                version=version, key="root", position=0, depth=0, kind=PlanNode.Kind.COMPOUND,
                name="Verify the invoice", provenance=provenance,
            )
        ]
    )  # fmt: skip
    compounds = PlanNode.objects.bulk_create(
        [
            PlanNode(
                version=version, key=f"group-{g}", parent=root, position=1 + g, depth=1,
                kind=PlanNode.Kind.COMPOUND, name=f"Group {g}", provenance=provenance,
            )
            for g in range(groups)
        ]
    )  # fmt: skip
    rows = []
    previous: dict[int, str] = {}
    for n in range(leaves):
        g = n % groups
        key = f"step-{n}"
        fields: dict[str, Any] = {
            "version": version,
            "key": key,
            "parent": compounds[g],
            "position": 1 + groups + n,
            "depth": 2,
            "kind": PlanNode.Kind.LEAF,
            "name": f"Step {n}",
            "agent": "payments-auditor",
            "task": f"Do step {n}",
            "rationale": "because",
            "tool": "check_totals",
            "inputs": {"n": n},
            "depends_on": [previous[g]] if g in previous else [],
            "provenance": provenance,
            "status": status,
        }
        fields.update((labels or {}).get(n, {}))
        previous[g] = fields["key"]
        rows.append(PlanNode(**fields))
    PlanNode.objects.bulk_create(rows, batch_size=500)
    case.current_version = version
    case.save(update_fields=["current_version"])
    return version
