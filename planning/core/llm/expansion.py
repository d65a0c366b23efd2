"""The scheduling of a recursive decomposition: jobs, their expansions, one run's budgets.

A `PlanningRun` expands a root `ExpansionJob` and every job its `Expansion`s yield, concurrently
on a thread pool, within the ceilings of `LlmBudgets`, and assembles the tree. Shared by the LLM
strategy (`planning.core.llm.decomposition`) and the hybrid one (`planning.core.hybrid`).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from planning.core.errors import BudgetExceeded
from planning.core.tree import Compound, Goal, Leaf, Node, Provenance, StrategyName

__all__ = [
    "Expansion",
    "ExpansionJob",
    "LlmBudgets",
    "PlanningRun",
    "child_key",
    "share_leaves",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmBudgets:
    """Ceilings for one planning run; exceeding one raises `BudgetExceeded`."""

    max_calls: int = 50
    max_tokens: int = 500_000
    max_leaves: int = 200
    max_fanout: int = 10

    def __post_init__(self) -> None:
        for name in ("max_calls", "max_tokens", "max_leaves", "max_fanout"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpansionJob:
    """A compound waiting to be decomposed.

    `depth` is the compound's depth in the tree (root 0); `level` counts the LLM levels above it
    in its LLM-planned subtree (0 where the LLM takes over); `namespaced` marks compounds the
    model created, whose statically planned children get keys prefixed with the parent's key;
    `preset` holds children a static method already supplied (decomposed by `preset_source`);
    `actions_before` names the pack actions the model placed upstream of the compound, which
    its own steps may use without planning them again; `max_leaves` is the compound's share of
    the run's leaf budget (None: the whole budget, as for the root), see `share_leaves`.
    """

    key: str
    goal: Goal
    depth: int
    level: int = 0
    depends_on: tuple[str, ...] | None = None
    hint: str = ""
    namespaced: bool = False
    preset: tuple[Node, ...] = ()
    preset_source: str = ""
    actions_before: frozenset[str] = frozenset()
    max_leaves: int | None = None


def share_leaves(
    budget: int, children: Sequence[Node | ExpansionJob]
) -> tuple[Node | ExpansionJob, ...]:
    """Return `children` with each compound still to decompose given its share of `budget`.

    The leaves already among the children (a ready compound's included) come off the budget
    first; the rest is split evenly between the jobs (at least one leaf each).
    """
    jobs = sum(1 for child in children if isinstance(child, ExpansionJob))
    if not jobs:
        return tuple(children)
    placed = sum(
        1 if isinstance(child, Leaf) else sum(1 for _ in child.iter_leaves())
        for child in children
        if not isinstance(child, ExpansionJob)
    )
    share = max(1, (budget - placed) // jobs)
    return tuple(
        replace(child, max_leaves=share) if isinstance(child, ExpansionJob) else child
        for child in children
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Expansion:
    """The children of one compound; jobs among them are compounds still to decompose."""

    strategy: StrategyName
    source: str
    children: tuple[Node | ExpansionJob, ...]
    warnings: tuple[str, ...] = ()


class _Cancelled(Exception):
    """Raised inside a worker when the run has already failed."""


class PlanningRun:
    """The shared counters, budgets and thread pool of one planning run."""

    def __init__(self, budgets: LlmBudgets, *, max_concurrency: int) -> None:
        self.budgets = budgets
        self.max_concurrency = max_concurrency
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self.calls = 0
        self.tokens = 0
        self.leaves = 0

    def check_cancelled(self) -> None:
        """Raise `_Cancelled` when another branch of the run has failed."""
        if self._cancelled.is_set():
            raise _Cancelled

    def reserve_call(self) -> int:
        """Count one more model call and return its number; raise `BudgetExceeded`."""
        with self._lock:
            self.check_cancelled()
            if self.calls + 1 > self.budgets.max_calls:
                raise BudgetExceeded("llm_calls", self.budgets.max_calls, self.calls + 1)
            self.calls += 1
            return self.calls

    def remaining_tokens(self) -> int:
        """Return what is left of the token budget (at least 1: the ceiling check comes after)."""
        with self._lock:
            return max(1, self.budgets.max_tokens - self.tokens)

    def add_tokens(self, tokens: int) -> None:
        """Add the tokens of a call; raise `BudgetExceeded` past the token ceiling."""
        with self._lock:
            self.tokens += tokens
            if self.tokens > self.budgets.max_tokens:
                raise BudgetExceeded("llm_tokens", self.budgets.max_tokens, self.tokens)

    def add_leaves(self, count: int) -> None:
        """Add planned leaves; raise `BudgetExceeded` past the leaf ceiling."""
        with self._lock:
            self.leaves += count
            if self.leaves > self.budgets.max_leaves:
                raise BudgetExceeded("leaves", self.budgets.max_leaves, self.leaves)

    def check_fanout(self, count: int) -> None:
        """Raise `BudgetExceeded` when one decomposition has more children than allowed."""
        if count > self.budgets.max_fanout:
            raise BudgetExceeded("fan_out", self.budgets.max_fanout, count)

    def execute(
        self, root: ExpansionJob, expand: Callable[[ExpansionJob], Expansion]
    ) -> tuple[Compound, tuple[str, ...]]:
        """Expand `root` and every job it yields, concurrently; return the tree and warnings.

        The first failure cancels the jobs not yet started, lets running ones finish their
        current call, and is re-raised; no partial tree is returned.
        """
        expansions: dict[str, Expansion] = {}
        outstanding = 0
        failures: list[BaseException] = []
        finished = threading.Event()
        pool = ThreadPoolExecutor(
            max_workers=self.max_concurrency, thread_name_prefix="casehub-plan"
        )

        def submit(job: ExpansionJob) -> None:
            nonlocal outstanding
            with self._lock:
                outstanding += 1
            try:
                # in the submitter's context: a span open there (the planning run's) is the
                # parent of the job's LLM calls
                pool.submit(contextvars.copy_context().run, work, job)
            except RuntimeError:  # the pool is shutting down after a failure
                settle()

        def settle() -> None:
            nonlocal outstanding
            with self._lock:
                outstanding -= 1
                if outstanding == 0:
                    finished.set()

        def work(job: ExpansionJob) -> None:
            # a worker hands its children to the pool itself, so a level's calls start as soon
            # as their parent's answer arrives, without a round trip through a coordinator
            try:
                if self._cancelled.is_set():
                    return
                expansion = expand(job)
                with self._lock:
                    expansions[job.key] = expansion
                for child in expansion.children:
                    if isinstance(child, ExpansionJob):
                        submit(child)
            except _Cancelled:
                pass
            except BaseException as exc:
                with self._lock:
                    failures.append(exc)
                self._cancelled.set()
                finished.set()
            finally:
                settle()

        try:
            submit(root)
            finished.wait()
        except BaseException:
            self._cancelled.set()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if failures:
            raise failures[0]
        warnings: list[str] = []
        tree = _assemble(root, expansions, warnings)
        return tree, tuple(warnings)


def _assemble(job: ExpansionJob, expansions: Mapping[str, Expansion], out: list[str]) -> Compound:
    expansion = expansions[job.key]
    out.extend(expansion.warnings)
    children: list[Node] = []
    for child in expansion.children:
        if isinstance(child, ExpansionJob):
            children.append(_assemble(child, expansions, out))
        else:
            children.append(child)
    return Compound(
        key=job.key,
        name=job.goal.name,
        description=job.goal.description,
        children=tuple(children),
        depends_on=job.depends_on,
        provenance=Provenance(
            strategy=expansion.strategy, source=expansion.source, depth=job.depth
        ),
    )


def child_key(parent: ExpansionJob, step_id: str) -> str:
    """Return the tree key of a model-planned child: its id, prefixed below the root.

    Prefixing with the parent's key ("prepare-report.1") keeps keys unique across the tree.
    """
    if parent.depth == 0 and step_id != parent.key:
        return step_id
    return f"{parent.key}.{step_id}"
