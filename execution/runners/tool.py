"""How a `tool` agent runs a leaf: the registered tool with its validated inputs.

References to upstream outputs are resolved, and the tool acts through its pack's data port bound
to the leaf's idempotency key and safe point. `llm` agents call their tools through `call_tool` too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.db import InterfaceError, OperationalError, connection
from pydantic import BaseModel, ValidationError

from execution.claiming import check_safe_point
from execution.common import Claim, ErrorClass, LeafError, LeafStopped, LeafTimeLimit
from planning.catalogue import data_port, registered_packs
from planning.core.catalogue import ToolCall, ToolSpec, TransientToolError
from planning.core.errors import PlanInvalid, flatten_errors
from planning.core.pack import DomainPack
from planning.core.refs import REF_KEY, is_ref, resolve_inputs
from planning.core.tree import thaw
from planning.models import Agent, NodeStatus, PlanNode


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
    a `tool` leaf with the leaf's key, an `llm` leaf with a key of the leaf, tool and arguments.
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
    if isinstance(exc, OperationalError | InterfaceError | ConnectionError | TimeoutError):
        connection.close()
        return True
    return False


def _checkpoint(claim: Claim) -> Callable[[], None]:
    def checkpoint() -> None:
        check_safe_point(claim)

    return checkpoint
