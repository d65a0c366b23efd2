"""Promoted methods as the planning core sees them: the guard, the subtree, and the library.

A promoted method is an LLM-planned subtree that was approved, executed, proposed by an officer
or admin and approved by a second one (planning/promotion.py). Its guard is a short list of
explicit conditions on the planning state (`equals`, `one-of`, `present`), its subtree the
children as they were planned: leaves with their agent, task, tool, literal inputs and
dependencies, compounds the LLM created with their own children, and compounds a method of the
pack planned as a reference to that task (planned again by its methods each time). Both are
JSON in the database, checked here by pydantic, and bound by a content hash to what was
approved: a row whose hash no longer matches is refused, loudly, rather than planned with.

Planning adds the pack's active promoted methods after its code methods (`library_for`): code
methods keep priority, and in hybrid planning a promoted method is tried before the LLM.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError

from planning.core.pack import DomainPack
from planning.core.serialize import canonical_json
from planning.core.static import Item, Method, MethodLibrary, Step, TaskRef
from planning.core.tree import Compound, FailurePolicy, Leaf, Provenance
from planning.models import PromotedMethod

PROMOTED_PREFIX = "promoted:"
KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$"
MAX_CONDITIONS = 20
MAX_CHILDREN = 50

type Scalar = str | int | float | bool | None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Condition(_Strict):
    """One condition of a guard on the planning state."""

    key: str = Field(min_length=1, max_length=100)
    op: Literal["equals", "one-of", "present"]
    value: JsonValue = None

    def model_post_init(self, context: Any) -> None:
        if self.op == "present" and self.value is not None:
            raise ValueError(f"{self.key}: 'present' takes no value")
        if self.op == "one-of" and (
            not isinstance(self.value, list)
            or not self.value
            or any(isinstance(v, dict | list) for v in self.value)
        ):
            raise ValueError(f"{self.key}: 'one-of' takes a non-empty list of plain values")

    def holds(self, state: Mapping[str, Any]) -> bool:
        """Tell whether the state meets this condition."""
        if self.key not in state:
            return False
        actual = state[self.key]
        if self.op == "present":
            return actual not in (None, "", [], {})
        if self.op == "equals":
            return bool(_plain(actual) == self.value)
        assert isinstance(self.value, list)
        return _plain(actual) in self.value

    def describe(self) -> str:
        """Return the condition in words."""
        if self.op == "present":
            return f"{self.key} is given"
        if self.op == "equals":
            return f"{self.key} = {canonical_json(self.value)}"
        return f"{self.key} is one of {canonical_json(self.value)}"


def _plain(value: Any) -> Any:
    # The state may hold frozen mappings or tuples; compare what JSON would hold.
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


GUARD = TypeAdapter(Annotated[list[Condition], Field(min_length=1, max_length=MAX_CONDITIONS)])


class LeafSpec(_Strict):
    kind: Literal["leaf"]
    key: str = Field(pattern=KEY_PATTERN)
    agent: str = Field(min_length=1, max_length=100)
    task: str = Field(min_length=1, max_length=2000)
    rationale: str = Field(default="", max_length=2000)
    tool: str | None = Field(default=None, max_length=100)
    inputs: dict[str, JsonValue] = Field(default_factory=dict)
    depends_on: list[str] | None = None
    expected_output: str | None = Field(default=None, max_length=100)
    failure_policy: FailurePolicy = "abort"
    risk: str | None = Field(default=None, max_length=16)


class TaskSpec(_Strict):
    """A compound a method of the pack planned: planned again by its methods."""

    kind: Literal["task"]
    key: str = Field(pattern=KEY_PATTERN)
    task: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=2000)
    depends_on: list[str] | None = None


class CompoundSpec(_Strict):
    """A compound the LLM created, with its children as planned."""

    kind: Literal["compound"]
    key: str = Field(pattern=KEY_PATTERN)
    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=2000)
    depends_on: list[str] | None = None
    children: list[Child] = Field(min_length=1, max_length=MAX_CHILDREN)


type Child = Annotated[LeafSpec | TaskSpec | CompoundSpec, Field(discriminator="kind")]

CompoundSpec.model_rebuild()

SUBTREE = TypeAdapter(Annotated[list[Child], Field(min_length=1, max_length=MAX_CHILDREN)])


class MethodInvalid(ValueError):
    """A promoted method's guard or subtree does not validate, or its row was changed."""


def parse_guard(data: Any) -> list[Condition]:
    """Return the guard's conditions; raise MethodInvalid naming what is wrong."""
    try:
        return GUARD.validate_python(data)
    except ValidationError as exc:
        raise MethodInvalid(f"The guard is not valid: {_first_error(exc)}") from None


