"""Task-level verification: a leaf's output checked against its expected-output schema."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from execution.common import ErrorClass, LeafError
from planning.catalogue import registered_packs
from planning.core.errors import flatten_errors
from planning.models import PlanNode


def output_schemas() -> dict[str, type[BaseModel]]:
    """Return every pydantic model a pack's tools name, by class name (expected outputs)."""
    found: dict[str, type[BaseModel]] = {}
    for pack in registered_packs().values():
        for tool in pack.tools:
            found.setdefault(tool.output_model.__name__, tool.output_model)
            found.setdefault(tool.input_model.__name__, tool.input_model)
    return found


def check_output(node: PlanNode, output: Mapping[str, Any]) -> dict[str, Any]:
    """Check an output against the leaf's expected-output schema (task-level verification).

    Returns the output as JSON data. Raises LeafError(output_invalid) naming the fields when it
    does not fit; an output without a known schema must still be a JSON object.
    """
    if not isinstance(output, Mapping):
        raise LeafError(ErrorClass.OUTPUT_INVALID, "the output is not a JSON object")
    model = output_schemas().get(node.expected_output) if node.expected_output else None
    if model is None:
        return dict(output)
    try:
        return model.model_validate(dict(output)).model_dump(mode="json")
    except ValidationError as exc:
        problems = flatten_errors(exc.errors(), "output")
        detail = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(problems.items()))
        raise LeafError(
            ErrorClass.OUTPUT_INVALID,
            f"the output does not fit {node.expected_output}: {detail}",
        ) from exc
