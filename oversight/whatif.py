"""The policy what-if: what a draft gating policy would have done to plans, beside the active one.

Pure Python (no Django), like `oversight.policy`, whose `classify` it calls — the very function
the gates are opened with — once under each policy on the same facts of a leaf. Nothing here
opens a gate or writes a row: the caller gathers the facts and stores the report.

Each leaf falls in one of three classes under a policy: `autonomous` (no step gate), `gate` (a
step gate) or `signature` (a step gate whose approval is an electronic signature). Comparing the
two classes (and, for a leaf gated under both, the terms of its gate) gives one change kind:

- `gated`: autonomous under the active policy, gated under the draft (a signature or not);
- `ungated`: gated under the active policy, autonomous under the draft;
- `signature`: a plain gate under the active policy, a signature under the draft;
- `reclassified`: gated under both, but on other terms: no longer a signature, another quorum,
  risk level or approver group, or gated by other classifiers;
- `unchanged`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oversight.policy import (
    CLASSIFIERS,
    Classification,
    Classifier,
    LeafFacts,
    PolicySettings,
    classify,
)

AUTONOMOUS = "autonomous"
GATE = "gate"
SIGNATURE = "signature"
CLASSES = (AUTONOMOUS, GATE, SIGNATURE)

GATED = "gated"
UNGATED = "ungated"
TO_SIGNATURE = "signature"
RECLASSIFIED = "reclassified"
UNCHANGED = "unchanged"
# The change kinds a report counts, in the order it shows them.
CHANGES = (GATED, UNGATED, TO_SIGNATURE, RECLASSIFIED, UNCHANGED)

# What each change kind and class is called where a report is shown.
CHANGE_LABELS = {
    GATED: "Newly gated",
    UNGATED: "No longer gated",
    TO_SIGNATURE: "Newly sent to signature",
    RECLASSIFIED: "Re-classified",
    UNCHANGED: "Unchanged",
}
CLASS_LABELS = {AUTONOMOUS: "no gate", GATE: "gate", SIGNATURE: "gate with e-signature"}

# A report keeps the cases with a change, the most changed first, up to this many; and per case
# up to this many changed steps (the counts always cover every one).
CASE_ROWS = 500
STEPS_PER_CASE = 20


def step_class(classification: Classification) -> str:
    """Return the leaf's class under one policy: autonomous, gate or signature."""
    if not classification.gated:
        return AUTONOMOUS
    return SIGNATURE if classification.needs_signature else GATE


def _terms(classification: Classification) -> tuple[Any, ...]:
    return (
        classification.needs_signature,
        classification.quorum,
        classification.level,
        classification.approver_group,
        frozenset(f.classifier for f in classification.reasons),
    )


def change_kind(before: Classification, after: Classification) -> str:
    """Return how a leaf's gating changes from `before` (active) to `after` (draft)."""
    old, new = step_class(before), step_class(after)
    if old == AUTONOMOUS and new != AUTONOMOUS:
        return GATED
    if old != AUTONOMOUS and new == AUTONOMOUS:
        return UNGATED
    if old == GATE and new == SIGNATURE:
        return TO_SIGNATURE
    if old != AUTONOMOUS and _terms(before) != _terms(after):
        return RECLASSIFIED
    return UNCHANGED


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutcome:
    """One leaf replayed: its class and reason under each policy, and the change kind."""

    key: str
    before: str
    after: str
    change: str
    before_reason: str = ""
    after_reason: str = ""

    def as_data(self) -> dict[str, str]:
        """Return the outcome as JSON-ready data (the report stores changed steps so)."""
        return {
            "key": self.key,
            "before": self.before,
            "after": self.after,
            "change": self.change,
            "before_reason": self.before_reason,
            "after_reason": self.after_reason,
        }


def compare_leaf(
    facts: LeafFacts,
    active: PolicySettings,
    draft: PolicySettings,
    classifiers: Iterable[Classifier] = CLASSIFIERS,
) -> StepOutcome:
    """Classify one leaf under the active and the draft policy and say what changes."""
    chosen = tuple(classifiers)
    before = classify(facts, active, chosen)
    after = classify(facts, draft, chosen)
    return StepOutcome(
        key=facts.key,
        before=step_class(before),
        after=step_class(after),
        change=change_kind(before, after),
        before_reason=before.reason,
        after_reason=after.reason,
    )


