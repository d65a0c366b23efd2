"""Fraud investigation (seed 000's "investigate-fraud").

Guards choose from the case inputs: a full investigation (financial-records analysis as its
own subtask, sanctions screening, customer interview, report with legal review and an
account freeze) for large amounts or repeat flags, otherwise a light one.

Goal-oriented planning uses the same rule to choose the goal facts: a light case wants
`findings_summarised`, a serious one `account_frozen`, which needs legally reviewed findings
drawn from the anomalies, the sanctions screening and a customer interview. The three
read-only tools take the account number directly, so pulling, anomaly detection and
screening run side by side; the analyst can stand in for the anomaly detector at a higher cost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from statistics import median
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from planning.core.catalogue import AgentSpec, DomainPack, ToolSpec
from planning.core.goal import Capability
from planning.core.static import Item, Method, MethodLibrary, Step, TaskRef

FULL_INVESTIGATION_AMOUNT = Decimal("10000")
FULL_INVESTIGATION_PRIOR_FLAGS = 2

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
    "sanctioned": ("Oceanic Holdings Ltd",),
}


class FraudData(Protocol):
    """Account activity and watch-list access for the fraud tools."""

    def transactions(self, account_id: str) -> Sequence[Mapping[str, Any]]: ...

    def sanctioned(self) -> Sequence[str]: ...

    def freeze(self, account_id: str, reason: str) -> str: ...


@dataclass
class InMemoryFraudData:
    """A `FraudData` port over plain Python data (the demo dataset by default)."""

    data: Mapping[str, Any] = field(default_factory=lambda: DEMO_FRAUD_DATA)
    frozen: list[dict[str, str]] = field(default_factory=list)

    def transactions(self, account_id: str) -> Sequence[Mapping[str, Any]]:
        return [t for t in self.data["transactions"] if t["account_id"] == account_id]

    def sanctioned(self) -> Sequence[str]:
        return tuple(self.data["sanctioned"])

    def freeze(self, account_id: str, reason: str) -> str:
        freeze_id = f"FRZ-{len(self.frozen) + 1:04d}"
        self.frozen.append({"freeze_id": freeze_id, "account_id": account_id, "reason": reason})
        return freeze_id


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AccountQuery(_Model):
    account_id: str = Field(pattern=r"^ACC-[0-9]+$")


class TransactionSummary(_Model):
    account_id: str
    count: int
    total: Decimal
    counterparties: list[str]


class AnomalyReport(_Model):
    account_id: str
    anomalous_transactions: list[str]


class SanctionsResult(_Model):
    account_id: str
    hits: list[str]


class FreezeInput(_Model):
    account_id: str = Field(pattern=r"^ACC-[0-9]+$")
    reason: str = Field(min_length=3)


class FreezeResult(_Model):
    account_id: str
    freeze_id: str


def pull_transactions(args: AccountQuery, data: FraudData) -> TransactionSummary:
    """Summarise the account's transactions."""
    txs = data.transactions(args.account_id)
    return TransactionSummary(
        account_id=args.account_id,
        count=len(txs),
        total=sum((Decimal(t["amount"]) for t in txs), Decimal("0")),
        counterparties=sorted({t["counterparty"] for t in txs}),
    )


def detect_anomalies(args: AccountQuery, data: FraudData) -> AnomalyReport:
    """Flag transactions over ten times the account's median amount."""
    txs = data.transactions(args.account_id)
    if not txs:
        return AnomalyReport(account_id=args.account_id, anomalous_transactions=[])
    typical = median(Decimal(t["amount"]) for t in txs)
    return AnomalyReport(
        account_id=args.account_id,
        anomalous_transactions=[t["tx_id"] for t in txs if Decimal(t["amount"]) > 10 * typical],
    )


def screen_sanctions(args: AccountQuery, data: FraudData) -> SanctionsResult:
    """Match the account's counterparties against the sanctions list."""
    listed = set(data.sanctioned())
    hits = sorted({t["counterparty"] for t in data.transactions(args.account_id)} & listed)
    return SanctionsResult(account_id=args.account_id, hits=hits)


def freeze_account(args: FreezeInput, data: FraudData) -> FreezeResult:
    """Freeze the account (a write that blocks the customer's funds)."""
    return FreezeResult(
        account_id=args.account_id, freeze_id=data.freeze(args.account_id, args.reason)
    )


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="pull_transactions",
        description="Summarise an account's transactions",
        input_model=AccountQuery,
        output_model=TransactionSummary,
        risk="read",
        func=pull_transactions,
    ),
    ToolSpec(
        name="detect_anomalies",
        description="Flag outlier transactions",
        input_model=AccountQuery,
        output_model=AnomalyReport,
        risk="read",
        func=detect_anomalies,
    ),
    ToolSpec(
        name="screen_sanctions",
        description="Screen counterparties against sanctions",
        input_model=AccountQuery,
        output_model=SanctionsResult,
        risk="read",
        func=screen_sanctions,
    ),
    ToolSpec(
        name="freeze_account",
        description="Freeze a customer account",
        input_model=FreezeInput,
        output_model=FreezeResult,
        risk="financial",
        func=freeze_account,
    ),
)

