"""Plan edits: an officer changes one step of a plan awaiting approval, removes it, or adds a step
after it; the result is a new version.

The edited plan is re-validated in full, exactly as a planned one is (agents, tool allow-lists,
tool inputs, limits, cycles); a refused edit changes nothing. An accepted one is stored as the
case's next version (RELIABILITY R2): the old version's open gates become void, the new version's
gates open, and the approvals of steps the edit left unchanged carry over (bound to the same
content hash) — but not the editor's own: the editor cannot approve the version they made, so a
step they had approved needs another officer's approval there. Steps that ended already (the
edited version descends from a re-plan) and that the edit left unchanged keep their status and
output in the new version: nothing that succeeded runs again.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from audit.chain import NewEvent, append_event, case_chain
from audit.transitions import audited
from oversight.actions.edit_words import problems_in_words
from oversight.actions.gates import CONFIGURE, DecisionDenied, check_reason
from oversight.actions.kept_steps import carry_results
from oversight.actions.opening import open_gates, void_open_gates
from oversight.models import Gate, GateDecision, GateKind, GateStatus
from planning import rules
from planning.actions import plan_limits
from planning.catalogue import all_tool_specs, current_catalogue
from planning.core.dag import DagPlan
from planning.core.diff import PlanDiff, diff_plans, node_data
from planning.core.errors import PlanningError
from planning.core.serialize import canonical_json, node_hash
from planning.core.tree import Compound, Leaf, Node, Provenance
from planning.core.validation import validate_plan
from planning.models import Case, CaseStatus, PlanVersion
from planning.versions import kept_steps, load_plan, store_version, with_tool_risks

EDIT_PLAN = "oversight.edit_plan"
EDITABLE = ("agent", "task", "inputs", "depends_on")
# What an added step states (key, agent, task; the rest optional): a leaf like a planned one.
ADDED = ("key", "agent", "task", "tool", "inputs", "depends_on")
KEY = re.compile(r"^[a-z0-9][a-z0-9-]{0,99}$")
TASK_MAX_LENGTH = 10_000
REASON_MAX_LENGTH = rules.DESCRIPTION_MAX_LENGTH
AGENT_MAX_LENGTH = 100
DEPENDS_ON_MAX_ITEMS = 200


class EditRefused(Exception):
    """The plan cannot be edited now: the case is not awaiting approval, or the edit is stale."""


class EditInvalid(ValueError):
    """The edit is not valid (`field` names what to fix); nothing was changed (422)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class EditResult:
    """The version an edit made and what it changed from the version before."""

    version: PlanVersion
    diff: PlanDiff


def can_edit(user: User, case: Case) -> str | None:
    """Return why the user may not edit the case's plan (separation of duties), or None."""
    if not user.is_active:
        return "the account is disabled"
    if user.has_perm(CONFIGURE):
        return "admins do not edit plans"
    if not user.has_perm(EDIT_PLAN):
        return "editing plans needs the compliance officer role"
    if case.submitter_id == user.pk:
        return "nobody edits the plan of a case they submitted"
    return None


def _deny(user: User, case: Case, why: str, node_key: str) -> None:
    # In its own transaction (a savepoint when nested), so the refusal stays recorded.
    with transaction.atomic():
        append_event(
            "oversight.plan.edit_denied",
            actor=user,
            chain=case_chain(case.pk),
            data={"case": case.pk, "node": node_key, "why": why},
        )


def _text(value: Any, field: str, limit: int, *, required: bool) -> str:
    if not isinstance(value, str):
        raise EditInvalid(field, "must be text")
    value = value.strip()
    if required and not value:
        raise EditInvalid(field, "must not be empty")
    if len(value) > limit:
        raise EditInvalid(field, f"at most {limit:,} characters (this has {len(value):,})")
    if (problem := rules.text_problem(value)) is not None:
        raise EditInvalid(field, problem)
    return value


