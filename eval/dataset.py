"""The evaluation set: goals with their inputs, a reference plan and constraints (pydantic).

One JSON file per pack under `eval/goals/` (and `general.json` for goals without a pack), each a
list of goals. A reference plan is a flat list of leaves (agent, tool, task, dependencies by key),
written by hand from the pack's agents, tools and methods.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from planning.core.catalogue import Catalogue
from planning.core.dag import DagPlan
from planning.core.pack import DomainPack
from planning.core.tree import Compound, Goal, Leaf, Provenance
from planning.packs import PACKS

GOALS_DIR = Path(__file__).resolve().parent / "goals"
REFERENCE_ROOT = "reference"
_SELECTOR = re.compile(r"^(tool|agent):[A-Za-z0-9_.-]+$")

type GoalKind = Literal["easy", "ambiguous", "adversarial"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReferenceLeaf(_Model):
    """One step of a reference plan."""

    key: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    agent: str = Field(min_length=1)
    tool: str | None = None
    task: str = Field(min_length=1)
    depends_on: tuple[str, ...] = ()


class Constraints(_Model):
    """What any acceptable plan for the goal must meet.

    An order `(before, after)` holds when every leaf matching `after` has a leaf matching
    `before` upstream of it; selectors are `tool:<name>` or `agent:<slug>`.
    """

    required_tools: tuple[str, ...] = ()
    forbidden_tools: tuple[str, ...] = ()
    required_agents: tuple[str, ...] = ()
    forbidden_agents: tuple[str, ...] = ()
    orders: tuple[tuple[str, str], ...] = ()
    max_leaves: int = Field(default=20, ge=1)

    @field_validator("orders")
    @classmethod
    def _selectors(cls, orders: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        for pair in orders:
            for selector in pair:
                if not _SELECTOR.match(selector):
                    raise ValueError(f"{selector!r} is not tool:<name> or agent:<slug>")
        return orders


class EvalGoal(_Model):
    """A goal of the evaluation set."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    pack: str | None = None
    kind: GoalKind
    goal: str = Field(min_length=1)
    description: str = ""
    inputs: dict[str, Any] = Field(default_factory=dict)
    reference: tuple[ReferenceLeaf, ...] = Field(min_length=1)
    constraints: Constraints = Constraints()
    notes: str = ""

    @model_validator(mode="after")
    def _known_pack_and_inputs(self) -> EvalGoal:
        if self.pack is not None:
            if self.pack not in PACKS:
                raise ValueError(f"unknown pack {self.pack!r}")
            PACKS[self.pack].initial_state(self.inputs)  # raises when the form would refuse them
        keys = [leaf.key for leaf in self.reference]
        if len(keys) != len(set(keys)):
            raise ValueError(f"goal {self.id!r}: reference keys repeat")
        return self

    @property
    def domain_pack(self) -> DomainPack | None:
        """Return the goal's pack, None for a goal without one."""
        return None if self.pack is None else PACKS[self.pack]

    def planning_goal(self) -> Goal:
        """Return the goal the planner gets, as `planning.planner.build_request` builds it."""
        pack = self.domain_pack
        if pack is None:
            return Goal(name=self.goal, description=self.description)
        text = "\n\n".join(part for part in (self.goal, self.description) if part.strip())
        return Goal(name=pack.root_task, description=text)

    def state(self) -> dict[str, Any]:
        """Return the planning state: the inputs as the pack's form validates them."""
        pack = self.domain_pack
        return pack.initial_state(self.inputs) if pack else dict(self.inputs)

    def reference_plan(self) -> DagPlan:
        """Return the reference as a plan (one compound over the leaves).

        Raises `PlanInvalid` for unknown keys and cycles.
        """
        provenance = Provenance(strategy="static", source="reference", depth=1)
        leaves = tuple(
            Leaf(
                key=leaf.key,
                agent=leaf.agent,
                tool=leaf.tool,
                task=leaf.task,
                depends_on=leaf.depends_on,
                provenance=provenance,
            )
            for leaf in self.reference
        )
        root = Compound(
            key=REFERENCE_ROOT,
            name=self.goal,
            children=leaves,
            provenance=Provenance(strategy="static", source="reference", depth=0),
        )
        return DagPlan.build(root)


def catalogue_for(pack: DomainPack | None) -> Catalogue:
    """Return the agents and tools a goal's plans may use: its pack's, or every pack's.

    Without a pack the planner offers every enabled agent (`planning.catalogue.planning_agents`),
    which after `sync_packs` are the packs' own.
    """
    if pack is not None:
        return pack.catalogue()
    return Catalogue.from_specs(
        [agent for p in PACKS.values() for agent in p.agents],
        [tool for p in PACKS.values() for tool in p.tools],
    )


def load_goals(directory: Path = GOALS_DIR, only: Sequence[str] = ()) -> tuple[EvalGoal, ...]:
    """Return the goals of every `*.json` file under `directory`, sorted by file then order.

    `only` keeps the goals whose id starts with one of its prefixes. Raises
    `pydantic.ValidationError` for a goal that does not fit, `ValueError` for a repeated id.
    """
    goals: list[EvalGoal] = []
    for path in sorted(directory.glob("*.json")):
        goals.extend(EvalGoal.model_validate(item) for item in json.loads(path.read_text()))
    ids = [goal.id for goal in goals]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise ValueError(f"goal ids repeat: {', '.join(repeated)}")
    if only:
        goals = [goal for goal in goals if goal.id.startswith(tuple(only))]
    return tuple(goals)
