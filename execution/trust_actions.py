"""Trust learned from outcomes: read for routing, one increment per outcome (DESIGN §4)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import F
from django.utils import timezone

from execution import trust
from execution.models import TrustScore
from planning.models import Agent

logger = logging.getLogger(__name__)

# Trust ------------------------------------------------------------------------------------------


def effective_trust(
    agent: Agent, capabilities: Sequence[str], rows: Sequence[TrustScore] | None = None
) -> float:
    """Return the agent's learned trust for `capabilities` (the lowest; the prior without data).

    `rows` are the agent's scores when the caller read them already.
    """
    found = {s.capability: s for s in (rows if rows is not None else agent.scores.all())}
    now = timezone.now().timestamp()
    scores = []
    for capability in capabilities or ["*"]:
        row = found.get(capability)
        evidence = (
            trust.evidence_at(row.successes, row.failures, now)
            if row is not None
            else trust.Evidence()
        )
        scores.append(trust.score(agent.trust, evidence))
    return min(scores)


def outcome_increment(
    agent_slug: str, outcome: trust.Outcome, *, now: datetime, name: str = "trust"
) -> tuple[str, dict[str, Any]]:
    """Return the UPDATE that `record_outcome` runs first as a common table expression `name`
    returning a row per score it changed (SQL with named parameters, and the parameters), for a
    caller that runs it with other writes in one statement; when it changes no row, the caller
    calls `record_outcome` (the agent's first outcome creates its rows). Raises ValueError as it
    does.
    """
    if outcome not in trust.OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    column = "successes" if outcome == "succeeded" else "failures"
    scores, agents = TrustScore._meta.db_table, Agent._meta.db_table
    sql = (
        f'"{name}" AS (UPDATE "{scores}" SET "{column}" = "{column}" + %({name}_weight)s, '  # noqa: S608
        f'"updated_at" = %({name}_now)s WHERE "agent_id" IN '
        f'(SELECT "id" FROM "{agents}" WHERE "slug" = %({name}_agent)s) RETURNING 1)'
    )
    params = {
        f"{name}_weight": trust.weight(now.timestamp()),
        f"{name}_now": now,
        f"{name}_agent": agent_slug,
    }
    return sql, params


def record_outcome(agent_slug: str, outcome: trust.Outcome, *, now: datetime) -> None:
    """Add an outcome to the agent's trust for each of its capabilities (caller's transaction).

    One increment of the stored weighted sums, no row read or locked first: completions of
    every case share an agent's rows, so they must not queue behind each other here.
    """
    if outcome not in trust.OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    w = trust.weight(now.timestamp())
    column = "successes" if outcome == "succeeded" else "failures"
    changed = TrustScore.objects.filter(agent__slug=agent_slug).update(
        **{column: F(column) + w}, updated_at=now
    )
    if changed:
        return
    agent = Agent.objects.filter(slug=agent_slug).first()
    if agent is None:
        return
    TrustScore.objects.bulk_create(
        [
            TrustScore(agent=agent, capability=c, successes=0.0, failures=0.0, updated_at=now)
            for c in list(agent.capabilities) or ["*"]
        ],
        ignore_conflicts=True,
    )
    TrustScore.objects.filter(agent=agent).update(**{column: F(column) + w}, updated_at=now)
