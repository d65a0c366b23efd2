"""LLM budgets per case and per day, reserved in the database before each call.

Every LLM call of a case (planning, `llm` agents, the goal judge) goes through the guard of its
case (`LedgerGuard`, given to `LlmClient` as its `guard`) while any budget is set:

- `reserve`, before the call: in one transaction it takes the row lock of today's `LlmUsage` row,
  then the case's (always in that order, so two reservations never wait on each other crosswise),
  adds the calls in flight (live `LlmReservation` rows) to what settled calls used, and checks the
  call's worst case (`CallEstimate`: the request's size plus its ``max_tokens``, at the model's
  price) against the per-case and the daily limits. Within them it stores a reservation row;
  otherwise it raises `LlmBudgetExhausted` naming the budget, its limit, the usage and what the
  call needs, and appends ``oversight.llm_budget.refused`` to the case's chain (in a transaction
  of its own, after the lock is released: the daily row is every call's, it is never held while
  waiting for a case's chain). The row lock (a write lock on SQLite) makes this race-free across
  threads and processes: two calls never both take the last of a budget.
- `settle`, after the call: adds what it really used (a failed call: one call, no tokens, no cost;
  a call interrupted in flight: one call and its prompt at the reserved bound, no completion
  tokens) to both rows and deletes its reservation, in one transaction. `release` deletes the
  reservation of a call that was never sent. A reservation left by a process that died counts
  until its call could no longer be running (`expires_at`), then it is ignored and purged.

Costs are billionths of a dollar, rounded up, at `CASEHUB_LLM_PRICE_TABLE`'s prices. A model with
no price: a money budget that applies refuses its calls (it cannot be checked: fail closed); with
no money budget its calls are counted as unpriced, never as $0. The day is TIME_ZONE's.
With no budget set no guard is made and nothing is counted. The planning side (which may not
import this module) loads `LedgerBudgets` by the dotted path `CASEHUB_LLM_BUDGET_BACKEND`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from audit.chain import append_event, case_chain
from planning.core.llm.budget import (
    BudgetLimits,
    BudgetUsage,
    CallEstimate,
    LlmBudgetExhausted,
    Scope,
    ScopeStatus,
    check_call,
    nano_usd,
)
from planning.core.llm.pricing import PriceTable
from planning.models import LlmReservation, LlmUsage

__all__ = [
    "LedgerBudgets",
    "LedgerGuard",
    "Ticket",
    "case_limits",
    "day_limits",
    "guard_for",
    "prices",
]

# a reservation outlives its call's longest possible duration by this much before it is ignored
_EXPIRY_MARGIN_S = 60


def case_limits() -> BudgetLimits:
    """Return the per-case budgets from the settings."""
    return BudgetLimits(
        calls=int(getattr(settings, "CASEHUB_LLM_CASE_MAX_CALLS", 0)),
        tokens=int(getattr(settings, "CASEHUB_LLM_CASE_MAX_TOKENS", 0)),
        cost_usd=Decimal(getattr(settings, "CASEHUB_LLM_CASE_MAX_COST_USD", 0) or 0),
    )


def day_limits() -> BudgetLimits:
    """Return the daily budgets from the settings."""
    return BudgetLimits(
        calls=int(getattr(settings, "CASEHUB_LLM_DAY_MAX_CALLS", 0)),
        tokens=int(getattr(settings, "CASEHUB_LLM_DAY_MAX_TOKENS", 0)),
        cost_usd=Decimal(getattr(settings, "CASEHUB_LLM_DAY_MAX_COST_USD", 0) or 0),
    )


def prices() -> PriceTable:
    """Return the configured price table."""
    table = getattr(settings, "CASEHUB_LLM_PRICE_TABLE", None)
    return table if isinstance(table, PriceTable) else PriceTable()


@dataclass(frozen=True, slots=True, kw_only=True)
class Ticket:
    """A reservation made for one call, to settle or release."""

    reservation_id: int
    case_id: int
    day: date
    model: str


def _close_if_helper_thread() -> None:
    # the planner calls from its thread pool: a helper thread's connection would stay open
    # (never inside a transaction of the caller's: closing would doom it)
    if threading.current_thread() is not threading.main_thread() and not connection.in_atomic_block:
        connection.close()


def _locked_row(**lookup: Any) -> LlmUsage:
    row = LlmUsage.objects.select_for_update().filter(**lookup).first()
    if row is None:
        LlmUsage.objects.get_or_create(**lookup)  # another process may create it first
        row = LlmUsage.objects.select_for_update().get(**lookup)
    return row


def _usage(row: LlmUsage | None) -> BudgetUsage:
    if row is None:
        return BudgetUsage()
    return BudgetUsage(
        calls=row.calls,
        tokens=row.tokens,
        cost_nano=row.cost_nano_usd,
        unpriced_calls=row.unpriced_calls,
    )


def _in_flight(scope: Q, now: datetime) -> BudgetUsage:
    totals = LlmReservation.objects.filter(scope, expires_at__gt=now).aggregate(
        calls=Count("pk"), tokens=Sum("tokens"), cost=Sum("cost_nano_usd")
    )
    return BudgetUsage(
        calls=totals["calls"] or 0, tokens=totals["tokens"] or 0, cost_nano=totals["cost"] or 0
    )


class LedgerGuard:
    """Reserve, settle and release the calls of one case against its and today's budgets."""

    def __init__(
        self,
        case_id: int,
        purpose: str,
        *,
        case: BudgetLimits,
        day: BudgetLimits,
        price_table: PriceTable,
    ) -> None:
        self.case_id = case_id
        self.purpose = purpose
        self.limits: dict[Scope, BudgetLimits] = {"case": case, "day": day}
        self.prices = price_table

    def reserve(self, estimate: CallEstimate) -> Ticket:
        """Reserve the call's worst case; return its ticket.

        Raises LlmBudgetExhausted (and audits the refusal) when the call could pass a budget of
        the case or of the day, or a money budget cannot be checked for want of a price.
        """
        try:
            try:
                return self._reserve(estimate)
            except LlmBudgetExhausted as exc:
                self._audit_refusal(estimate, exc)
                raise
        finally:
            _close_if_helper_thread()

    def _reserve(self, estimate: CallEstimate) -> Ticket:
        now = timezone.now()
        today = timezone.localdate(now)
        with transaction.atomic():
            day_row = _locked_row(day=today, case=None)
            case_row = _locked_row(case_id=self.case_id, day=None)
            LlmReservation.objects.filter(day__lte=today, expires_at__lte=now).delete()
            cost_nano: int | None = None
            scopes: tuple[tuple[Scope, LlmUsage, Q], ...] = (
                ("case", case_row, Q(case_id=self.case_id)),
                ("day", day_row, Q(day=today)),
            )
            for scope, row, where in scopes:
                limits = self.limits[scope]
                in_flight = _in_flight(where, now) if limits.is_set else BudgetUsage()
                cost_nano = check_call(scope, limits, _usage(row), in_flight, estimate, self.prices)
            reservation = LlmReservation.objects.create(
                case_id=self.case_id,
                day=today,
                model=estimate.model[:200],
                purpose=self.purpose,
                tokens=estimate.tokens,
                cost_nano_usd=cost_nano or 0,
                is_priced=cost_nano is not None,
                created_at=now,
                expires_at=now + timedelta(seconds=estimate.expires_in_s + _EXPIRY_MARGIN_S),
            )
        return Ticket(
            reservation_id=reservation.pk, case_id=self.case_id, day=today, model=estimate.model
        )

    def _audit_refusal(self, estimate: CallEstimate, exc: LlmBudgetExhausted) -> None:
        with transaction.atomic():
            append_event(
                "oversight.llm_budget.refused",
                chain=case_chain(self.case_id),
                data={
                    "case": self.case_id,
                    "purpose": self.purpose,
                    "model": estimate.model,
                    "schema": estimate.purpose,
                    "scope": exc.scope,
                    "budget": exc.budget,
                    "limit": exc.limit,
                    "used": exc.used,
                    "needed": exc.needed,
                    "message": exc.message,
                },
            )

    def settle(self, ticket: object, *, prompt_tokens: int, completion_tokens: int) -> None:
        """Count what the call used, in its case's and its day's rows; drop its reservation."""
        assert isinstance(ticket, Ticket)
        cost = self.prices.cost(ticket.model, prompt_tokens, completion_tokens)
        changes: dict[str, object] = {
            "calls": F("calls") + 1,
            "tokens": F("tokens") + max(0, prompt_tokens) + max(0, completion_tokens),
            "updated_at": timezone.now(),
        }
        if cost is None:
            changes["unpriced_calls"] = F("unpriced_calls") + 1
        else:
            changes["cost_nano_usd"] = F("cost_nano_usd") + nano_usd(cost)
        try:
            with transaction.atomic():
                # today's row first, then the case's: the order `reserve` locks them in
                LlmUsage.objects.filter(day=ticket.day, case=None).update(**changes)
                LlmUsage.objects.filter(case_id=ticket.case_id, day=None).update(**changes)
                LlmReservation.objects.filter(pk=ticket.reservation_id).delete()
        finally:
            _close_if_helper_thread()

    def release(self, ticket: object) -> None:
        """Drop the reservation of a call that was never sent."""
        assert isinstance(ticket, Ticket)
        try:
            LlmReservation.objects.filter(pk=ticket.reservation_id).delete()
        finally:
            _close_if_helper_thread()


