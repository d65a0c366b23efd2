"""Exceptions raised by the planning core."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class PlanningError(Exception):
    """Base class of every planning failure."""


class PlanInvalid(PlanningError):
    """A plan breaks a structural or catalogue rule; `keys` names the offending nodes."""

    def __init__(self, message: str, keys: Iterable[str] = ()) -> None:
        self.message = message
        self.keys: tuple[str, ...] = tuple(keys)
        super().__init__(message)


class NoMethodMatched(PlanningError):
    """No method (or capability) can decompose `task` in the given state."""

    def __init__(self, task: str, methods_tried: Iterable[str] = (), detail: str = "") -> None:
        self.task = task
        self.methods_tried: tuple[str, ...] = tuple(methods_tried)
        self.detail = detail
        tried = ", ".join(self.methods_tried) if self.methods_tried else "none available"
        message = f"no method matched task {task!r} (tried: {tried})"
        if detail:
            message = f"{message}: {detail}"
        super().__init__(message)


class BudgetExceeded(PlanningError):
    """A planning budget (calls, tokens, leaves, fan-out, search nodes) was exceeded."""

    def __init__(self, budget: str, limit: int | float, used: int | float) -> None:
        self.budget = budget
        self.limit = limit
        self.used = used
        super().__init__(f"planning budget {budget!r} exceeded: used {used}, limit {limit}")


class LlmPlanningError(PlanningError):
    """The LLM could not produce a usable decomposition (transport, unparseable, empty)."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class GoalAlreadySatisfied(PlanningError):
    """The goal's facts already hold in the state, so there is nothing to plan."""

    def __init__(self, goal: str, detail: str = "") -> None:
        self.goal = goal
        message = f"goal {goal!r} is already satisfied; nothing to plan"
        if detail:
            message = f"{message} ({detail})"
        super().__init__(message)


def error_path(loc: Sequence[Any], prefix: str = "") -> str:
    """Return a dotted field path for a pydantic error location, under `prefix` when given."""
    parts = [prefix] if prefix else []
    parts.extend(str(part) for part in loc)
    return ".".join(parts) or "__all__"


def flatten_errors(errors: Iterable[Mapping[str, Any]], prefix: str = "") -> dict[str, list[str]]:
    """Map pydantic error dicts (`exc.errors()`) to `{"dotted.path": [message, ...]}`.

    The one flattener: the API's 422 bodies, the form's field errors and the actions' checks of
    pack inputs all go through it.
    """
    fields: dict[str, list[str]] = {}
    for error in errors:
        path = error_path(tuple(error.get("loc", ())), prefix)
        fields.setdefault(path, []).append(str(error.get("msg", "Invalid value.")))
    return fields
