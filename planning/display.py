"""How pages show what steps produced: JSON values as rows a person reads, durations in words.

Nothing here marks text safe: templates escape every value (outputs come from tools, LLMs and
people).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class ValueRow:
    """One key of a JSON object as a page shows it: text, a list of texts, or pretty JSON."""

    label: str
    kind: str  # "text", "list" or "json"
    text: str = ""
    items: tuple[str, ...] = ()


def _scalar(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def pretty_json(value: Any) -> str:
    """Return `value` as indented JSON (keys sorted, non-ASCII kept)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def value_rows(value: Any) -> list[ValueRow]:
    """Return a JSON value as rows: each key of an object, or the whole value as JSON.

    Scalars read as text (yes/no for booleans), lists of scalars as lists, anything nested as
    pretty JSON.
    """
    if not isinstance(value, dict):
        return [ValueRow(label="", kind="json", text=pretty_json(value))]
    rows = []
    for key, item in value.items():
        label = str(key).replace("_", " ")
        if isinstance(item, list) and all(not isinstance(v, dict | list) for v in item):
            rows.append(ValueRow(label=label, kind="list", items=tuple(_scalar(v) for v in item)))
        elif isinstance(item, dict | list):
            rows.append(ValueRow(label=label, kind="json", text=pretty_json(item)))
        else:
            rows.append(ValueRow(label=label, kind="text", text=_scalar(item)))
    return rows


def duration(started: datetime | None, finished: datetime | None, now: datetime) -> str:
    """Return how long a step ran (or has been running) in words; empty when it never started."""
    if started is None:
        return ""
    seconds = max(0.0, ((finished or now) - started).total_seconds())
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def provenance_text(provenance: Any) -> str:
    """Return where a plan node came from in words: "promoted method X v1", "LLM call 3", or
    "method X" (hybrid's "static:X"); the raw source otherwise."""
    source = str(provenance.get("source", "")) if isinstance(provenance, dict) else ""
    if source.startswith("promoted:"):
        name, _, version = source.removeprefix("promoted:").rpartition("@v")
        return f"promoted method {name} v{version}" if name else source
    if source.startswith("llm:"):
        return f"LLM call {source.removeprefix('llm:')}"
    if source.startswith("static:"):
        return f"method {source.removeprefix('static:')}"
    return source or "?"
