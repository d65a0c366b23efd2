"""How a claimed leaf runs, per agent kind, and how its output and the case's goal are checked.

`tool`: the registered tool with its validated inputs, references to upstream outputs resolved,
through its pack's data port bound to the leaf's idempotency key and safe point. `llm`: the
agent's model (see `execution.runners.llm`). `human`: a work item for the agent's group; the leaf
waits until a person completes it. Errors come back as `LeafError` with their class.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connection
from pydantic import BaseModel, ValidationError

from execution.actions import Claim, ErrorClass, LeafStopped, check_safe_point
from execution.goal_judge import judge_model
from planning.catalogue import registered_packs
from planning.core.catalogue import ToolCall, ToolSpec, TransientToolError
from planning.core.errors import PlanInvalid, flatten_errors
from planning.core.pack import DomainPack
from planning.core.refs import REF_KEY, is_ref, resolve_inputs
from planning.core.tree import thaw
from planning.models import Agent, Case, NodeStatus, PlanNode


class LeafError(Exception):
    """A leaf's attempt failed; `error_class` says how (transient errors may be retried)."""

    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


class LeafTimeLimit(Exception):
    """The leaf ran past its soft time limit."""


class WaitingForPerson(Exception):
    """A human leaf handed to its group: it ends when the work item is completed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """Goal-level verification of a case whose leaves all ended."""

    passed: bool
    reasons: tuple[str, ...]
    checks: tuple[str, ...]
    # The LLM goal judge still to ask before the case may complete ("" when none): the rules held.
    judge: str = ""


# Schemas -----------------------------------------------------------------------------------


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


# Context -------------------------------------------------------------------------------------


def upstream_outputs(node: PlanNode) -> dict[str, Any]:
    """Return the outputs of every leaf upstream of this one (directly or not), by key."""
    rows = list(
        PlanNode.objects.filter(version_id=node.version_id, kind=PlanNode.Kind.LEAF).values_list(
            "key", "depends_on", "status", "output"
        )
    )
    depends = {key: deps for key, deps, _, _ in rows}
    upstream: set[str] = set()
    frontier = set(node.depends_on)
    while frontier:
        upstream |= frontier
        frontier = {d for key in frontier for d in depends.get(key, ())} - upstream
    return {
        key: output
        for key, _, status, output in rows
        if key in upstream and status == NodeStatus.SUCCEEDED
    }


def referenced_outputs(node: PlanNode) -> dict[str, Any]:
    """Return the outputs a tool leaf's inputs refer to (`$ref`), by key: only those rows."""
    keys = {str(v[REF_KEY]) for v in thaw(node.inputs or {}).values() if is_ref(v)}
    if not keys:
        return {}
    return dict(
        PlanNode.objects.filter(
            version_id=node.version_id, key__in=keys, status=NodeStatus.SUCCEEDED
        ).values_list("key", "output")
    )


def _pack_of_tool(name: str) -> DomainPack | None:
    return next(
        (p for p in registered_packs().values() if any(t.name == name for t in p.tools)), None
    )


@contextmanager
def soft_time_limit(seconds: float) -> Iterator[None]:
    """Raise LeafTimeLimit in the running leaf after `seconds` (main thread only).

    A prefork or solo worker runs leaves on its main thread, where SIGALRM interrupts them;
    elsewhere the lease does: it is not renewed past the hard limit and the reconciler ends the
    leaf as timed out.
    """
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise LeafTimeLimit(f"soft time limit of {seconds:g} s exceeded")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# Running ---------------------------------------------------------------------------------------


def run(claim: Claim) -> dict[str, Any]:
    """Run a claimed leaf and return its checked output.

    Raises LeafError (classified), LeafStopped at a safe point, WaitingForPerson for a human
    leaf handed to its group.
    """
    node = claim.node or PlanNode.objects.select_related("version").get(pk=claim.node_id)
    agent = claim.agent_row or Agent.objects.filter(slug=node.agent).first()
    if agent is None or not agent.enabled:
        raise LeafError(ErrorClass.POLICY_DENIAL, f"agent {node.agent!r} is unknown or disabled")
    if agent.kind == Agent.Kind.HUMAN:
        from execution.actions import open_work_item

        open_work_item(claim, group_name=human_group(agent))
        raise WaitingForPerson(node.key)
    if agent.kind == Agent.Kind.LLM:
        outputs = upstream_outputs(node)
        from execution.runners.llm import run_llm_leaf

        return check_output(node, run_llm_leaf(claim, node, agent, outputs))
    if not node.tool:
        raise LeafError(ErrorClass.INVALID_INPUT, f"tool agent {agent.slug} has no tool to call")
    return check_output(node, run_tool(claim, node, agent, referenced_outputs(node)))


def human_group(agent: Agent) -> str:
    """Return the user group whose members do a human agent's work items.

    A capability `group:<name>` names it; without one, the analysts (the case workers) do it.
    """
    from accounts.roles import ANALYST

    for capability in agent.capabilities:
        if isinstance(capability, str) and capability.startswith("group:"):
            return capability.removeprefix("group:")
    return ANALYST


def run_tool(
    claim: Claim, node: PlanNode, agent: Agent, outputs: Mapping[str, Any]
) -> dict[str, Any]:
    """Call the leaf's registered tool with its resolved, validated inputs; return its output.

    Raises LeafError: policy_denial for a tool outside the agent's allow-list or not registered,
    invalid_input for inputs the tool's schema refuses (hostile arguments never reach the tool:
    L3), tool_failure for a tool that raised, transient for a lost database connection.
    """
    spec, pack = allowed_tool(agent, node.tool)
    try:
        inputs = resolve_inputs(node.inputs if isinstance(node.inputs, dict) else {}, outputs)
    except PlanInvalid as exc:
        raise LeafError(ErrorClass.INVALID_INPUT, str(exc)) from exc
    return call_tool(claim, spec, pack, inputs, idempotency_key=claim.idempotency_key)


