"""The execution bench's domain pack: layered DAGs of leaves that sleep, planned statically.

A case names a shape: `layers` layers of `width` leaves; leaf `j` of layer `i` depends on leaves
`j, j+1, …, j+fan_in-1` (mod `width`) of layer `i-1`, and sleeps `sleep_ms` milliseconds (0: a
no-op). Each layer is a compound of its own (fan-out `width`; the root's is `layers`), so the
planning limits only need raising for the bench (`CASEHUB_PLAN_MAX_LEAVES`,
`CASEHUB_PLAN_MAX_FANOUT`). The tool is a `read` and its agent is trusted 0.9: only the plan
gate opens. Registered by `CASEHUB_EXTRA_PACKS=bench.execution_pack.PACK`, in the bench process
and in its workers alike.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from planning.core.catalogue import AgentSpec, ToolSpec
from planning.core.pack import DomainPack, case_inputs
from planning.core.static import Method, MethodLibrary
from planning.core.tree import Compound, Leaf, Provenance

SLUG = "bench-execution"
AGENT = "bench-runner"
TOOL = "bench_sleep"
PATH = "bench.execution_pack.PACK"
# Replaced by the planner's own provenance (static, this method, the node's depth).
_PLACEHOLDER = Provenance(strategy="static", source="bench-execution-layers", depth=1)


class BenchDagInput(BaseModel):
    """The shape of a bench case's DAG."""

    model_config = ConfigDict(extra="forbid")

    layers: int = Field(10, ge=1, le=200)
    width: int = Field(20, ge=1, le=100)
    fan_in: int = Field(3, ge=1, le=100)
    sleep_ms: int = Field(50, ge=0, le=10_000)


class SleepInput(BaseModel):
    """How long one leaf sleeps."""

    model_config = ConfigDict(extra="forbid")

    ms: int = Field(ge=0, le=10_000)


class SleepDone(BaseModel):
    """What one leaf did."""

    slept_ms: int


def sleep(arguments: SleepInput, port: Any) -> SleepDone:
    """Sleep the leaf's milliseconds (nothing for 0) and say so; raises nothing."""
    if arguments.ms:
        time.sleep(arguments.ms / 1000)
    return SleepDone(slept_ms=arguments.ms)


def leaf_key(layer: int, index: int) -> str:
    """Return the key of leaf `index` of `layer` (both 0-based)."""
    return f"l{layer:03d}-{index:03d}"


def dependencies(layer: int, index: int, *, width: int, fan_in: int) -> tuple[str, ...]:
    """Return the keys of the leaves of the previous layer that a leaf waits for."""
    if layer == 0:
        return ()
    picked = dict.fromkeys((index + k) % width for k in range(min(fan_in, width)))
    return tuple(leaf_key(layer - 1, j) for j in picked)


def layered_dag(shape: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Return the DAG of a shape as leaf key → the keys it depends on (in layer order)."""
    dag = BenchDagInput.model_validate(dict(shape))
    return {
        leaf_key(i, j): dependencies(i, j, width=dag.width, fan_in=dag.fan_in)
        for i in range(dag.layers)
        for j in range(dag.width)
    }


def _layers(state: Mapping[str, Any]) -> list[Compound]:
    dag = BenchDagInput.model_validate(case_inputs(state))
    return [
        Compound(
            key=f"layer-{i:03d}",
            name=f"layer {i}",
            # Independent: each leaf names the leaves it waits for, not the whole layer before.
            depends_on=(),
            provenance=_PLACEHOLDER,
            children=tuple(
                Leaf(
                    key=leaf_key(i, j),
                    agent=AGENT,
                    task=f"Sleep {dag.sleep_ms} ms (layer {i}, leaf {j})",
                    tool=TOOL,
                    inputs={"ms": dag.sleep_ms},
                    depends_on=dependencies(i, j, width=dag.width, fan_in=dag.fan_in),
                    expected_output="SleepDone",
                    provenance=_PLACEHOLDER,
                )
                for j in range(dag.width)
            ),
        )
        for i in range(dag.layers)
    ]


PACK = DomainPack(
    slug=SLUG,
    name="Execution bench",
    description="Layered DAGs of sleeping leaves for the execution benchmark",
    input_schema=BenchDagInput,
    root_task="bench-dag",
    methods=MethodLibrary(
        [
            Method(
                name="bench-execution-layers",
                task="bench-dag",
                decompose=_layers,
                description="one compound per layer, each leaf after a few of the layer before",
            )
        ]
    ),
    agents=(
        AgentSpec(
            slug=AGENT,
            name="Bench runner",
            kind="tool",
            description="Sleeps as long as the leaf says",
            capabilities=("bench.sleep",),
            tools=(TOOL,),
            trust=0.9,
        ),
    ),
    tools=(
        ToolSpec(
            name=TOOL,
            description="Sleep a number of milliseconds",
            input_model=SleepInput,
            output_model=SleepDone,
            risk="read",
            func=sleep,
        ),
    ),
)
