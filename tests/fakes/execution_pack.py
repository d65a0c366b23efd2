"""A domain pack for execution tests: the case's inputs script the DAG, the tools misbehave.

Registered through `CASEHUB_EXTRA_PACKS=tests.fakes.execution_pack.PACK` in the test process and
in the worker processes. Effects are files under `CASEHUB_TEST_EFFECTS_DIR`: a tool that honours
its idempotency key creates one effect file per key (O_EXCL), and counts every invocation on the
side, so a test tells "ran twice" from "acted twice".

The tools are declared `read` so that only the plan gate opens (the fault tests are about
execution, not gating); a leaf may still ask for a step gate by declaring its risk.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from planning.core.catalogue import AgentSpec, ToolCall, ToolSpec, TransientToolError
from planning.core.pack import DomainPack
from planning.core.static import Method, MethodLibrary, Step
from planning.packs.schema import PackModel

SLUG = "exec-test"


class LeafScript(PackModel):
    key: str = Field(pattern=r"^[a-z0-9-]{1,40}$")
    tool: Literal["effect", "flaky", "fail", "kill_worker", "stubborn"] = "effect"
    seconds: float = Field(default=0.0, ge=0, le=120)
    failures: int = Field(default=0, ge=0, le=10)
    act_first: bool = False
    depends_on: list[str] = Field(default_factory=list)
    failure_policy: Literal["retry", "continue", "abort", "escalate", "replan"] = "abort"
    risk: Literal["read", "write", "financial"] | None = None


class ScriptInput(PackModel):
    leaves: list[LeafScript] = Field(min_length=1, max_length=1000)


class EffectArgs(PackModel):
    label: str = Field(max_length=40)
    seconds: float = Field(default=0.0, ge=0, le=120)
    failures: int = Field(default=0, ge=0, le=10)
    act_first: bool = False


class EffectResult(PackModel):
    label: str
    effects: int
    invocations: int


class EffectsPort:
    """Effect files under a directory, bound to one leaf's idempotency key."""

    def __init__(self, call: ToolCall | None = None) -> None:
        self.root = Path(os.environ.get("CASEHUB_TEST_EFFECTS_DIR", "/tmp/casehub-effects"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.call = call

    def with_call(self, call: ToolCall) -> EffectsPort:
        return EffectsPort(call)

    def _name(self) -> str:
        key = self.call.idempotency_key if self.call else "no-key"
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def invoked(self) -> int:
        """Count one more invocation of this leaf's tool; return the count."""
        with (self.root / f"{self._name()}.invocations").open("a") as log:
            log.write(f"{os.getpid()}\n")
        return len((self.root / f"{self._name()}.invocations").read_text().splitlines())

    def act(self) -> int:
        """Do the effect once per idempotency key (after the safe point); return effects so far."""
        if self.call is not None:
            self.call.checkpoint()
        path = self.root / f"{self._name()}.effect"
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(fd, b"done\n")
            os.close(fd)
        return len(list(self.root.glob(f"{self._name()}.effect")))


def effect(args: EffectArgs, port: EffectsPort) -> EffectResult:
    """Wait `seconds`, then act once per idempotency key (or act first, then wait)."""
    calls = port.invoked()
    if args.act_first:
        port.act()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return EffectResult(label=args.label, effects=port.act(), invocations=calls)


def flaky(args: EffectArgs, port: EffectsPort) -> EffectResult:
    """Fail transiently on the first `failures` invocations, then act."""
    calls = port.invoked()
    if calls <= args.failures:
        raise TransientToolError(f"upstream busy (invocation {calls})")
    return EffectResult(label=args.label, effects=port.act(), invocations=calls)


def fail(args: EffectArgs, port: EffectsPort) -> EffectResult:
    """Fail permanently."""
    port.invoked()
    raise ValueError(f"{args.label}: the record is malformed")


def kill_worker(args: EffectArgs, port: EffectsPort) -> EffectResult:
    """Kill the process running it, every time (a poison leaf)."""
    port.invoked()
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def stubborn(args: EffectArgs, port: EffectsPort) -> EffectResult:
    """Sleep `seconds`, ignoring the soft time limit (only the hard limit ends it)."""
    calls = port.invoked()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except Exception:  # noqa: S112 (the point: it swallows the soft limit)
            continue
    return EffectResult(label=args.label, effects=port.act(), invocations=calls)


TOOLS = tuple(
    ToolSpec(
        name=f"exec_{func.__name__}",
        description=func.__doc__ or func.__name__,
        input_model=EffectArgs,
        output_model=EffectResult,
        risk="read",
        func=func,
    )
    for func in (effect, flaky, fail, kill_worker, stubborn)
)

AGENT = AgentSpec(
    slug="exec-test-worker",
    name="Execution test worker",
    kind="tool",
    description="Runs the execution test tools",
    capabilities=("exec.test",),
    tools=tuple(t.name for t in TOOLS),
    trust=0.95,
)


def _steps(state: Mapping[str, Any]) -> list[Step]:
    return [
        Step(
            key=leaf["key"],
            agent=AGENT.slug,
            task=f"{leaf['tool']} {leaf['key']}",
            tool=f"exec_{leaf['tool']}",
            inputs={
                "label": leaf["key"],
                "seconds": leaf["seconds"],
                "failures": leaf["failures"],
                "act_first": leaf["act_first"],
            },
            depends_on=tuple(leaf["depends_on"]),
            expected_output="EffectResult",
            failure_policy=leaf["failure_policy"],
            risk=leaf["risk"],
        )
        for leaf in state["leaves"]
    ]


PACK = DomainPack(
    slug=SLUG,
    name="Execution tests",
    description="Scripted DAGs whose tools misbehave on purpose",
    input_schema=ScriptInput,
    root_task="run-script",
    methods=MethodLibrary(
        [Method(name="run-script-as-written", task="run-script", decompose=_steps)]
    ),
    agents=(AGENT,),
    tools=TOOLS,
    demo_port=EffectsPort,
)


def effect_counts(root: Path, key: str) -> tuple[int, int]:
    """Return (effects, invocations) recorded under `root` for an idempotency key."""
    name = hashlib.sha256(key.encode()).hexdigest()[:32]
    effects = len(list(root.glob(f"{name}.effect")))
    log = root / f"{name}.invocations"
    return effects, len(log.read_text().splitlines()) if log.exists() else 0
