"""Why an edited plan is refused, in sentences an officer reads (not the validator's codes and
paths): the plan's validation names steps, agents and tools in its own terse form."""

from __future__ import annotations

import re
from collections.abc import Callable

# Each of the validation's problems starts with the step's quoted key; they are joined by "; ".
_SPLIT = re.compile(r"; (?='[^']+': |'[^']+' depends on |dependency cycle|duplicate keys)")
_Q = r"'(?P<{}>[^']*)'"


def _pattern(text: str) -> re.Pattern[str]:
    for name in ("key", "agent", "tool", "name", "source", "field", "dep"):
        text = text.replace("{" + name + "}", _Q.format(name))
    return re.compile(f"^{text}$", re.S)


def _path(path: str) -> str:
    parts = [
        f"item {int(part) + 1}" if part.isdigit() else part
        for part in path.removeprefix("changes.").removeprefix("inputs.").split(".")
        if part
    ]
    return " → ".join(parts) or "the inputs"


def _field_problems(text: str) -> str:
    """Return pydantic's `path: message; …` as words: what is missing, extra or wrong."""
    found = []
    for item in text.split("; "):
        path, _, message = item.partition(": ")
        if not message:
            found.append(_lower(item))
        elif message == "Field required":
            found.append(f"“{_path(path)}” is missing")
        elif message.startswith("Extra inputs are not permitted"):
            found.append(f"“{_path(path)}” is not one of its inputs")
        else:
            found.append(f"“{_path(path)}”: {_lower(message)}")
    return "; ".join(found)


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


type Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]

_RULES: tuple[Rule, ...] = (
    (_pattern("{key}: unknown agent {agent}"), lambda m: f"there is no agent “{m['agent']}”"),
    (_pattern("{key}: agent {agent} is disabled"), lambda m: f"agent {m['agent']} is disabled"),
    (
        _pattern("{key}: tool agent {agent} has no tool to run"),
        lambda m: f"agent {m['agent']} only runs tools, and the step names none",
    ),
    (
        _pattern("{key}: tool {tool} is not allowed for {agent}"),
        lambda m: f"agent {m['agent']} cannot run tool {m['tool']}",
    ),
    (_pattern("{key}: unknown tool {tool}"), lambda m: f"there is no tool “{m['tool']}”"),
    (
        _pattern("{key}: inputs invalid for tool {tool}: (?P<rest>.+)"),
        lambda m: f"the inputs do not fit tool {m['tool']}: {_field_problems(m['rest'])}",
    ),
    (
        _pattern("{key}: tool {tool} has no input {name}"),
        lambda m: f"tool {m['tool']} has no input “{m['name']}”",
    ),
    (
        _pattern("{key}: tool {tool} needs input {name}"),
        lambda m: f"tool {m['tool']} needs the input “{m['name']}”",
    ),
    (
        _pattern("{key}: input {name} refers to {source}, which is not upstream"),
        lambda m: (
            f"input “{m['name']}” takes the output of {m['source']}, which does not run before it"
        ),
    ),
    (
        _pattern("{key}: input {name} refers to missing output field {field} of {source}"),
        lambda m: (
            f"input “{m['name']}” takes “{m['field']}” from the output of {m['source']}, "
            "which has none"
        ),
    ),
    (
        _pattern("{key}: input {name} invalid: (?P<rest>.+)"),
        lambda m: f"input “{m['name']}” is not valid: {_field_problems(m['rest'])}",
    ),
    (_pattern("{key}: (?P<rest>.+)"), lambda m: _lower(m["rest"])),
)

_PLAN_RULES: tuple[Rule, ...] = (
    (
        re.compile(r"^dependency cycle: (?P<cycle>.+)$"),
        lambda m: (
            "The steps would wait for each other in a circle: "
            + m["cycle"].replace("'", "").replace(" -> ", " → ")
            + "."
        ),
    ),
    (
        _pattern("{key} depends on unknown key {dep}"),
        lambda m: f"Step {m['key']} waits for {m['dep']}, which is not in the plan.",
    ),
    (_pattern("{key} depends on itself"), lambda m: f"Step {m['key']} cannot wait for itself."),
    (
        re.compile(r"^duplicate keys in plan: (?P<keys>.+)$"),
        lambda m: (
            f"The plan already has a step {m['keys'].replace(chr(39), '')}: "
            "give the new step another key."
        ),
    ),
)


def sentence(text: str) -> str:
    """Return `text` as a sentence: its first letter capital, a full stop at the end."""
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text[-1] in ".!?" else f"{text}."


def _one(problem: str) -> str:
    for pattern, words in _PLAN_RULES:
        if match := pattern.match(problem):
            return words(match)
    for pattern, words in _RULES:
        if match := pattern.match(problem):
            return sentence(f"Step {match['key']}: {words(match)}")
    return sentence(problem)


def problems_in_words(message: str) -> str:
    """Return the plan validation's problems (joined by "; ") as sentences, one after another."""
    return " ".join(_one(problem) for problem in _SPLIT.split(message) if problem.strip())


__all__ = ["problems_in_words", "sentence"]
