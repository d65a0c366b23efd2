"""Trust learned from outcomes, and routing by capability (pure Python: no Django).

An agent's trust for one capability is the mean of a Beta distribution: the configured trust of
the agent is the prior mean, worth `PRIOR_WEIGHT` observations; each outcome adds one success or
one failure (a reviewer's rejection or edit of the output counts as a failure; a failure that is
the installation's or a passing outage's, `failure_kind`, counts as nothing); older outcomes
count less, halving every `half_life_s`. Routing picks the best trust-and-load candidate among the
agents able to do a leaf, and asks for a person when only borderline candidates remain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

type Outcome = Literal["succeeded", "failed", "rejected", "edited"]
type FailureKind = Literal["configuration", "transient", "agent"]

OUTCOMES: tuple[Outcome, ...] = ("succeeded", "failed", "rejected", "edited")
# Failures that say nothing about the agent, by error class: the installation is misconfigured
# (an `llm` agent with no provider) or a service stayed unreachable (the provider down after the
# client's retries, a lost database connection). They leave its trust where it was.
NOT_THE_AGENTS: dict[str, FailureKind] = {
    "configuration": "configuration",
    "transient": "transient",
}
PRIOR_WEIGHT = 10.0
HALF_LIFE_S = 30 * 24 * 3600.0
# How much trust one unit of load (a leaf the agent is running now) costs a candidate.
LOAD_PENALTY = 0.02


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """Decayed outcome counts of one agent for one capability."""

    successes: float = 0.0
    failures: float = 0.0

    def decayed(self, elapsed_s: float, half_life_s: float = HALF_LIFE_S) -> Evidence:
        """Return the counts as they weigh `elapsed_s` seconds later.

        Raises ValueError for a negative time or a half-life that is not positive.
        """
        if elapsed_s < 0 or half_life_s <= 0:
            raise ValueError("elapsed time must be >= 0 and the half-life > 0")
        factor = 0.5 ** (elapsed_s / half_life_s)
        return Evidence(successes=self.successes * factor, failures=self.failures * factor)

    def adding(self, outcome: Outcome) -> Evidence:
        """Return the counts with one more outcome; raise ValueError for an unknown one."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}")
        if outcome == "succeeded":
            return Evidence(successes=self.successes + 1, failures=self.failures)
        return Evidence(successes=self.successes, failures=self.failures + 1)


# Outcomes are stored as weights that grow with time (`weight`): an older outcome then counts
# less than a newer one without rewriting the stored sums, and adding one is a plain increment.
EPOCH_S = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def failure_kind(error_class: str) -> FailureKind:
    """Return whose failure an attempt's `error_class` is: the installation's ("configuration"),
    a passing outage's ("transient") or the agent's; only the agent's lowers its trust."""
    return NOT_THE_AGENTS.get(error_class, "agent")


def weight(at_s: float, half_life_s: float = HALF_LIFE_S) -> float:
    """Return the stored weight of one outcome at `at_s` (seconds since the Unix epoch)."""
    return 2.0 ** ((at_s - EPOCH_S) / half_life_s)


def evidence_at(
    successes: float, failures: float, at_s: float, half_life_s: float = HALF_LIFE_S
) -> Evidence:
    """Return stored weighted sums as decayed counts seen at `at_s`."""
    scale = weight(at_s, half_life_s)
    return Evidence(successes=successes / scale, failures=failures / scale)


def score(prior: float, evidence: Evidence) -> float:
    """Return the trust in [0, 1]: the Beta mean with `prior` as prior mean.

    Raises ValueError when `prior` is outside [0, 1].
    """
    if not 0 <= prior <= 1:
        raise ValueError("the prior trust must be between 0 and 1")
    alpha = prior * PRIOR_WEIGHT + evidence.successes
    beta = (1 - prior) * PRIOR_WEIGHT + evidence.failures
    # Rounded: without evidence the score is the prior exactly (0.6 stays 0.6, not 0.5999…).
    return round(alpha / (alpha + beta), 9)


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """An enabled agent able to do a leaf: its trust for the capability and its current load."""

    agent: str
    trust: float
    load: int = 0

    @property
    def merit(self) -> float:
        return self.trust - LOAD_PENALTY * self.load


@dataclass(frozen=True, slots=True, kw_only=True)
class Routing:
    """Who runs a leaf and why; `escalate` when no candidate is trusted enough."""

    agent: str | None
    escalate: bool
    rationale: str
    candidates: tuple[Candidate, ...]

    def as_data(self) -> dict[str, object]:
        """Return the routing as JSON-ready data for the node's panel and the audit trail."""
        return {
            "agent": self.agent,
            "escalate": self.escalate,
            "rationale": self.rationale,
            "candidates": [
                {"agent": c.agent, "trust": round(c.trust, 3), "load": c.load}
                for c in self.candidates
            ],
        }


def route(assigned: str, candidates: Sequence[Candidate], *, threshold: float) -> Routing:
    """Choose who runs a leaf planned for `assigned` among `candidates` (assigned included if able).

    The assigned agent keeps the leaf while it is trusted at least `threshold`; otherwise the
    best trusted candidate by trust and load takes it; when every candidate is under the
    threshold (or there is none) the routing escalates to a person.
    """
    ranked = tuple(sorted(candidates, key=lambda c: (-c.merit, c.agent)))
    mine = next((c for c in ranked if c.agent == assigned), None)
    if mine is not None and mine.trust >= threshold:
        return Routing(
            agent=assigned,
            escalate=False,
            rationale=f"{assigned} as planned: trust {mine.trust:.2f} ≥ {threshold:.2f}, "
            f"load {mine.load}",
            candidates=ranked,
        )
    trusted = [c for c in ranked if c.trust >= threshold]
    why = (
        f"{assigned} is not available"
        if mine is None
        else f"{assigned} is trusted {mine.trust:.2f} < {threshold:.2f}"
    )
    if not trusted:
        return Routing(
            agent=None,
            escalate=True,
            rationale=f"{why}; no candidate is trusted {threshold:.2f} or more",
            candidates=ranked,
        )
    best = trusted[0]
    return Routing(
        agent=best.agent,
        escalate=False,
        rationale=f"{why}; {best.agent} takes it: trust {best.trust:.2f}, load {best.load}",
        candidates=ranked,
    )


def cold_start(assigned: str, prior: float, *, threshold: float) -> Routing:
    """Route a leaf to `assigned` although its trust is under `threshold`: it has no outcomes yet
    (its trust is only its prior) and a person approved the leaf, so nobody is asked again."""
    return Routing(
        agent=assigned,
        escalate=False,
        rationale=f"{assigned} as planned: no history yet (prior trust {prior:.2f} < "
        f"{threshold:.2f}); a person approved the step",
        candidates=(Candidate(agent=assigned, trust=prior),),
    )