def clean_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Return the changes of an edit checked for shape: known fields, types and sizes.

    Raises EditInvalid naming the field (`changes.<name>`).
    """
    if not isinstance(changes, Mapping) or not changes:
        raise EditInvalid("changes", f"name at least one change: {', '.join(EDITABLE)} or remove")
    unknown = sorted(str(k) for k in changes if k not in (*EDITABLE, "remove", "add"))
    if unknown:
        raise EditInvalid(
            "changes", f"cannot change {', '.join(unknown)}: only {', '.join(EDITABLE)} or remove"
        )
    if "add" in changes:
        if len(changes) > 1:
            raise EditInvalid("changes.add", "a step is added on its own, in an edit of its own")
        return {"add": _added_step(changes["add"])}
    if "remove" in changes:
        if changes["remove"] is not True:
            raise EditInvalid("changes.remove", "remove is true or left out")
        if len(changes) > 1:
            raise EditInvalid("changes.remove", "a step removed cannot be changed as well")
        return {"remove": True}
    clean: dict[str, Any] = {}
    if "agent" in changes:
        clean["agent"] = _text(changes["agent"], "changes.agent", AGENT_MAX_LENGTH, required=True)
    if "task" in changes:
        clean["task"] = _text(changes["task"], "changes.task", TASK_MAX_LENGTH, required=True)
    if "inputs" in changes:
        clean["inputs"] = _inputs(changes["inputs"], "changes.inputs")
    if "depends_on" in changes:
        clean["depends_on"] = _depends_on(changes["depends_on"], "changes.depends_on")
    return clean


def _inputs(inputs: Any, field: str) -> dict[str, Any]:
    if not isinstance(inputs, Mapping):
        raise EditInvalid(field, "must be a JSON object")
    problems = rules.json_problems(dict(inputs), field, bounded=True)
    if problems:
        path, messages = next(iter(problems.items()))
        raise EditInvalid(path, messages[0])
    if len(canonical_json(inputs)) > rules.INPUTS_MAX_CHARS:
        raise EditInvalid(field, f"at most {rules.INPUTS_MAX_CHARS:,} characters of JSON")
    return dict(inputs)


def _depends_on(deps: Any, field: str) -> list[str] | None:
    if deps is None:
        return None
    if not isinstance(deps, list | tuple) or not all(isinstance(d, str) for d in deps):
        raise EditInvalid(field, "must be a list of step keys (or null)")
    if len(deps) > DEPENDS_ON_MAX_ITEMS:
        raise EditInvalid(field, f"at most {DEPENDS_ON_MAX_ITEMS} keys")
    return list(dict.fromkeys(deps))


def _added_step(step: Any) -> dict[str, Any]:
    """Return a step to add, checked for shape; raise EditInvalid naming `changes.add.<field>`."""
    if not isinstance(step, Mapping):
        raise EditInvalid("changes.add", "must be an object: the new step's key, agent and task")
    unknown = sorted(str(k) for k in step if k not in ADDED)
    if unknown:
        raise EditInvalid("changes.add", f"a new step has no {', '.join(unknown)}")
    key = _text(step.get("key", ""), "changes.add.key", AGENT_MAX_LENGTH, required=True)
    if not KEY.match(key):
        raise EditInvalid(
            "changes.add.key", "use lower-case letters, digits and hyphens, starting with one"
        )
    tool = step.get("tool") or None
    return {
        "key": key,
        "agent": _text(step.get("agent", ""), "changes.add.agent", AGENT_MAX_LENGTH, required=True),
        "task": _text(step.get("task", ""), "changes.add.task", TASK_MAX_LENGTH, required=True),
        "tool": None
        if tool is None
        else _text(tool, "changes.add.tool", AGENT_MAX_LENGTH, required=True),
        "inputs": _inputs(step.get("inputs") or {}, "changes.add.inputs"),
        "depends_on": _depends_on(step.get("depends_on"), "changes.add.depends_on"),
    }


def _replace(node: Node, key: str, new: Node | None) -> Node:
    """Return the tree under `node` with node `key` replaced by `new` (None: removed)."""
    if isinstance(node, Leaf):
        return node
    children: list[Node] = []
    for child in node.children:
        if child.key == key:
            if new is not None:
                children.append(new)
        else:
            children.append(_replace(child, key, new))
    return dataclasses.replace(node, children=tuple(children))


def _without_dependency(node: Node, key: str) -> Node:
    """Return the tree under `node` with `key` dropped from every declared `depends_on`."""
    deps = node.depends_on
    if deps is not None and key in deps:
        node = dataclasses.replace(node, depends_on=tuple(d for d in deps if d != key))
    if isinstance(node, Compound):
        node = dataclasses.replace(
            node, children=tuple(_without_dependency(c, key) for c in node.children)
        )
    return node


def _field_of(changes: Mapping[str, Any]) -> str:
    return f"changes.{next(iter(changes))}" if len(changes) == 1 else "changes"


def _with_added(plan: DagPlan, after: Leaf, step: Mapping[str, Any], user: User) -> Node:
    """Return the plan's tree with the new step right after `after`, in the same group."""
    if step["key"] in {node.key for node in plan.nodes()}:
        raise EditInvalid(
            "changes.add.key", f"the plan already has a step {step['key']}: choose another key"
        )
    parent = plan.parent_of(after.key)
    assert parent is not None  # a leaf always has its group
    deps = step["depends_on"]
    added = Leaf(
        key=step["key"],
        agent=step["agent"],
        task=step["task"],
        tool=step["tool"],
        inputs=step["inputs"],
        depends_on=tuple(deps) if deps is not None else None,
        provenance=Provenance(
            strategy=after.provenance.strategy,
            source=f"edit by {user.get_username()}",
            depth=after.provenance.depth,
        ),
    )
    children: list[Node] = []
    for child in parent.children:
        children.append(child)
        if child.key == after.key:
            children.append(added)
    group = dataclasses.replace(parent, children=tuple(children))
    return group if parent.key == plan.root.key else _replace(plan.root, parent.key, group)


