"""The static methods of a fraud investigation (seed 000's "investigate-fraud").

Guards choose from the case inputs: a full investigation (financial-records analysis as its
own subtask, sanctions screening, customer interview, report with legal review and an
account freeze) for large amounts or repeat flags, otherwise a light one. Where the installation
has no LLM provider (the state says so: `has_llm_provider`), the methods tried first give the
write-up to a person instead of the `llm` agent fraud-analyst, whose step could not run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

from planning.core.pack import has_llm_provider
from planning.core.static import Item, Method, MethodLibrary, TaskRef
from planning.packs.fraud import leaves

FULL_INVESTIGATION_AMOUNT = Decimal("10000")
FULL_INVESTIGATION_PRIOR_FLAGS = 2
PULLED = frozenset({"transactions_pulled"})


def is_serious(state: Mapping[str, Any]) -> bool:
    """Tell whether the case in `state` needs the full investigation (amount or repeat flags)."""
    return (
        Decimal(str(state.get("amount", "0"))) >= FULL_INVESTIGATION_AMOUNT
        or int(state.get("prior_flags", 0)) >= FULL_INVESTIGATION_PRIOR_FLAGS
    )


def is_without_llm(state: Mapping[str, Any]) -> bool:
    """Tell whether the installation planning `state` has no LLM provider to run an llm agent."""
    return not has_llm_provider(state)


def _full(state: Mapping[str, Any]) -> Sequence[Item]:
    account = state["account_id"]
    return [
        replace(leaves.pull_transactions(account), effects={"transactions_pulled": True}),
        TaskRef(
            task="analyse-financial-records",
            description="find anomalies and risky counterparties",
            depends_on=("pull-transactions",),
        ),
        replace(
            leaves.interview_customer(),
            depends_on=("pull-transactions",),
            reads=PULLED,
            effects={"customer_interviewed": True},
        ),
        TaskRef(
            task="prepare-report",
            description="compile findings into a structured report",
            depends_on=("analyse-financial-records", "interview-customer"),
        ),
        replace(leaves.freeze_account(account), reads=frozenset({"report_ready"})),
    ]


def _analyse(state: Mapping[str, Any]) -> Sequence[Item]:
    account = state["account_id"]
    return [
        replace(
            leaves.detect_anomalies(account),
            depends_on=(),
            reads=PULLED,
            effects={"anomalies_known": True},
        ),
        replace(
            leaves.screen_sanctions(account),
            depends_on=(),
            reads=PULLED,
            effects={"sanctions_known": True},
        ),
    ]


def _report(state: Mapping[str, Any]) -> Sequence[Item]:
    return _report_drafted(by_person=False)


def _report_by_person(state: Mapping[str, Any]) -> Sequence[Item]:
    return _report_drafted(by_person=True)


def _report_drafted(*, by_person: bool) -> Sequence[Item]:
    return [
        replace(
            leaves.draft_findings(by_person=by_person),
            reads=frozenset({"anomalies_known", "sanctions_known", "customer_interviewed"}),
            effects={"draft_ready": True},
        ),
        replace(
            leaves.legal_review(),
            reads=frozenset({"draft_ready"}),
            effects={"report_ready": True},
        ),
    ]


def _light(state: Mapping[str, Any]) -> Sequence[Item]:
    return _light_summarised(state, by_person=False)


def _light_by_person(state: Mapping[str, Any]) -> Sequence[Item]:
    return _light_summarised(state, by_person=True)


def _light_summarised(state: Mapping[str, Any], *, by_person: bool) -> Sequence[Item]:
    account = state["account_id"]
    return [
        replace(leaves.pull_transactions(account), effects={"transactions_pulled": True}),
        replace(leaves.detect_anomalies(account), depends_on=(), effects={"anomalies_known": True}),
        replace(
            leaves.summarise_findings(by_person=by_person),
            depends_on=("pull-transactions", "detect-anomalies"),
            reads=frozenset({"transactions_pulled", "anomalies_known"}),
        ),
    ]


METHODS = MethodLibrary(
    [
        Method(
            name="full-investigation",
            task="investigate-fraud",
            guard=is_serious,
            decompose=_full,
            cost=10.0,
            duration_s=3 * 24 * 3600.0,
            description="large amounts or repeat flags",
        ),
        Method(
            name="light-investigation-without-llm",
            task="investigate-fraud",
            guard=is_without_llm,
            decompose=_light_by_person,
            cost=1.0,
            duration_s=3600.0,
            description="small, first-time cases where no LLM provider is configured: a person "
            "summarises the findings",
        ),
        Method(
            name="light-investigation",
            task="investigate-fraud",
            decompose=_light,
            cost=1.0,
            duration_s=3600.0,
            description="small, first-time cases",
        ),
        Method(name="analyse-records", task="analyse-financial-records", decompose=_analyse),
        Method(
            name="report-by-person-with-legal-review",
            task="prepare-report",
            guard=is_without_llm,
            decompose=_report_by_person,
            description="no LLM provider is configured: a person drafts the findings",
        ),
        Method(name="report-with-legal-review", task="prepare-report", decompose=_report),
    ]
)
