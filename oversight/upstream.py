"""What a gated step acts on: the outputs of the steps it takes its inputs from, as they are now.

A step gate opens with its plan, before anything ran; the officer often decides it later, once
the steps upstream have run. The gate page, the signature's meaning and the effects list all say
what is true at that moment: the real output once its step ran, "not run yet" only before.
Nothing here marks text safe: outputs come from tools, LLMs and people, and templates escape them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from planning.core.refs import REF_KEY, is_ref, referenced_keys
from planning.display import ValueRow, value_rows
from planning.models import NodeStatus, PlanNode

NOT_RUN = "not run yet"
# A value in a one-line summary (a signature's meaning, an input on the effects list) is cut here.
VALUE_CHARS = 160
SUMMARY_CHARS = 600


def _one_line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _scalar(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def output_summary(value: Any, *, limit: int = SUMMARY_CHARS) -> str:
    """Return an output on one line: each field of an object as `name: value` (lists joined),
    the single values first (a recommendation reads before the findings it rests on).

    Long values are cut with an ellipsis; the whole summary is at most `limit` characters.
    """
    if isinstance(value, Mapping):
        parts = []
        fields = sorted(value.items(), key=lambda pair: isinstance(pair[1], list | dict))
        for key, item in fields:
            if isinstance(item, list) and all(not isinstance(v, dict | list) for v in item):
                shown = "; ".join(_scalar(v) for v in item) if item else "none"
            else:
                shown = _scalar(item)
            parts.append(f"{str(key).replace('_', ' ')}: {_one_line(shown, VALUE_CHARS)}")
        return _one_line(" · ".join(parts), limit)
    return _one_line(_scalar(value), limit)


def run_state(node: PlanNode | None) -> str:
    """Return why a step shows no output, in words; empty when it has one."""
    if node is None:
        return "not a step of this plan version"
    if node.output is not None:
        return ""
    match node.status:
        case NodeStatus.SUCCEEDED:
            return "ran, without an output"
        case NodeStatus.RUNNING | NodeStatus.RETRYING:
            return "running: no output yet"
        case NodeStatus.FAILED:
            return "failed: no output" + (f" ({_one_line(node.error, 200)})" if node.error else "")
        case NodeStatus.SKIPPED | NodeStatus.CANCELLED | NodeStatus.BLOCKED:
            return f"{node.get_status_display().lower()}: it did not run"
    return NOT_RUN


@dataclass(frozen=True, slots=True)
class StepOutput:
    """A step's output as a page shows it: its rows once it ran, else why there is none."""

    key: str
    node: PlanNode | None
    rows: list[ValueRow]
    state: str

    @property
    def has_output(self) -> bool:
        return not self.state


def step_output(key: str, node: PlanNode | None) -> StepOutput:
    """Return the output of step `key` (its row `node`, None when the version has no such step)."""
    has_output = node is not None and node.output is not None
    rows = value_rows(node.output) if has_output and node is not None else []
    return StepOutput(key=key, node=node, rows=rows, state=run_state(node))


def shown_input(value: Any, by_key: Mapping[str, PlanNode]) -> str:
    """Return an input value in words: a reference names the step whose output it is, and that
    output once the step ran (`by_key`: the version's leaves by key)."""
    if not is_ref(value):
        return value if isinstance(value, str) else _scalar(value)
    key = str(value[REF_KEY])
    field = value.get("field")
    node = by_key.get(key)
    named = f"the output of {key}" + (f" ({field})" if field else "")
    if node is None or node.output is None:
        state = run_state(node)
        return f"{named}, once it has run" if state == NOT_RUN else f"{named}: {state}"
    output = node.output
    if field:
        output = output.get(field) if isinstance(output, Mapping) else None
    return f"{named}: {output_summary(output, limit=300)}"


def acted_on(node: PlanNode, by_key: Mapping[str, PlanNode]) -> str:
    """Return what a step acts on, for a signature's meaning: each step whose output its inputs
    take, with that output as it is now ("" when it takes none)."""
    inputs = node.inputs if isinstance(node.inputs, dict) else {}
    parts = []
    for key in referenced_keys(inputs):
        source = by_key.get(key)
        if source is not None and source.output is not None:
            parts.append(f"the output of {key} ({output_summary(source.output, limit=300)})")
        else:
            parts.append(f"the output of {key}, {run_state(source)}")
    return "; ".join(parts)


def referenced_steps(nodes: Iterable[PlanNode]) -> set[str]:
    """Return the keys of every step whose output these steps' inputs take."""
    return {
        key
        for node in nodes
        for key in referenced_keys(node.inputs if isinstance(node.inputs, dict) else {})
    }


__all__ = [
    "NOT_RUN",
    "StepOutput",
    "acted_on",
    "output_summary",
    "referenced_steps",
    "run_state",
    "shown_input",
    "step_output",
]
