"""Validate a plan against the agent/tool catalogue and plan limits, whatever its source.

A tool input that references an upstream leaf's output (`planning.core.refs`) must name a leaf
upstream of the consumer in the DAG, and an output field its tool has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from planning.core.catalogue import Catalogue
from planning.core.dag import DagPlan
from planning.core.errors import PlanInvalid, flatten_errors
from planning.core.refs import REF_KEY, is_ref
from planning.core.tree import Compound, Leaf, thaw


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanLimits:
    """Size limits every plan must respect."""

    max_leaves: int = 200
    max_fan_out: int = 25
    max_depth: int = 6


def _input_problems(
    leaf: Leaf, model: type[BaseModel], plan: DagPlan, catalogue: Catalogue
) -> list[str]:
    inputs = thaw(leaf.inputs)
    refs = {name: value for name, value in inputs.items() if is_ref(value)}
    if not refs:
        try:
            model.model_validate(inputs)
        except ValidationError as exc:
            return [f"{leaf.key!r}: inputs invalid for tool {leaf.tool!r}: {_short(exc)}"]
        return []
    problems: list[str] = []
    fields = model.model_fields
    upstream = plan.upstream(leaf.key)
    for name, value in inputs.items():
        if name not in fields:
            if model.model_config.get("extra") == "forbid":
                problems.append(f"{leaf.key!r}: tool {leaf.tool!r} has no input {name!r}")
            continue
        if name in refs:
            source = str(value[REF_KEY])
            if source not in upstream:
                problems.append(
                    f"{leaf.key!r}: input {name!r} refers to {source!r}, which is not upstream"
                )
                continue
            producer = plan.node(source)
            tool = catalogue.tools.get(producer.tool or "") if isinstance(producer, Leaf) else None
            wanted = value.get("field")
            if (
                tool is not None
                and wanted is not None
                and wanted not in tool.output_model.model_fields
            ):
                problems.append(
                    f"{leaf.key!r}: input {name!r} refers to missing output field "
                    f"{wanted!r} of {source!r}"
                )
            continue
        info = fields[name]
        try:
            annotated: Any = Annotated[info.annotation, info]
            TypeAdapter(annotated).validate_python(value)
        except ValidationError as exc:
            problems.append(f"{leaf.key!r}: input {name!r} invalid: {_short(exc)}")
    for name, info in fields.items():
        if info.is_required() and name not in inputs:
            problems.append(f"{leaf.key!r}: tool {leaf.tool!r} needs input {name!r}")
    return problems


def _short(exc: ValidationError) -> str:
    return "; ".join(
        f"{path}: {message}"
        for path, messages in flatten_errors(exc.errors(include_url=False)).items()
        for message in messages
    )


def _depth(plan: DagPlan, key: str) -> int:
    depth = 0
    parent = plan.parent_of(key)
    while parent is not None:
        depth += 1
        parent = plan.parent_of(parent.key)
    return depth


def validate_plan(plan: DagPlan, catalogue: Catalogue, limits: PlanLimits | None = None) -> None:
    """Check agents, tools, tool inputs and limits; raise `PlanInvalid` listing every problem."""
    limits = limits or PlanLimits()
    problems: list[str] = []
    keys: list[str] = []

    def flag(key: str, message: str) -> None:
        problems.append(message)
        if key not in keys:
            keys.append(key)

    if len(plan.leaves) > limits.max_leaves:
        flag(plan.root.key, f"plan has {len(plan.leaves)} leaves, limit {limits.max_leaves}")
    for node in plan.nodes():
        if isinstance(node, Compound) and len(node.children) > limits.max_fan_out:
            flag(
                node.key,
                f"{node.key!r} has {len(node.children)} children, fan-out limit "
                f"{limits.max_fan_out}",
            )
    for leaf in plan.leaves:
        if _depth(plan, leaf.key) > limits.max_depth:
            flag(leaf.key, f"{leaf.key!r} is nested deeper than {limits.max_depth} levels")
        agent = catalogue.agents.get(leaf.agent)
        if agent is None:
            flag(leaf.key, f"{leaf.key!r}: unknown agent {leaf.agent!r}")
            continue
        if not agent.enabled:
            flag(leaf.key, f"{leaf.key!r}: agent {leaf.agent!r} is disabled")
        if leaf.tool is None:
            # an llm or human agent acts on the task itself; a tool agent only runs its tool
            if agent.kind == "tool":
                flag(leaf.key, f"{leaf.key!r}: tool agent {leaf.agent!r} has no tool to run")
            continue
        if leaf.tool not in agent.tools:
            flag(leaf.key, f"{leaf.key!r}: tool {leaf.tool!r} is not allowed for {leaf.agent!r}")
            continue
        tool = catalogue.tools.get(leaf.tool)
        if tool is None:
            flag(leaf.key, f"{leaf.key!r}: unknown tool {leaf.tool!r}")
            continue
        for problem in _input_problems(leaf, tool.input_model, plan, catalogue):
            flag(leaf.key, problem)
    if problems:
        raise PlanInvalid("; ".join(problems), keys)
