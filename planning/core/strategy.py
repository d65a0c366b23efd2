"""The protocol every decomposition strategy implements."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from planning.core.dag import DagPlan
from planning.core.tree import Goal


class Strategy(Protocol):
    """Decompose a goal into a fully materialised `DagPlan`."""

    def plan(self, goal: Goal, state: Mapping[str, Any]) -> DagPlan:
        """Return the plan for `goal` in `state`; raise a `PlanningError` subclass on failure."""
        ...