AGENTS: tuple[AgentSpec, ...] = (
    AgentSpec(
        slug="transaction-monitor",
        name="Transaction monitor",
        kind="tool",
        description="Reads account activity and flags anomalies",
        capabilities=("transactions.read", "transactions.analyse"),
        tools=("pull_transactions", "detect_anomalies"),
        trust=0.85,
    ),
    AgentSpec(
        slug="sanctions-screener",
        name="Sanctions screener",
        kind="tool",
        description="Screens counterparties against sanctions lists",
        capabilities=("sanctions.screen",),
        tools=("screen_sanctions",),
        trust=0.9,
    ),
    AgentSpec(
        slug="account-controls",
        name="Account controls",
        kind="tool",
        description="Freezes and unfreezes accounts",
        capabilities=("account.freeze",),
        tools=("freeze_account",),
        trust=0.6,
    ),
    AgentSpec(
        slug="fraud-analyst",
        name="Fraud analyst",
        kind="llm",
        description="Reviews evidence and drafts investigation findings",
        capabilities=("fraud.analyse", "report.draft"),
        trust=0.6,
    ),
    AgentSpec(
        slug="investigator",
        name="Investigator",
        kind="human",
        description="A fraud investigator who interviews customers",
        capabilities=("customer.interview",),
        trust=0.9,
    ),
    AgentSpec(
        slug="legal-counsel",
        name="Legal counsel",
        kind="human",
        description="Reviews findings before action is taken",
        capabilities=("legal.review",),
        trust=0.95,
    ),
)


class FraudCaseInput(_Model):
    """The case inputs of a fraud investigation."""

    account_id: str = Field(pattern=r"^ACC-[0-9]+$")
    amount: Decimal = Field(ge=0, description="amount in question")
    prior_flags: int = Field(default=0, ge=0)
    customer_reported: bool = False


def build_state(inputs: FraudCaseInput) -> dict[str, Any]:
    """Return the planning state of a fraud case."""
    return inputs.model_dump(mode="json")


def _is_serious(state: Mapping[str, Any]) -> bool:
    return (
        Decimal(str(state.get("amount", "0"))) >= FULL_INVESTIGATION_AMOUNT
        or int(state.get("prior_flags", 0)) >= FULL_INVESTIGATION_PRIOR_FLAGS
    )


def _full(state: Mapping[str, Any]) -> Sequence[Item]:
    account = {"account_id": state["account_id"]}
    return [
        Step(
            key="pull-transactions",
            agent="transaction-monitor",
            task="Pull the transactions",
            tool="pull_transactions",
            inputs=account,
            expected_output="TransactionSummary",
            effects={"transactions_pulled": True},
        ),
        TaskRef(
            task="analyse-financial-records",
            key="analyse-financial-records",
            description="find anomalies and risky counterparties",
            depends_on=("pull-transactions",),
        ),
        Step(
            key="interview-customer",
            agent="investigator",
            task="Interview the customer",
            depends_on=("pull-transactions",),
            rationale="serious cases need the customer's side",
            reads=frozenset({"transactions_pulled"}),
        ),
        TaskRef(
            task="prepare-report",
            key="prepare-report",
            description="compile findings into a structured report",
            depends_on=("analyse-financial-records", "interview-customer"),
        ),
        Step(
            key="freeze-account",
            agent="account-controls",
            task="Freeze the account",
            tool="freeze_account",
            risk="financial",
            failure_policy="escalate",
            inputs={
                "account_id": state["account_id"],
                "reason": "serious fraud investigation findings",
            },
            reads=frozenset({"report_ready"}),
        ),
    ]


def _analyse(state: Mapping[str, Any]) -> Sequence[Item]:
    account = {"account_id": state["account_id"]}
    return [
        Step(
            key="detect-anomalies",
            agent="transaction-monitor",
            task="Detect anomalies",
            tool="detect_anomalies",
            inputs=account,
            depends_on=(),
            reads=frozenset({"transactions_pulled"}),
            effects={"anomalies_known": True},
        ),
        Step(
            key="screen-sanctions",
            agent="sanctions-screener",
            task="Screen the counterparties",
            tool="screen_sanctions",
            inputs=account,
            depends_on=(),
            reads=frozenset({"transactions_pulled"}),
            effects={"sanctions_known": True},
        ),
    ]


def _report(state: Mapping[str, Any]) -> Sequence[Item]:
    return [
        Step(
            key="draft-findings",
            agent="fraud-analyst",
            task="Draft the findings",
            reads=frozenset({"anomalies_known", "sanctions_known"}),
            effects={"draft_ready": True},
        ),
        Step(
            key="legal-review",
            agent="legal-counsel",
            task="Review the findings",
            reads=frozenset({"draft_ready"}),
            effects={"report_ready": True},
        ),
    ]


