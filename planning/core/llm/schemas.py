"""Pydantic models of the decomposition answers the model is asked for (DESIGN §3).

An answer is ``{"steps": [...]}``; a step is an agent assignment
``{"id", "agent", "task", "rationale", "depends_on"}`` or, below the last level, a nested entry
``{"id", "subtask", "description", "depends_on"}`` that is decomposed again one level deeper.
``depends_on`` names earlier steps of the same answer: ``null`` means "after the previous step",
``[]`` means independent. A bare JSON list of steps is accepted too.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

__all__ = [
    "STEP_ID_PATTERN",
    "AgentPlanResponse",
    "AgentStep",
    "NestedPlanResponse",
    "Step",
    "SubtaskStep",
]

STEP_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"

_ID_DESCRIPTION = "short unique id of this step: letters, digits, '-' or '_' (no dots or spaces)"
_DEPENDS_DESCRIPTION = (
    "ids of EARLIER steps this step waits for; null = after the previous step; [] = independent"
)


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value.strip()


class AgentStep(BaseModel):
    """One executable step assigned to one agent."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=STEP_ID_PATTERN, description=_ID_DESCRIPTION)
    agent: str = Field(description="the id of one of the available agents")
    task: str = Field(description="what the agent must do, as one concrete action")
    rationale: str = Field(description="why this agent and this step")
    depends_on: list[str] | None = Field(default=None, description=_DEPENDS_DESCRIPTION)

    _agent = field_validator("agent", "task")(_not_blank)

    @model_validator(mode="before")
    @classmethod
    def _rationale_may_be_missing(cls, data: Any) -> Any:
        # the schema asks for a rationale; an answer without one is still a usable step
        if isinstance(data, dict) and data.get("rationale") is None:
            return {**data, "rationale": ""}
        return data


class SubtaskStep(BaseModel):
    """A step too large for one agent action, decomposed again one level deeper."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=STEP_ID_PATTERN, description=_ID_DESCRIPTION)
    subtask: str = Field(description="short name of the sub-plan")
    description: str = Field(description="what the sub-plan must achieve")
    depends_on: list[str] | None = Field(default=None, description=_DEPENDS_DESCRIPTION)

    _subtask = field_validator("subtask")(_not_blank)


def _step_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "subtask" if "subtask" in value else "agent"
    return "subtask" if isinstance(value, SubtaskStep) else "agent"


type Step = AgentStep | SubtaskStep


def _check_steps(steps: list[AgentStep] | list[Step]) -> None:
    seen: set[str] = set()
    problems: list[str] = []
    for step in steps:
        if step.id in seen:
            problems.append(f"step id {step.id!r} is used twice; ids must be unique")
        for dep in step.depends_on or ():
            if dep == step.id:
                problems.append(f"step {step.id!r} cannot depend on itself")
            elif dep not in seen:
                problems.append(
                    f"step {step.id!r} depends on {dep!r}, which is not an earlier step "
                    "(depends_on may only name steps listed before it; no cycles)"
                )
        seen.add(step.id)
    if problems:
        raise ValueError("; ".join(problems))


def _wrap_bare_list(data: Any) -> Any:
    return {"steps": data} if isinstance(data, list) else data


class NestedPlanResponse(BaseModel):
    """An answer whose steps may be agent assignments or nested entries."""

    model_config = ConfigDict(extra="forbid")

    steps: list[
        Annotated[
            Annotated[AgentStep, Tag("agent")] | Annotated[SubtaskStep, Tag("subtask")],
            Discriminator(_step_kind),
        ]
    ] = Field(description="the steps, in execution order")

    _wrap = model_validator(mode="before")(_wrap_bare_list)

    @model_validator(mode="after")
    def _dependencies_name_earlier_steps(self) -> NestedPlanResponse:
        _check_steps(self.steps)
        return self


class AgentPlanResponse(BaseModel):
    """An answer made of agent assignments only (the last level)."""

    model_config = ConfigDict(extra="forbid")

    steps: list[AgentStep] = Field(description="the steps, in execution order")

    _wrap = model_validator(mode="before")(_wrap_bare_list)

    @model_validator(mode="after")
    def _dependencies_name_earlier_steps(self) -> AgentPlanResponse:
        _check_steps(self.steps)
        return self