class LedgerBudgets:
    """The budget backend planning loads by `CASEHUB_LLM_BUDGET_BACKEND`."""

    def guard(self, case_id: int, purpose: str) -> LedgerGuard | None:
        """Return the guard of a case's calls, None when no budget is set."""
        return guard_for(case_id, purpose)

    def day_status(self) -> ScopeStatus:
        """Return today's usage against the daily budgets (two queries)."""
        now = timezone.now()
        today = timezone.localdate(now)
        return ScopeStatus(
            scope="day",
            limits=day_limits(),
            used=_usage(LlmUsage.objects.filter(day=today, case=None).first()),
            in_flight=_in_flight(Q(day=today), now),
        )

    def case_status(self, case_id: int) -> ScopeStatus:
        """Return a case's usage against the per-case budgets (two queries)."""
        now = timezone.now()
        return ScopeStatus(
            scope="case",
            limits=case_limits(),
            used=_usage(LlmUsage.objects.filter(case_id=case_id, day=None).first()),
            in_flight=_in_flight(Q(case_id=case_id), now),
        )


def guard_for(case_id: int, purpose: str) -> LedgerGuard | None:
    """Return the guard of a case's LLM calls for `purpose`, None when no budget is set."""
    case, day = case_limits(), day_limits()
    if not (case.is_set or day.is_set):
        return None
    return LedgerGuard(case_id, purpose, case=case, day=day, price_table=prices())