def parse_subtree(data: Any) -> list[LeafSpec | TaskSpec | CompoundSpec]:
    """Return the subtree's children; raise MethodInvalid naming what is wrong."""
    try:
        return SUBTREE.validate_python(data)
    except ValidationError as exc:
        raise MethodInvalid(f"The subtree is not valid: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def method_hash(
    *, pack: str, task: str, name: str, version: int, description: str, guard: Any, subtree: Any
) -> str:
    """Return the SHA-256 of what a promoted method plans with (the approval binds to it)."""
    body = {
        "pack": pack,
        "task": task,
        "name": name,
        "version": version,
        "description": description,
        "guard": guard,
        "subtree": subtree,
    }
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


def row_hash(row: PromotedMethod) -> str:
    """Return the content hash of a promoted method row as it is stored now."""
    return method_hash(
        pack=row.pack,
        task=row.task,
        name=row.name,
        version=row.version,
        description=row.description,
        guard=row.guard,
        subtree=row.subtree,
    )


def _provenance() -> Provenance:
    # Replaced by the strategy's own stamp: nodes a method hands back are stamped again.
    return Provenance(strategy="static", source="promoted", depth=0)


def _deps(value: list[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


def _step(spec: LeafSpec) -> Step:
    return Step(
        key=spec.key,
        agent=spec.agent,
        task=spec.task,
        rationale=spec.rationale,
        tool=spec.tool,
        inputs=spec.inputs,
        depends_on=_deps(spec.depends_on),
        expected_output=spec.expected_output,
        failure_policy=spec.failure_policy,
        risk=spec.risk,
    )


def _leaf(spec: LeafSpec) -> Leaf:
    return _step(spec).to_leaf(_provenance())


def _node(spec: LeafSpec | TaskSpec | CompoundSpec) -> Leaf | Compound:
    if isinstance(spec, LeafSpec):
        return _leaf(spec)
    if isinstance(spec, TaskSpec):
        # No children: a placeholder the strategy expands with the methods for its task.
        return Compound(
            key=spec.key,
            name=spec.task,
            description=spec.description,
            depends_on=_deps(spec.depends_on),
            provenance=_provenance(),
        )
    return Compound(
        key=spec.key,
        name=spec.name,
        description=spec.description,
        depends_on=_deps(spec.depends_on),
        children=tuple(_node(child) for child in spec.children),
        provenance=_provenance(),
    )


def _item(spec: LeafSpec | TaskSpec | CompoundSpec) -> Item:
    if isinstance(spec, LeafSpec):
        return _step(spec)
    if isinstance(spec, TaskSpec):
        return TaskRef(
            task=spec.task,
            key=spec.key,
            description=spec.description,
            depends_on=_deps(spec.depends_on),
        )
    return _node(spec)


def as_method(row: PromotedMethod) -> Method:
    """Return the planning core's method for an approved row.

    Raises MethodInvalid when the row no longer hashes to what was approved or does not validate.
    """
    if row_hash(row) != row.content_hash:
        raise MethodInvalid(
            f"The promoted method {row.name} v{row.version} of pack {row.pack!r} no longer "
            "matches what was approved (its content hash differs): retire it or restore it."
        )
    conditions = tuple(parse_guard(row.guard))
    items: Sequence[Item] = tuple(_item(spec) for spec in parse_subtree(row.subtree))

    def guard(state: Mapping[str, Any]) -> bool:
        return all(condition.holds(state) for condition in conditions)

    def decompose(state: Mapping[str, Any]) -> Sequence[Item]:
        return items

    return Method(
        name=row.source,
        task=row.task,
        guard=guard,
        decompose=decompose,
        description=row.description,
        source=row.source,
    )


def active_methods(pack_slug: str) -> list[PromotedMethod]:
    """Return the active promoted methods of a pack in the order they are tried (one query)."""
    return list(
        PromotedMethod.objects.filter(pack=pack_slug, status=PromotedMethod.Status.ACTIVE).order_by(
            "approved_at", "id"
        )
    )


def library_for(pack: DomainPack) -> MethodLibrary:
    """Return the pack's code methods followed by its active promoted methods (one query).

    Raises MethodInvalid for an active row that was changed since its approval.
    """
    promoted = [as_method(row) for row in active_methods(pack.slug)]
    if not promoted:
        return pack.methods
    return MethodLibrary([*pack.methods, *promoted])


def parse_source(source: str) -> tuple[str, int] | None:
    """Return (name, version) of a "promoted:<name>@v<n>" provenance source, None otherwise."""
    if not source.startswith(PROMOTED_PREFIX):
        return None
    name, _, version = source.removeprefix(PROMOTED_PREFIX).rpartition("@v")
    if not name or not version.isdigit():
        return None
    return name, int(version)


__all__ = [
    "GUARD",
    "PROMOTED_PREFIX",
    "SUBTREE",
    "CompoundSpec",
    "Condition",
    "LeafSpec",
    "MethodInvalid",
    "TaskSpec",
    "active_methods",
    "as_method",
    "library_for",
    "method_hash",
    "parse_guard",
    "parse_source",
    "parse_subtree",
    "row_hash",
]
