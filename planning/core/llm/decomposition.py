"""Recursive LLM decomposition with a depth ceiling, expanded concurrently (DESIGN §3).

The root goal is decomposed by one call; every nested entry of the answer becomes a compound that
is decomposed by its own call one level deeper, with the parent goal and the sibling tasks in its
prompt. Sibling compounds are expanded at the same time on a thread pool, so the wall-clock time
grows with the depth, not with the number of calls. The whole tree is resolved before a `DagPlan`
is returned; on any failure nothing is returned.

Every request carries the answer schema of its level (the offered agents as an ``enum``, the
fan-out limit as ``maxItems``) and bounds its answer with ``max_tokens``: the client's per-call
ceiling, or what is left of the run's token budget when that is less. With a pack's methods
(`examples`), each request also shows one decomposition the pack makes
(`planning.core.llm.examples`).

Every answer is checked entry by entry against what its request offered. Wrong ids and references
are fixed where they are read, each with a warning (`planning.core.llm.schemas`); any other problem
gets a repair request quoting every problem and a bounded excerpt of the answer (up to
`max_repairs`), built on the original request so that repairs never grow past the context window,
and worded for its round. An answer that repeats an earlier one ends the repairs at once. An answer
cut off at ``max_tokens`` gets one request for a shorter answer; a second cut-off fails planning
with a clear error. What is still wrong after the repairs is dropped with a warning, which the
reviewer sees at the plan gate; a compound left without a usable entry fails planning. A depth-1
plan of one step for a goal of several parts (`planning.core.llm.coverage`) gets a warning.

With a domain pack (`actions`: the pack's leaves for the case, `DomainPack.capabilities_for`),
each request also lists the pack's actions, and an agent step may name one in ``action``: it
becomes that action's leaf, as the pack wrote it (`LlmDecomposition._to_expansion`). An action
planned again in another part of the plan, on the same inputs, runs once
(`planning.core.llm.repeats`), and of two actions in the plan, the one that needs what the other
produces waits for it (`planning.core.llm.ordering`).

The scheduling machinery (`ExpansionJob`, `Expansion`, `PlanningRun`, in
`planning.core.llm.expansion`) is shared with the hybrid strategy in `planning.core.hybrid`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from planning.core.dag import DagPlan
from planning.core.errors import LlmPlanningError
from planning.core.goal import Capability
from planning.core.llm.cache import DecompositionCache
from planning.core.llm.client import LlmClient
from planning.core.llm.coverage import several_parts
from planning.core.llm.examples import method_example
from planning.core.llm.expansion import (
    Expansion,
    ExpansionJob,
    LlmBudgets,
    PlanningRun,
    child_key,
    share_leaves,
)
from planning.core.llm.ordering import fill_preconditions, order_pack_actions
from planning.core.llm.prompts import (
    AgentInfo,
    answer_excerpt,
    render_example,
    repair_prompt,
    system_prompt,
    user_prompt,
)
from planning.core.llm.records import ChatMessage
from planning.core.llm.repeats import merge_repeated_actions
from planning.core.llm.schemas import (
    AgentStep,
    Answer,
    AnswerRules,
    SubtaskStep,
    answer_schema,
    dependencies,
    read_answer,
    require_clean,
)
from planning.core.llm.structured_output import extract_json
from planning.core.refs import referenced_keys
from planning.core.static import MethodLibrary, unique_keys
from planning.core.tree import Goal, Leaf, Provenance, StrategyName

__all__ = [
    "PLANNABLE_KINDS",
    "Expansion",
    "ExpansionJob",
    "LlmBudgets",
    "LlmDecomposition",
    "NoAgentAvailable",
    "PlanningRun",
    "expected_calls",
]

# The agent kinds that can act on a bare task, which is all an LLM-planned step is unless it
# names one of the pack's actions (which brings its own agent, of any kind, and its tool).
PLANNABLE_KINDS = frozenset({"llm", "human"})

type ActionSource = Callable[[Mapping[str, Any]], Sequence[Capability]]

NESTED_SCHEMA_NAME = "nested_plan"
AGENT_SCHEMA_NAME = "agent_plan"


def expected_calls(branching: int, depth: int) -> int:
    """Return 1 + b + … + b^(d-1): the calls a full tree of fan-out b and depth d needs.

    Raises ValueError for a branching factor or depth below 1.
    """
    if branching < 1 or depth < 1:
        raise ValueError("branching and depth must be >= 1")
    return sum(branching**level for level in range(depth))


class NoAgentAvailable(LlmPlanningError):
    """No enabled agent can carry out the steps an LLM plans (kinds `llm` and `human`)."""

    def __init__(self, goal: str) -> None:
        super().__init__(
            f"LLM planning of goal {goal!r} needs an enabled agent of kind 'llm' or 'human', and "
            "there is none: the steps an LLM plans carry no tool, so a 'tool' agent cannot run "
            "them. An admin must enable an llm or human agent (of the case's domain pack, when "
            "it has one)."
        )


@dataclass(frozen=True, slots=True)
class _Attempt:
    number: int
    text: str
    error: str


def _fingerprint(text: str) -> str:
    """Return the answer as canonical JSON (its text when it is none), to spot a repeat."""
    try:
        return json.dumps(extract_json(text), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return text.strip()


def _fix_warnings(job: ExpansionJob, answer: Answer) -> tuple[str, ...]:
    """Return a warning per id or reference fixed in the usable entries of `answer`."""
    return tuple(
        f"step {entry.describe()} of goal {job.goal.name!r} at depth {job.depth}: {fix}"
        for entry in answer.fixed
        for fix in entry.describe_fixes()
    )


class LlmDecomposition:
    """Plan a goal by asking the model, recursively, down to `max_depth` levels.

    The model is offered only the agents that can act on a bare task: the enabled ones of kind
    `llm` or `human` (a `tool` agent needs a tool, which a bare LLM-planned step does not carry).
    With `actions` (a domain pack's leaves for the case's state) it is also offered those whose
    agent is enabled, of any kind: a step naming one carries the action's tool.
    `instructions` (a planner agent's system prompt) replace the built-in opening of the system
    prompt. The number of calls in flight at once is the client's `max_concurrency`.
    """

    strategy_name: StrategyName = "llm"

    def __init__(
        self,
        client: LlmClient,
        agents: Sequence[AgentInfo],
        *,
        max_depth: int = 2,
        budgets: LlmBudgets | None = None,
        cache: DecompositionCache | None = None,
        max_repairs: int = 2,
        instructions: str = "",
        examples: MethodLibrary | None = None,
        example_task: str = "",
        actions: ActionSource | None = None,
    ) -> None:
        """Configure the planner; raise ValueError for a depth below 1 or too many repairs.

        `examples` (a pack's methods) supply the example decomposition of each request: of the
        goal's own task when a method covers it, else of `example_task` (the pack's root task).
        `actions` returns the pack's leaves for a state (`DomainPack.capabilities_for`).
        """
        if max_depth < 1:
            raise ValueError("max_depth must be >= 1")
        if not 0 <= max_repairs <= 5:
            raise ValueError("max_repairs must be between 0 and 5")
        self.client = client
        self._enabled_slugs = frozenset(
            agent.slug for agent in agents if getattr(agent, "enabled", True)
        )
        self.agents: tuple[AgentInfo, ...] = tuple(
            agent
            for agent in agents
            if getattr(agent, "enabled", True) and agent.kind in PLANNABLE_KINDS
        )
        self._agent_slugs = frozenset(agent.slug for agent in self.agents)
        self.max_depth = max_depth
        self.budgets = budgets or LlmBudgets()
        self.cache = cache
        self.max_repairs = max_repairs
        self.instructions = instructions
        self.examples = examples
        self.example_task = example_task
        self.action_source = actions
        self._schemas: dict[tuple[bool, frozenset[str], int], Mapping[str, Any]] = {}

    def new_run(self) -> PlanningRun:
        """Return fresh counters for one planning run."""
        return PlanningRun(self.budgets, max_concurrency=self.client.settings.max_concurrency)

    def plan(self, goal: Goal, state: Mapping[str, Any]) -> DagPlan:
        """Decompose `goal` fully and return the plan.

        Raises `LlmPlanningError` (transport failure, no usable step for a goal after the
        repairs, `NoAgentAvailable`), `BudgetExceeded`, or `PlanInvalid`.
        """
        frozen_state = MappingProxyType(dict(state))
        run = self.new_run()
        root = ExpansionJob(key=goal.name, goal=goal, depth=0, level=0)
        tree, warnings = run.execute(
            root, lambda job: self.expand(run, job, frozen_state, strategy=self.strategy_name)
        )
        # action leaves take the pack's keys, which may repeat across subtrees: placed at the end,
        # then an action planned again in another part is run once
        merged, notes = merge_repeated_actions(unique_keys(tree))
        # the facts the model's actions need are provided, and two actions the pack orders,
        # which the model left independent, are ordered
        actions = tuple(self.actions_for(frozen_state).values())
        filled, added = fill_preconditions(merged, actions, frozen_state)
        ordered, more = order_pack_actions(filled, actions)
        return DagPlan.build(ordered, warnings=warnings + notes + added + more, llm_calls=run.calls)

    # -- one compound ----------------------------------------------------------------------------

    def _is_last_level(self, job: ExpansionJob) -> bool:
        return job.level >= self.max_depth - 1

    def actions_for(self, state: Mapping[str, Any]) -> Mapping[str, Capability]:
        """Return the pack's actions for `state` that can run, by id (none without a pack).

        An action runs when its agent is enabled and every action whose output its inputs use
        is offered too: without affected hosts nothing is isolated, so the announcement that
        reports the isolation is not offered either. A state that lacks an input the pack's
        leaves are built from (the source raises `KeyError`) offers none.
        """
        if self.action_source is None:
            return MappingProxyType({})
        try:
            source = self.action_source(state)
        except KeyError:
            # a pack builds its leaves from the case's inputs; without them there are none
            return MappingProxyType({})
        offered = {action.name: action for action in source if action.agent in self._enabled_slugs}
        changed = True
        while changed:
            runnable = {
                name: action
                for name, action in offered.items()
                if all(key in offered for key in referenced_keys(action.tool_inputs))
            }
            changed = len(runnable) < len(offered)
            offered = runnable
        return MappingProxyType(offered)

    def leaf_budget(self, job: ExpansionJob) -> int:
        """Return the leaves `job` may add to the plan: its share, or the run's whole budget."""
        return self.budgets.max_leaves if job.max_leaves is None else job.max_leaves

    def max_steps_for(self, job: ExpansionJob) -> int:
        """Return the most steps one answer for `job` may have: the fan-out, or its leaf share."""
        return max(1, min(self.budgets.max_fanout, self.leaf_budget(job)))

    def size_note(self, job: ExpansionJob) -> str:
        """Return what the request tells the model about the plan's size budget.

        Above the last level, a budget too small for a full fan-out on every level left asks
        for fewer, coarser subtasks: as many as the budget gives a full fan-out below.
        """
        budget = self.leaf_budget(job)
        # the last level's request never mentions subtasks: it may not plan any
        counted = "" if self._is_last_level(job) else ", the steps of its subtasks included"
        if job.max_leaves is None:
            note = f"Plan size: the whole plan may have at most {budget} steps{counted}."
        else:
            note = (
                f"Plan size: this part may add at most {budget} steps to the plan{counted} (its "
                f"share of the plan's {self.budgets.max_leaves})."
            )
        levels_below = self.max_depth - 1 - job.level
        if levels_below < 1:
            return note
        below = self.budgets.max_fanout**levels_below
        if budget >= self.max_steps_for(job) * below:
            return note
        subtasks = max(1, budget // below)
        return (
            f"{note} That is small for {levels_below} more level(s) of subtasks: use at most "
            f"{subtasks} subtask(s), each a coarse part of several actions, and agent "
            "assignments for the rest."
        )

    def rules_for(
        self, job: ExpansionJob, actions: Mapping[str, Capability] | None = None
    ) -> AnswerRules:
        """Return what the request for `job` offers: its agents, actions, entry kinds, fan-out."""
        return AnswerRules(
            agents=self._agent_slugs,
            max_steps=self.max_steps_for(job),
            is_last_level=self._is_last_level(job),
            max_depth=self.max_depth,
            actions=frozenset(actions or ()),
        )

    def schema_for(self, rules: AnswerRules) -> Mapping[str, Any]:
        """Return the answer schema of a request with these rules (the same for a level)."""
        # every request offers the same agents; the level, the actions and the steps differ
        memo = (rules.is_last_level, rules.actions, rules.max_steps)
        schema = self._schemas.get(memo)
        if schema is None:
            schema = MappingProxyType(answer_schema(rules))
            self._schemas[memo] = schema
        return schema

    def messages_for(
        self,
        job: ExpansionJob,
        state: Mapping[str, Any],
        actions: Mapping[str, Capability] | None = None,
    ) -> list[ChatMessage]:
        """Return the system and user messages that ask to decompose `job`."""
        return [
            {
                "role": "system",
                "content": system_prompt(
                    is_last_level=self._is_last_level(job),
                    max_steps=self.max_steps_for(job),
                    instructions=self.instructions,
                    has_actions=bool(actions),
                ),
            },
            {
                "role": "user",
                "content": user_prompt(
                    job.goal,
                    self.agents,
                    state,
                    hint=job.hint,
                    example=self._example(job, state),
                    actions=tuple((actions or {}).values()),
                    size=self.size_note(job),
                ),
            },
        ]

    def _example(self, job: ExpansionJob, state: Mapping[str, Any]) -> str:
        if self.examples is None:
            return ""
        # a part the model made is shown its own task's method only: the whole case's method
        # shown for a part is copied into it whole, and every part then plans the whole case
        tasks = (job.goal.name,) if job.goal.parent else (job.goal.name, self.example_task)
        example = method_example(self.examples, tasks, state)
        if example is None:
            return ""
        return render_example(example, is_last_level=self._is_last_level(job))

    def expand(
        self,
        run: PlanningRun,
        job: ExpansionJob,
        state: Mapping[str, Any],
        *,
        strategy: StrategyName,
    ) -> Expansion:
        """Decompose one compound with the model (or the cache) into leaves and jobs.

        Raises `LlmPlanningError` (including `NoAgentAvailable`), `BudgetExceeded`.
        """
        run.check_cancelled()
        if not self.agents:
            raise NoAgentAvailable(job.goal.name)
        actions = self.actions_for(state)
        rules = self.rules_for(job, actions)
        answer, source, warnings = self._answer(run, job, state, rules, actions)
        if job.depth == 0 and rules.is_last_level and len(answer.usable) == 1:
            warnings += self._one_step_warning(job, state)
        return self._to_expansion(run, job, answer, source, warnings, strategy, actions)

    def _one_step_warning(self, job: ExpansionJob, state: Mapping[str, Any]) -> tuple[str, ...]:
        """Return a warning when a depth-1 plan of one step answers a goal of several parts."""
        own = (
            None
            if self.examples is None
            else method_example(self.examples, (job.goal.name,), state)
        )
        why = several_parts(job.goal, own)
        if not why:
            return ()
        return (
            f"the plan of goal {job.goal.name!r} has a single step, but the goal has several "
            f"parts ({why}): check that the step covers all of them, or plan the case again "
            "with a depth of 2 or more",
        )

    def _answer(
        self,
        run: PlanningRun,
        job: ExpansionJob,
        state: Mapping[str, Any],
        rules: AnswerRules,
        actions: Mapping[str, Capability],
    ) -> tuple[Answer, str, tuple[str, ...]]:
        schema_name = AGENT_SCHEMA_NAME if rules.is_last_level else NESTED_SCHEMA_NAME
        schema = self.schema_for(rules)
        # the offered actions are in the prompt and the schema, so in the request hash: a cached
        # answer is only reused for the same actions
        request = self.messages_for(job, state, actions)
        cache_key = self.client.request_hash(request, schema_name, schema)
        if self.cache is not None:
            cached = self.cache.get(cache_key)
            if cached is not None:
                answer = _read(cached, rules)
                if answer is not None and answer.is_clean:
                    return answer, f"llm:cache:{cache_key[:12]}", _fix_warnings(job, answer)

        def validate(data: Any) -> Answer:
            return require_clean(read_answer(data, rules))

        where = f"goal {job.goal.name!r} at depth {job.depth}"
        messages = request
        attempts: list[_Attempt] = []
        answers_seen: set[str] = set()
        previous_error = ""
        truncations = 0
        repeated = ""
        for attempt in range(self.max_repairs + 1):
            number = run.reserve_call()
            repairs = attempt
            try:
                result = self.client.complete_json(
                    messages,
                    validate,
                    schema_name=schema_name,
                    json_schema=schema,
                    call_id=f"llm:{number}",
                    digest=cache_key if attempt == 0 else "",
                    max_tokens=run.remaining_tokens(),
                )
            except LlmPlanningError as exc:
                raise LlmPlanningError(f"planning {where}: {exc.message}") from exc
            run.add_tokens(result.total_tokens)
            if result.parsed is not None:
                if self.cache is not None:
                    self.cache.put(cache_key, result.text)
                return result.parsed, f"llm:{number}", _fix_warnings(job, result.parsed)
            error = result.validation_error or "the answer did not validate"
            if result.truncated:
                truncations += 1
                if truncations > 1 or (attempt == self.max_repairs and not attempts):
                    again = ""
                    if truncations > 1:
                        again = " again, after a request for a shorter answer,"
                    raise LlmPlanningError(
                        f"the LLM's answer for {where} was cut off{again} at the limit of "
                        f"{result.max_tokens} tokens, before its JSON was complete. The model "
                        "writes too much for one call: an admin can raise "
                        "CASEHUB_LLM_MAX_TOKENS_PER_CALL (or CASEHUB_LLM_MAX_TOKENS, the planning "
                        "run's ceiling) or lower CASEHUB_PLAN_MAX_FANOUT."
                    )
            else:
                attempts.append(_Attempt(number, result.text, error))
                fingerprint = _fingerprint(result.text)
                if fingerprint in answers_seen:
                    # a model that repeats itself will not be moved by one more request
                    left = self.max_repairs - attempt
                    if left:
                        repeated = (
                            f"the model repeated an earlier answer word for word, so the {left} "
                            "repair request(s) left were not sent"
                        )
                    break
                answers_seen.add(fingerprint)
            if attempt < self.max_repairs:
                run.check_cancelled()
                # each repair is built on the original request, with a bounded excerpt of the
                # rejected answer: resending every earlier answer overflows small context windows
                messages = [
                    *request,
                    {"role": "assistant", "content": answer_excerpt(result.text)},
                    {
                        "role": "user",
                        "content": repair_prompt(
                            error,
                            truncated=result.truncated,
                            max_steps=rules.max_steps,
                            round_number=attempt + 1,
                            rounds=self.max_repairs,
                            is_same_problems=error == previous_error,
                        ),
                    },
                ]
                previous_error = error
        return self._salvage(job, rules, attempts, repairs=repairs, repeated=repeated)

    def _salvage(
        self,
        job: ExpansionJob,
        rules: AnswerRules,
        attempts: Sequence[_Attempt],
        *,
        repairs: int,
        repeated: str = "",
    ) -> tuple[Answer, str, tuple[str, ...]]:
        """Keep the valid entries of the latest answer that has any; drop the rest with a warning.

        `repairs` is the number of repair requests sent; `repeated` says why they ended early,
        if they did. Raises `LlmPlanningError` when no answer has a usable entry.
        """
        after = f"{repairs} repair request(s)" + (f" ({repeated})" if repeated else "")
        for attempt in reversed(attempts):
            answer = _read(attempt.text, rules)
            if answer is None or not answer.usable:
                continue
            warnings = tuple(
                f"dropped step {entry.describe()} of goal {job.goal.name!r} at depth "
                f"{job.depth}, still invalid after {after}: {entry.describe_problems()}"
                for entry in answer.entries
                if not entry.is_usable
            )
            return answer, f"llm:{attempt.number}", warnings + _fix_warnings(job, answer)
        raise LlmPlanningError(
            f"the LLM returned no usable step for goal {job.goal.name!r} at depth {job.depth} "
            f"after {after}: {attempts[-1].error}"
        )

    def _to_expansion(
        self,
        run: PlanningRun,
        job: ExpansionJob,
        answer: Answer,
        source: str,
        warnings: tuple[str, ...],
        strategy: StrategyName,
        actions: Mapping[str, Capability] | None = None,
    ) -> Expansion:
        """Turn the usable entries of an answer into leaves and jobs.

        A step that names one of the pack's `actions` becomes the action's leaf: its key (so
        that the `$ref`s between the pack's leaves resolve), agent, tool, inputs, expected
        output, failure policy and risk; its task is the pack's, its rationale the model's (the
        pack's when the model gave none). It waits for the steps the model named and for the
        actions whose outputs its inputs reference. An action it references that is neither
        earlier in this answer nor upstream of the compound (`ExpansionJob.actions_before`) is
        pulled in just before it, with a warning, rather than sent back for repair: the pack's
        own leaf is the one the reference means, and adding it costs no call and always yields
        a runnable plan. An action named a second time in the same answer is planned once:
        the repeat is dropped with a warning and whatever waited for it waits for the first.
        A step naming an action the compound already waits for is dropped with a warning too,
        unless every step of the answer is such a repeat: an empty compound is no plan, so
        that answer is materialised as if nothing were upstream. The
        same action planned in two subtrees that do not wait for each other keeps its key in
        the first; `unique_keys` renames the second and rewrites the references to it, and
        once the tree is whole `merge_repeated_actions` runs it once (with a warning).
        """
        actions = actions or {}
        kept = answer.usable
        resolved = dependencies(answer.entries)
        ids = {entry.position: entry.step_id or "" for entry in kept}
        labels = {entry.position: entry.label for entry in kept}
        provenance = Provenance(strategy=strategy, source=source, depth=job.depth + 1)
        goal = job.goal.name
        # entry position -> key of the child that stands for it (None: an action upstream)
        keys: dict[int, str | None] = {}
        placed: dict[str, str] = {}  # action id -> key of its leaf in this answer
        # child key -> the pack actions at or upstream of it within this answer
        upstream: dict[str, frozenset[str]] = {}
        notes: list[str] = []
        children: list[Leaf | ExpansionJob] = []
        previous: str | None = None  # the key standing for the previous usable entry

        def before(depends_on: tuple[str, ...] | None) -> frozenset[str]:
            # the actions upstream of a child about to be added with these dependencies
            deps = depends_on
            if deps is None:
                deps = (children[-1].key,) if children else ()
            return frozenset().union(*(upstream.get(dep, frozenset()) for dep in deps))

        def add(child: Leaf | ExpansionJob, action: str | None = None) -> None:
            upstream[child.key] = before(child.depends_on) | ({action} if action else set())
            children.append(child)

        # a part whose every step is an action the compound already waits for would be left
        # empty, and an empty compound is no plan: it is planned as if nothing were upstream
        is_repeat_only = all(
            isinstance(entry.step, AgentStep) and entry.step.action in job.actions_before
            for entry in kept
        )
        available = frozenset() if is_repeat_only else job.actions_before

        def pull_in_for(consumer: str, chain: frozenset[str]) -> None:
            # place, before `consumer`, the actions its inputs use that nothing provides yet
            for needed in referenced_keys(actions[consumer].tool_inputs):
                if (
                    needed in actions
                    and needed not in placed
                    and needed not in available
                    and needed not in chain
                ):
                    pull_in_for(needed, chain | {needed})
                    action = actions[needed]
                    deps = self._action_deps(action, placed, ())
                    add(self._action_leaf(action, action.rationale, deps, provenance), needed)
                    placed[needed] = needed
                    notes.append(
                        f"action {consumer!r} of goal {goal!r} uses the output of action "
                        f"{needed!r}, which the plan had not placed before it: added {needed!r} "
                        f"({action.task!r}) before it"
                    )

        for entry in kept:
            step = entry.step
            deps = resolved[entry.position]
            depends_on = (
                None if deps is None else tuple(k for d in deps if (k := keys[d]) is not None)
            )
            if depends_on is None and previous is not None and children[-1].key != previous:
                # "after the previous step": the step before it is no longer the child before it
                depends_on = (previous,)
            if isinstance(step, AgentStep) and step.action is not None and step.action in actions:
                action_id = step.action
                if action_id in placed:
                    notes.append(
                        f"step {entry.describe()} of goal {goal!r} names action {action_id!r} "
                        f"again: the plan runs it once (what waited for the step waits for "
                        f"{placed[action_id]!r})"
                    )
                    keys[entry.position] = previous = placed[action_id]
                    continue
                if action_id in available:
                    # the whole compound already waits for it: the step adds nothing
                    notes.append(
                        f"step {entry.describe()} of goal {goal!r} names action {action_id!r}, "
                        "which the plan runs before this part: the plan runs it once"
                    )
                    keys[entry.position] = None
                    continue
                action = actions[action_id]
                pull_in_for(action_id, frozenset({action_id}))
                if depends_on is None:
                    # explicit: leaves pulled in just before it are not "the previous step"
                    depends_on = () if previous is None else (previous,)
                own = self._action_deps(action, placed, depends_on)
                add(self._action_leaf(action, step.rationale, own, provenance), action_id)
                placed[action_id] = keys[entry.position] = previous = action_id
                continue
            key = child_key(job, ids[entry.position])
            if key in actions:
                # a plain step must not take the key an action's references mean
                key = f"{job.key}.{ids[entry.position]}"
            keys[entry.position] = previous = key
            if isinstance(step, AgentStep):
                add(
                    Leaf(
                        key=key,
                        agent=step.agent,
                        task=step.task,
                        rationale=step.rationale,
                        depends_on=depends_on,
                        provenance=provenance,
                    )
                )
            elif isinstance(step, SubtaskStep):
                add(
                    ExpansionJob(
                        key=key,
                        goal=Goal(
                            name=step.subtask,
                            description=step.description,
                            parent=job.goal.name,
                            siblings=tuple(
                                label
                                for position, label in labels.items()
                                if position != entry.position
                            ),
                        ),
                        depth=job.depth + 1,
                        level=job.level + 1,
                        depends_on=depends_on,
                        namespaced=True,
                        actions_before=job.actions_before | before(depends_on),
                    )
                )
        run.check_fanout(len(children))
        run.add_leaves(sum(1 for child in children if isinstance(child, Leaf)))
        return Expansion(
            strategy=strategy,
            source=source,
            children=share_leaves(self.leaf_budget(job), children),
            warnings=warnings + tuple(notes),
        )

    @staticmethod
    def _action_deps(
        action: Capability, placed: Mapping[str, str], depends_on: tuple[str, ...] | None
    ) -> tuple[str, ...] | None:
        """Return `depends_on` with the leaves of this answer whose outputs `action` uses."""
        producers = [placed[key] for key in referenced_keys(action.tool_inputs) if key in placed]
        if not producers:
            return depends_on
        return tuple(dict.fromkeys((*(depends_on or ()), *producers)))

    @staticmethod
    def _action_leaf(
        action: Capability,
        rationale: str,
        depends_on: tuple[str, ...] | None,
        provenance: Provenance,
    ) -> Leaf:
        return Leaf(
            key=action.name,
            agent=action.agent,
            task=action.task,
            rationale=rationale or action.rationale,
            tool=action.tool,
            inputs=action.tool_inputs,
            depends_on=depends_on,
            expected_output=action.expected_output,
            failure_policy=action.failure_policy,
            risk=action.risk,
            provenance=provenance,
        )


def _read(text: str, rules: AnswerRules) -> Answer | None:
    try:
        return read_answer(extract_json(text), rules)
    except ValueError:
        return None