def compare_plan(
    leaves: Iterable[LeafFacts],
    active: PolicySettings,
    draft: PolicySettings,
    classifiers: Iterable[Classifier] = CLASSIFIERS,
) -> list[StepOutcome]:
    """Replay every leaf of one plan version under both policies (in the leaves' order)."""
    chosen = tuple(classifiers)
    return [compare_leaf(facts, active, draft, chosen) for facts in leaves]


@dataclass(slots=True)
class _CaseTally:
    versions: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    # A step key → its latest changed outcome (a later version of the case replaces it).
    steps: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass(slots=True)
class WhatIfTally:
    """The running totals of a what-if over many plan versions, and its rows per case."""

    versions: int = 0
    steps: int = 0
    totals: Counter[str] = field(default_factory=Counter)
    before: Counter[str] = field(default_factory=Counter)
    after: Counter[str] = field(default_factory=Counter)
    # The cases with a change; a case's `versions` counts its replayed versions with a change.
    _cases: dict[int, _CaseTally] = field(default_factory=dict)

    def add(self, case_id: int, outcomes: Iterable[StepOutcome]) -> None:
        """Count one replayed plan version of the case (versions oldest first)."""
        self.versions += 1
        row: _CaseTally | None = None
        for outcome in outcomes:
            self.steps += 1
            self.totals[outcome.change] += 1
            self.before[outcome.before] += 1
            self.after[outcome.after] += 1
            if outcome.change == UNCHANGED:
                continue
            if row is None:
                row = self._cases.setdefault(case_id, _CaseTally())
            row.counts[outcome.change] += 1
            row.steps[outcome.key] = outcome.as_data()
        if row is not None:
            row.versions += 1

    @property
    def changed_cases(self) -> int:
        return len(self._cases)

    def case_rows(
        self, limit: int = CASE_ROWS, steps_per_case: int = STEPS_PER_CASE
    ) -> list[dict[str, Any]]:
        """Return the cases with a change, the most changed first (then the newest case)."""
        ranked = sorted(
            self._cases.items(), key=lambda item: (-sum(item[1].counts.values()), -item[0])
        )
        return [
            {
                "case": case_id,
                "versions": row.versions,
                "counts": {kind: row.counts[kind] for kind in CHANGES if row.counts[kind]},
                "steps": list(row.steps.values())[:steps_per_case],
                "more_steps": max(0, len(row.steps) - steps_per_case),
            }
            for case_id, row in ranked[:limit]
        ]

    def summary(self) -> dict[str, Any]:
        """Return the totals as JSON-ready data: steps per change kind and per class."""
        return {
            "versions": self.versions,
            "steps": self.steps,
            "changed_cases": self.changed_cases,
            "changes": {kind: self.totals[kind] for kind in CHANGES},
            "before": {name: self.before[name] for name in CLASSES},
            "after": {name: self.after[name] for name in CLASSES},
        }


def empty_summary() -> dict[str, Any]:
    """Return the totals of a what-if that replayed nothing (yet)."""
    return WhatIfTally().summary()


def totals_from(data: Mapping[str, Any]) -> dict[str, int]:
    """Return the per-change-kind totals stored in a summary, zero for a kind it lacks."""
    changes = data.get("changes", {}) if isinstance(data, Mapping) else {}
    return {kind: int(changes.get(kind, 0) or 0) for kind in CHANGES}


__all__ = [
    "AUTONOMOUS",
    "CASE_ROWS",
    "CHANGES",
    "CHANGE_LABELS",
    "CLASSES",
    "CLASS_LABELS",
    "GATE",
    "GATED",
    "RECLASSIFIED",
    "SIGNATURE",
    "STEPS_PER_CASE",
    "TO_SIGNATURE",
    "UNCHANGED",
    "UNGATED",
    "StepOutcome",
    "WhatIfTally",
    "change_kind",
    "compare_leaf",
    "compare_plan",
    "empty_summary",
    "step_class",
    "totals_from",
]