# Which changed field a validation problem is about, by the words it uses (checked in order).
_PROBLEM_FIELDS = (
    ("depends_on", ("cycle", "depends on")),
    ("inputs", ("input",)),
    ("agent", ("agent", "not allowed for")),
    ("tool", ("tool",)),
)


def _field_for(problem: str, changes: Mapping[str, Any]) -> str:
    """Return the field of the edit a refused plan's problem is about (`changes` when unclear)."""
    if "add" in changes:
        prefix, candidates = "changes.add", {"depends_on", "inputs", "agent", "tool"}
    elif len(changes) == 1:
        return _field_of(changes)
    else:
        prefix, candidates = "changes", set(changes)
    for field, words in _PROBLEM_FIELDS:
        if field in candidates and any(word in problem for word in words):
            return f"{prefix}.{field}"
    return prefix


def _edited_plan(plan: DagPlan, key: str, changes: Mapping[str, Any], user: User) -> DagPlan:
    """Return `plan` with the edit applied, re-validated in full; raise EditInvalid otherwise."""
    try:
        node = plan.node(key)
    except KeyError:
        raise EditInvalid("node", f"the plan has no step {key!r}") from None
    if not isinstance(node, Leaf):
        raise EditInvalid("node", f"{key!r} is a group of steps: only steps can be edited")
    if "add" in changes:
        root: Node = _with_added(plan, node, changes["add"], user)
    elif changes.get("remove"):
        parent = plan.parent_of(key)
        if parent is not None and len(parent.children) == 1:
            raise EditInvalid(
                "changes.remove",
                f"{key!r} is the only step of {parent.key!r}: a group cannot be left empty",
            )
        root = _without_dependency(_replace(plan.root, key, None), key)
    else:
        fields = dict(changes)
        if "depends_on" in fields and fields["depends_on"] is not None:
            fields["depends_on"] = tuple(fields["depends_on"])
        provenance = Provenance(
            # The strategy stays the one that planned the step (the core allows no other); the
            # source says who edited it. Provenance is not part of a step's content hash.
            strategy=node.provenance.strategy,
            source=f"edit by {user.get_username()}",
            depth=node.provenance.depth,
        )
        root = _replace(plan.root, key, dataclasses.replace(node, **fields, provenance=provenance))
    assert isinstance(root, Compound)
    try:
        edited = DagPlan.build(root, warnings=plan.warnings, llm_calls=plan.llm_calls)
        validate_plan(edited, current_catalogue(), plan_limits())
        return with_tool_risks(edited, {name: spec.risk for name, spec in all_tool_specs().items()})
    except (PlanningError, ValueError, TypeError) as exc:
        problem = str(exc) or type(exc).__name__
        raise EditInvalid(_field_for(problem, changes), problems_in_words(problem)) from None


def _approved_by(gate: Gate, user: User) -> bool:
    """Tell whether `user` approved the gate, or a gate its approval was carried from."""
    ids: list[int] = []
    current: Gate | None = gate
    while current is not None:
        ids.append(current.pk)
        current = current.carried_from
    return GateDecision.objects.filter(
        gate_id__in=ids, decider=user, decision=GateDecision.Decision.APPROVE
    ).exists()


def _carried(old: PlanVersion, new_plan: DagPlan, editor: User) -> dict[str, Gate]:
    """Return the approved step gates of `old` whose steps the edit left unchanged, by key.

    The editor's own approvals are not carried (RELIABILITY S5): the editor may not approve the
    version they made, so such a step's gate opens again for another officer.
    """
    gates = Gate.objects.filter(
        version=old, kind=GateKind.STEP, status=GateStatus.APPROVED
    ).select_related("node")
    carried: dict[str, Gate] = {}
    leaves = {leaf.key: leaf for leaf in new_plan.leaves}
    for gate in gates:
        key = gate.node.key if gate.node is not None else ""
        leaf = leaves.get(key)
        if (
            leaf is not None
            and node_hash(leaf, new_plan.dependencies[key]) == gate.content_hash
            and not _approved_by(gate, editor)
        ):
            carried[key] = gate
    return carried


