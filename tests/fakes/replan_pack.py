"""A domain pack for re-planning tests: one task with several methods, chosen by the inputs.

`fetch-and-report` is: prepare → fetch (a compound) → report (or, `parallel`, prepare and fetch
side by side, then report). `fetch` has one method per source
(`fetch-from-primary`, `fetch-from-mirror`, `fetch-from-backup`), tried in that order, each
applicable when the case's inputs list its source; every method fetches the index first (the
same step in each) and then the data from its source, which fails permanently when the inputs
say so. The data steps' failure policy is `replan`, unless the inputs name another.

The tools are the scripted execution pack's (effects counted per idempotency key under
`CASEHUB_TEST_EFFECTS_DIR`) under names of their own, declared `read`: only the plan gate opens.
Registered with `CASEHUB_EXTRA_PACKS=tests.fakes.replan_pack.PACK`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from planning.core.catalogue import AgentSpec, ToolSpec
from planning.core.pack import DomainPack
from planning.core.static import Method, MethodLibrary, Step, TaskRef
from planning.packs.schema import PackModel
from tests.fakes.execution_pack import EffectArgs, EffectResult, EffectsPort, effect, fail

SLUG = "replan-test"
PATH = "tests.fakes.replan_pack.PACK"
SOURCES = ("primary", "mirror", "backup")

type Source = Literal["primary", "mirror", "backup"]


class ReplanInput(PackModel):
    sources: list[Source] = Field(default_factory=lambda: list(SOURCES), min_length=1)
    failing: list[Source] = Field(default_factory=list)
    failure_policy: Literal["retry", "continue", "abort", "escalate", "replan"] = "replan"
    # Fetch while preparing (report after both) instead of after it.
    parallel: bool = False


TOOLS = (
    ToolSpec(
        name="replan_effect",
        description="Act once per idempotency key",
        input_model=EffectArgs,
        output_model=EffectResult,
        risk="read",
        func=effect,
    ),
    ToolSpec(
        name="replan_fail",
        description="Fail permanently",
        input_model=EffectArgs,
        output_model=EffectResult,
        risk="read",
        func=fail,
    ),
)

AGENT = AgentSpec(
    slug="replan-test-worker",
    name="Re-planning test worker",
    kind="tool",
    description="Runs the re-planning test tools",
    capabilities=("replan.test",),
    tools=tuple(t.name for t in TOOLS),
    trust=0.95,
)


def _step(key: str, *, fails: bool = False, policy: str = "abort", **extra: Any) -> Step:
    return Step(
        key=key,
        agent=AGENT.slug,
        task=f"{'fail' if fails else 'do'} {key}",
        tool="replan_fail" if fails else "replan_effect",
        inputs={"label": key},
        expected_output="EffectResult",
        failure_policy=policy,  # type: ignore[arg-type]
        **extra,
    )


def _root(state: Mapping[str, Any]) -> list[Step | TaskRef]:
    parallel = state["parallel"]
    return [
        _step("prepare"),
        TaskRef(
            task="fetch",
            description="Fetch the data from a source",
            depends_on=() if parallel else None,
        ),
        _step("report", depends_on=("prepare", "fetch") if parallel else None),
    ]


def _fetch_from(source: str) -> Method:
    def decompose(state: Mapping[str, Any]) -> list[Step]:
        return [
            _step("fetch-index"),
            _step(
                f"fetch-{source}",
                fails=source in state["failing"],
                policy=state["failure_policy"],
            ),
        ]

    def guard(state: Mapping[str, Any]) -> bool:
        return source in state["sources"]

    return Method(name=f"fetch-from-{source}", task="fetch", guard=guard, decompose=decompose)


PACK = DomainPack(
    slug=SLUG,
    name="Re-planning tests",
    description="A task with alternative methods whose steps fail on purpose",
    input_schema=ReplanInput,
    root_task="fetch-and-report",
    methods=MethodLibrary(
        [
            Method(name="fetch-and-report", task="fetch-and-report", decompose=_root),
            *(_fetch_from(source) for source in SOURCES),
        ]
    ),
    agents=(AGENT,),
    tools=TOOLS,
    demo_port=EffectsPort,
)
