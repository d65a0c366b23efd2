"""A worked example for the planning prompt, drawn from a domain pack's own methods.

One real decomposition shows a small model the size of a step, distinct ids and how
``depends_on`` names earlier steps. The example is what a method of the pack makes of the case's
state: a method for the goal's own task whose guard holds if there is one, else another method
for that task, else one for the pack's root task (labelled as made for another case when its
guard does not hold). It keeps the ids, the task texts and the order, never the agents or tools:
the pack's tool agents are not offered to the model, and a copied agent would only be refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from planning.core.static import Method, MethodLibrary, Step, TaskRef
from planning.core.tree import Compound, Leaf

__all__ = ["MAX_EXAMPLE_STEPS", "DecompositionExample", "ExampleStep", "method_example"]

# An example longer than this teaches no more and costs tokens on every request.
MAX_EXAMPLE_STEPS = 8
MAX_EXAMPLE_TEXT_CHARS = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class ExampleStep:
    """One child of the example: an action (`text` is its task) or a subtask (its name)."""

    id: str
    text: str
    description: str = ""
    is_subtask: bool = False
    depends_on: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DecompositionExample:
    """What one method of the pack makes of a task: its steps, in order."""

    task: str
    method: str
    is_for_this_case: bool
    steps: tuple[ExampleStep, ...]


def _short(text: str) -> str:
    text = " ".join(text.split())
    if len(text) <= MAX_EXAMPLE_TEXT_CHARS:
        return text
    return text[: MAX_EXAMPLE_TEXT_CHARS - 1].rstrip() + "…"


def _step(item: object) -> ExampleStep | None:
    if isinstance(item, Step | Leaf):
        return ExampleStep(id=item.key, text=_short(item.task), depends_on=item.depends_on)
    if isinstance(item, TaskRef):
        return ExampleStep(
            id=item.key,
            text=_short(item.task),
            description=_short(item.description),
            is_subtask=True,
            depends_on=item.depends_on,
        )
    if isinstance(item, Compound):
        return ExampleStep(
            id=item.key,
            text=_short(item.name),
            description=_short(item.description),
            is_subtask=True,
            depends_on=item.depends_on,
        )
    return None


def _decompose(method: Method, state: Mapping[str, Any]) -> tuple[ExampleStep, ...]:
    try:
        items = method.decompose(state)
    except Exception:  # a method may need state this case lacks: try the next one
        return ()
    steps = tuple(step for item in items if (step := _step(item)) is not None)
    return steps[:MAX_EXAMPLE_STEPS]


def _holds(method: Method, state: Mapping[str, Any]) -> bool:
    try:
        return bool(method.guard(state))
    except Exception:  # a guard reading state this case lacks does not hold
        return False


def method_example(
    library: MethodLibrary, tasks: Sequence[str], state: Mapping[str, Any]
) -> DecompositionExample | None:
    """Return the first decomposition a method for one of `tasks` makes of `state`.

    Methods whose guard holds come first, for each task in turn; a method that fails on the
    state is passed over. None when no method for these tasks decomposes the state.
    """
    for task in dict.fromkeys(t for t in tasks if t):
        methods = library.methods_for(task)
        holding = [m for m in methods if _holds(m, state)]
        for method in (*holding, *(m for m in methods if m not in holding)):
            steps = _decompose(method, state)
            if steps:
                return DecompositionExample(
                    task=task,
                    method=method.name,
                    is_for_this_case=method in holding,
                    steps=steps,
                )
    return None