def edit_plan(
    *,
    case_id: int,
    user: User,
    node_key: str,
    changes: Mapping[str, Any],
    reason_code: str,
    reason: str = "",
    base_version: int | None = None,
) -> EditResult:
    """Change one step of the case's current plan (or remove it, or add a step after it); store
    the result as a version.

    `changes` holds any of agent, task, inputs, depends_on; or `remove: True`; or `add`: the new
    step (key, agent, task, and tool, inputs, depends_on as it needs), placed after `node_key`
    in its group. `base_version`,
    when given, is the version the user saw: the edit applies only if it is still current.

    Raises Case.DoesNotExist; DecisionDenied (audited) unless the user is a compliance officer
    who did not submit the case; ReasonInvalid for a missing, unknown or non-edit reason code;
    EditInvalid naming the field for an edit the plan's validation refuses; EditRefused when the
    case is not awaiting approval or `base_version` is stale. Nothing changes on any refusal.
    """
    case = Case.objects.get(pk=case_id)
    if (why := can_edit(user, case)) is not None:
        _deny(user, case, why, str(node_key)[:200])
        raise DecisionDenied(why)
    code = check_reason(reason_code, "edit", required=True, text=reason or "")
    assert code is not None
    reason = _text(reason or "", "reason", REASON_MAX_LENGTH, required=False)
    if not isinstance(node_key, str) or not node_key:
        raise EditInvalid("node", "name the step to edit")
    clean = clean_changes(changes)
    return _edit(case_id, user, node_key, clean, code.code, reason, base_version)


@transaction.atomic
def _edit(
    case_id: int,
    user: User,
    node_key: str,
    changes: dict[str, Any],
    reason_code: str,
    reason: str,
    base_version: int | None,
) -> EditResult:
    case = Case.objects.select_for_update().get(pk=case_id)
    if (why := can_edit(user, case)) is not None:  # roles may have changed meanwhile
        raise DecisionDenied(why)
    if case.status != CaseStatus.AWAITING_APPROVAL:
        raise EditRefused(f"the case is {case.status}: only a plan awaiting approval is edited")
    if case.current_version_id is None:
        raise EditRefused("the case has no plan to edit")
    old = PlanVersion.objects.get(pk=case.current_version_id)
    if base_version is not None and base_version != old.number:
        raise EditRefused(
            f"the plan is at version {old.number}, not {base_version}: reload and edit again"
        )
    old_plan = load_plan(old)
    new_plan = _edited_plan(old_plan, node_key, changes, user)
    diff = diff_plans(old_plan, new_plan)
    if diff.is_empty:
        raise EditInvalid(_field_of(changes), "the edit changes nothing")
    edit = {
        "node": node_key,
        "changes": changes,
        "reason_code": reason_code,
        "reason": reason,
        "from_version": old.number,
    }
    # Steps that ended already (the version descends from a re-plan) and that the edit left
    # unchanged keep their status and output: nothing that succeeded runs again (S1).
    kept = kept_steps(old, new_plan)
    version = store_version(case, new_plan, edited_by=user, edit=edit)
    case.current_version = version
    case.save(update_fields=["current_version", "updated_at"])
    added = changes["add"]["key"] if "add" in changes else None
    after = None if changes.get("remove") else node_data(new_plan.node(added or node_key))
    with audited(chain=case_chain(case.pk)) as audit:
        # First: the event names the kept steps, whose moves come last.
        audit.add(
            NewEvent(
                "planning.plan.edited",
                user,
                {
                    "case": case.pk,
                    **edit,
                    "version": version.number,
                    "content_hash": version.content_hash,
                    "before": {
                        "version": old.number,
                        "content_hash": old.content_hash,
                        "node": None if added else node_data(old_plan.node(node_key)),
                    },
                    "after": {
                        "version": version.number,
                        "content_hash": version.content_hash,
                        "node": after,
                    },
                    "diff": diff.as_data(),
                    "kept": sorted(kept),
                },
            ),
            now=True,
        )
        void_open_gates(old, why=f"replaced by version {version.number}", actor=user)
        open_gates(version, carried=_carried(old, new_plan, user))
        if kept:
            carry_results(version, kept, audit=audit)
    return EditResult(version=version, diff=diff)


__all__ = [
    "EDIT_PLAN",
    "EditInvalid",
    "EditRefused",
    "EditResult",
    "can_edit",
    "clean_changes",
    "edit_plan",
]