def _light(state: Mapping[str, Any]) -> Sequence[Item]:
    account = {"account_id": state["account_id"]}
    return [
        Step(
            key="pull-transactions",
            agent="transaction-monitor",
            task="Pull the transactions",
            tool="pull_transactions",
            inputs=account,
            effects={"transactions_pulled": True},
        ),
        Step(
            key="detect-anomalies",
            agent="transaction-monitor",
            task="Detect anomalies",
            tool="detect_anomalies",
            inputs=account,
            depends_on=(),
            effects={"anomalies_known": True},
        ),
        Step(
            key="draft-findings",
            agent="fraud-analyst",
            task="Summarise the findings for the case file",
            depends_on=("pull-transactions", "detect-anomalies"),
            reads=frozenset({"transactions_pulled", "anomalies_known"}),
        ),
    ]


METHODS = MethodLibrary(
    [
        Method(
            name="full-investigation",
            task="investigate-fraud",
            guard=_is_serious,
            decompose=_full,
            cost=10.0,
            duration_s=3 * 24 * 3600.0,
            description="large amounts or repeat flags",
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
        Method(name="report-with-legal-review", task="prepare-report", decompose=_report),
    ]
)

# -- goal-oriented capabilities -------------------------------------------------------------


def capabilities(state: Mapping[str, Any]) -> tuple[Capability, ...]:
    """Return the goal-oriented capabilities for the fraud case in `state`.

    Raises `KeyError` when the state has no `account_id`.
    """
    account = {"account_id": state["account_id"]}
    return (
        Capability(
            name="pull-transactions",
            agent="transaction-monitor",
            task="Pull the transactions",
            inputs=frozenset({"account_id"}),
            outputs=frozenset({"transactions"}),
            cost=1.0,
            rationale="the findings and the interview rest on the account's activity",
            tool="pull_transactions",
            tool_inputs=account,
            expected_output="TransactionSummary",
        ),
        Capability(
            name="detect-anomalies",
            agent="transaction-monitor",
            task="Detect anomalies",
            inputs=frozenset({"account_id"}),
            outputs=frozenset({"anomalies"}),
            cost=1.0,
            rationale="flag the outlier transactions automatically",
            tool="detect_anomalies",
            tool_inputs=account,
            expected_output="AnomalyReport",
        ),
        Capability(
            name="review-anomalies",
            agent="fraud-analyst",
            task="Read the transaction summary and point out unusual transactions",
            inputs=frozenset({"transactions"}),
            outputs=frozenset({"anomalies"}),
            cost=4.0,
            rationale="an analyst's reading stands in for the anomaly detector",
        ),
        Capability(
            name="screen-sanctions",
            agent="sanctions-screener",
            task="Screen the counterparties",
            inputs=frozenset({"account_id"}),
            outputs=frozenset({"sanctions_screened"}),
            cost=1.0,
            rationale="payments to sanctioned parties change the case entirely",
            tool="screen_sanctions",
            tool_inputs=account,
            expected_output="SanctionsResult",
        ),
        Capability(
            name="interview-customer",
            agent="investigator",
            task="Interview the customer about the flagged activity",
            inputs=frozenset({"transactions"}),
            outputs=frozenset({"customer_interviewed"}),
            cost=5.0,
            rationale="serious cases need the customer's side",
        ),
        Capability(
            name="summarise-findings",
            agent="fraud-analyst",
            task="Summarise the findings for the case file",
            inputs=frozenset({"transactions", "anomalies"}),
            outputs=frozenset({"findings_summarised"}),
            cost=1.0,
        ),
        Capability(
            name="draft-findings",
            agent="fraud-analyst",
            task="Draft the findings from the anomalies, sanctions hits and interview",
            inputs=frozenset(
                {"transactions", "anomalies", "sanctions_screened", "customer_interviewed"}
            ),
            outputs=frozenset({"findings_drafted"}),
            cost=2.0,
        ),
        Capability(
            name="legal-review",
            agent="legal-counsel",
            task="Review the findings before any action on the account",
            inputs=frozenset({"findings_drafted"}),
            outputs=frozenset({"findings_reviewed"}),
            cost=3.0,
        ),
        Capability(
            name="freeze-account",
            agent="account-controls",
            task="Freeze the account",
            inputs=frozenset({"findings_reviewed"}),
            outputs=frozenset({"account_frozen"}),
            cost=1.0,
            rationale="legally reviewed findings justify blocking the funds",
            tool="freeze_account",
            tool_inputs={**account, "reason": "serious fraud investigation findings"},
            expected_output="FreezeResult",
            failure_policy="escalate",
            risk="financial",
        ),
    )


def goal_facts(state: Mapping[str, Any]) -> frozenset[str]:
    """Return the facts that finish the fraud case in `state` (serious cases end frozen)."""
    return frozenset({"account_frozen"} if _is_serious(state) else {"findings_summarised"})


PACK = DomainPack(
    slug="fraud",
    name="Fraud investigation",
    description="Investigate suspected fraud on an account",
    input_schema=FraudCaseInput,
    root_task="investigate-fraud",
    methods=METHODS,
    agents=AGENTS,
    tools=TOOLS,
    build_state=build_state,
    demo_port=InMemoryFraudData,
    capabilities_from=capabilities,
    goal_facts_from=goal_facts,
)
