"""Whether a goal has several parts, to flag a one-step plan that may cover only one of them.

A goal has several parts when the pack's own method for its task makes two or more steps of the
case (its guard holding), or when its text (name and description) has two or more parts of at
least two words each, split at "and", "then", a comma, a semicolon, a colon, a full stop or a
line break ("verify the invoice and pay the supplier"). The check only adds a warning for the
reviewer: it never rejects a plan.
"""

from __future__ import annotations

import re

from planning.core.llm.examples import DecompositionExample
from planning.core.tree import Goal

__all__ = ["goal_parts", "several_parts"]

_SPLIT = re.compile(
    r"\s*(?:[.;,:](?=\s|$)|\n)\s*(?:(?:and\s+)?then\s+|and\s+)?|\s+(?:and\s+then|then|and)\s+",
    re.IGNORECASE,
)
_MIN_WORDS = 2
_QUOTED_PARTS = 3


def goal_parts(text: str) -> tuple[str, ...]:
    """Return the parts of a goal's text that have at least two words each."""
    parts = (" ".join(part.split()) for part in _SPLIT.split(text))
    return tuple(part for part in parts if len(part.split()) >= _MIN_WORDS)


def several_parts(goal: Goal, example: DecompositionExample | None) -> str:
    """Return why `goal` has several parts, or "" when it has one.

    `example` is the pack's method for the goal's own task, made of this case's state.
    """
    if (
        example is not None
        and example.is_for_this_case
        and example.task == goal.name
        and len(example.steps) > 1
    ):
        return f"the pack's method {example.method!r} plans it in {len(example.steps)} steps"
    parts = goal_parts(f"{goal.name}\n{goal.description}")
    if len(parts) > 1:
        quoted = ", ".join(repr(part) for part in parts[:_QUOTED_PARTS])
        more = f" and {len(parts) - _QUOTED_PARTS} more" if len(parts) > _QUOTED_PARTS else ""
        return f"its text names {len(parts)} parts: {quoted}{more}"
    return ""