def allowed_tool(agent: Agent, name: str) -> tuple[ToolSpec, DomainPack]:
    """Return a tool the agent may call, with its pack.

    Raises LeafError(policy_denial) for a tool outside the agent's allow-list or not registered.
    """
    if name not in agent.tools:
        raise LeafError(
            ErrorClass.POLICY_DENIAL, f"tool {name} is not on {agent.slug}'s allow-list"
        )
    # The code's spec: running needs its schemas and function, not the risk admins set.
    pack = _pack_of_tool(name)
    spec = next((t for t in pack.tools if t.name == name), None) if pack is not None else None
    if spec is None or pack is None:
        raise LeafError(ErrorClass.POLICY_DENIAL, f"tool {name} is not registered")
    return spec, pack


def call_tool(
    claim: Claim,
    spec: ToolSpec,
    pack: DomainPack,
    inputs: Mapping[str, Any],
    *,
    idempotency_key: str,
    what: str = "inputs",
) -> dict[str, Any]:
    """Validate `inputs` with the tool's schema, call it, and return its output as JSON data.

    The tool acts through its pack's port bound to `idempotency_key` (an effect recorded under it
    does not happen again) and to the leaf's safe point. Both kinds of agent call tools here:
    a `tool` leaf with the leaf's key, an `llm` leaf with the leaf's key and the call's position.
    Raises LeafError: invalid_input for inputs the schema refuses (naming `what`), tool_failure
    for a tool that raised or returned bad output, transient for a failure that may go away;
    LeafStopped at the safe point.
    """
    try:
        arguments = spec.input_model.model_validate(dict(inputs))
    except ValidationError as exc:
        problems = flatten_errors(exc.errors(), what)
        detail = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(problems.items()))
        raise LeafError(
            ErrorClass.INVALID_INPUT, f"{spec.name} refused its {what}: {detail}"
        ) from exc
    call = ToolCall(idempotency_key=idempotency_key, checkpoint=_checkpoint(claim))
    from planning.catalogue import data_port

    port = data_port(pack, call=call)
    try:
        result = spec.func(arguments, port)
        if not isinstance(result, spec.output_model):
            result = spec.output_model.model_validate(
                result.model_dump() if isinstance(result, BaseModel) else result
            )
    except (LeafStopped, LeafTimeLimit, LeafError):
        raise
    except ValidationError as exc:
        raise LeafError(ErrorClass.TOOL_FAILURE, f"{spec.name} returned bad output: {exc}") from exc
    except TransientToolError as exc:
        raise LeafError(ErrorClass.TRANSIENT, f"{spec.name}: {exc}") from exc
    except Exception as exc:
        if _is_transient(exc):
            raise LeafError(ErrorClass.TRANSIENT, f"{spec.name}: {exc}") from exc
        raise LeafError(ErrorClass.TOOL_FAILURE, f"{spec.name} failed: {exc}") from exc
    return result.model_dump(mode="json")


def _is_transient(exc: BaseException) -> bool:
    from django.db import InterfaceError, OperationalError

    if isinstance(exc, OperationalError | InterfaceError | ConnectionError | TimeoutError):
        connection.close()
        return True
    return False


def _checkpoint(claim: Claim) -> Callable[[], None]:
    def checkpoint() -> None:
        check_safe_point(claim)

    return checkpoint


# Goal-level verification ---------------------------------------------------------------------


def verify_goal(case: Case) -> Verdict:
    """Decide by the rules whether a case whose leaves all ended reached its goal, with the reasons.

    Every leaf must have succeeded, except leaves whose failure policy is `continue` (their
    failure and what it blocked are named); then the pack's rules, when it has any. Never calls a
    model: when the rules hold and an LLM goal judge is configured, the verdict passes and names
    it in `judge`, and the caller has it asked outside the transaction (`execution.goal_judge`).
    """
    nodes = list(
        PlanNode.objects.filter(version_id=case.current_version_id, kind=PlanNode.Kind.LEAF)
    )
    reasons: list[str] = []
    checks: list[str] = []
    for node in nodes:
        if node.status == NodeStatus.SUCCEEDED:
            continue
        if node.failure_policy == "continue" and node.status in {
            NodeStatus.FAILED,
            NodeStatus.SKIPPED,
        }:
            checks.append(f"{node.key} {node.status} (failure policy continue)")
            continue
        reasons.append(f"{node.key} {node.status}" + (f": {node.error}" if node.error else ""))
    if not reasons:
        checks.append(f"all {len(nodes)} steps ended as planned")
    pack = registered_packs().get(case.domain) if case.domain else None
    rules = getattr(pack, "goal_check", None) if pack is not None else None
    if rules is not None and not reasons:
        outputs = {n.key: n.output for n in nodes if n.status == NodeStatus.SUCCEEDED}
        problems = list(rules(outputs))
        reasons.extend(problems)
        if not problems:
            checks.append(f"the {pack.name} rules hold")  # type: ignore[union-attr]
    return Verdict(
        passed=not reasons,
        reasons=tuple(reasons),
        checks=tuple(checks),
        judge="" if reasons else judge_model(),
    )
