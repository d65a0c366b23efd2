"""The case inputs of a fraud investigation, and their check against the account data."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any

from pydantic import Field

from planning.packs.fraud.data import FraudData
from planning.packs.fraud.tools import AccountId
from planning.packs.schema import PackModel


class FraudCaseInput(PackModel):
    """The case inputs of a fraud investigation."""

    account_id: Annotated[
        AccountId, Field(title="Account", description="The account to investigate.")
    ]
    amount: Decimal = Field(ge=0, title="Amount", description="The amount in question.")
    prior_flags: int = Field(
        default=0, ge=0, title="Prior flags", description="Earlier fraud flags on the account."
    )
    customer_reported: bool = Field(default=False, title="Reported by the customer")


def check_inputs(values: Mapping[str, Any], data: FraudData) -> dict[str, list[str]]:
    """Return the problems of the accepted case inputs against the account data, by field."""
    account_id = values.get("account_id")
    if isinstance(account_id, str) and not data.has_account(account_id):
        return {"account_id": [f"{account_id} is not a known account."]}
    return {}


def suggest_inputs(data: FraudData) -> dict[str, Mapping[str, str]]:
    """Return the accounts to offer for a case, with what each is."""
    return {"account_id": data.accounts()}
