"""The fraud tools: their pydantic input and output models, the functions, and their specs.

Every tool takes its validated input model and a `FraudData` port.
"""

from __future__ import annotations

from decimal import Decimal
from statistics import median
from typing import Annotated

from pydantic import Field

from planning.core.catalogue import ToolSpec
from planning.packs.fraud.data import FraudData
from planning.packs.schema import Identifier, PackModel

AccountId = Annotated[str, Identifier(r"^ACC-[0-9]+$", "An account number", "ACC-300")]


class AccountQuery(PackModel):
    account_id: AccountId


class TransactionSummary(PackModel):
    account_id: str
    count: int
    total: Decimal
    counterparties: list[str]


class AnomalyReport(PackModel):
    account_id: str
    anomalous_transactions: list[str]


class SanctionsResult(PackModel):
    account_id: str
    hits: list[str]


class FreezeInput(PackModel):
    account_id: AccountId
    reason: str = Field(min_length=3)


class FreezeResult(PackModel):
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
