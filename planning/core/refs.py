"""References from a tool input to an upstream leaf's output: the `$ref` vocabulary.

A tool input may reference an upstream leaf's output instead of a literal value:
`{"$ref": "<leaf key>", "field": "<output field>"}` (without `field`: the whole output).
`planning.core.validation` checks the referenced leaf is upstream of the consumer in the DAG;
`resolve_inputs` replaces references with actual outputs at execution time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from planning.core.errors import PlanInvalid
from planning.core.tree import thaw

REF_KEY = "$ref"


def ref(key: str, field: str | None = None) -> dict[str, str]:
    """Return an input value that stands for the output (field) of leaf `key`."""
    return {REF_KEY: key} if field is None else {REF_KEY: key, "field": field}


def is_ref(value: Any) -> bool:
    """Tell whether an input value is a reference to an upstream output."""
    return isinstance(value, Mapping) and REF_KEY in value and set(value) <= {REF_KEY, "field"}


def referenced_keys(inputs: Mapping[str, Any]) -> tuple[str, ...]:
    """Return the leaf keys whose outputs `inputs` reference, each once, in input order."""
    return tuple(dict.fromkeys(str(value[REF_KEY]) for value in inputs.values() if is_ref(value)))


def resolve_inputs(inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> dict[str, Any]:
    """Return `inputs` with references replaced by values from `outputs` (leaf key → output).

    Raises `PlanInvalid` when a referenced output or field is missing.
    """
    resolved: dict[str, Any] = {}
    for name, value in thaw(inputs).items():
        if not is_ref(value):
            resolved[name] = value
            continue
        key = str(value[REF_KEY])
        if key not in outputs:
            raise PlanInvalid(
                f"input {name!r} needs the output of {key!r}, which is missing", (key,)
            )
        output = outputs[key]
        if isinstance(output, BaseModel):
            output = output.model_dump(mode="json")
        if "field" in value:
            if not isinstance(output, Mapping) or value["field"] not in output:
                raise PlanInvalid(
                    f"input {name!r}: output of {key!r} has no field {value['field']!r}", (key,)
                )
            resolved[name] = output[value["field"]]
        else:
            resolved[name] = output
    return resolved
