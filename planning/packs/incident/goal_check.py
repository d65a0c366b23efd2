"""What an incident response must leave true, checked against the estate after the last step.

A fail-over must leave its service answering on its new primary; isolated hosts must no longer
answer; and no notice may tell the stakeholders a service is back while it does not answer, or
that a breach is contained while a host the case isolated still answers.
Outputs are recognised by their shape (the tools' result models), not by step keys, so plans
the LLM made are checked the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from planning.core.pack import GoalFindings
from planning.packs.incident.infrastructure import Infrastructure

# Words with which a notice claims a service is back, or a breach contained; a negation just
# before one takes it back.
_RECOVERY = re.compile(
    r"\b(back in service|back online|back up|is back|are back|restored|recovered|resolved|"
    r"up again|operational again)\b",
    re.IGNORECASE,
)
_CONTAINMENT = re.compile(r"\b(contained|isolated|cut off)\b", re.IGNORECASE)
_NEGATION = re.compile(r"\b(not|never|no longer|isn't|is not|aren't|wasn't)\s+(\w+\s+)?$")


def _claims(words: re.Pattern[str], text: str) -> bool:
    for match in words.finditer(text):
        before = text[max(0, match.start() - 30) : match.start()]
        if not _NEGATION.search(before.lower()):
            return True
    return False


def claims_recovery(text: str) -> bool:
    """Tell whether a notice's text says the service is back (and does not negate it)."""
    return _claims(_RECOVERY, text)


def claims_containment(text: str) -> bool:
    """Tell whether a notice's text says the breach is contained (and does not negate it)."""
    return _claims(_CONTAINMENT, text)


def _answers(infra: Infrastructure, service: str) -> tuple[bool, str]:
    primary = infra.primary(service)
    return infra.is_reachable(primary), primary


def goal_check(outputs: Mapping[str, Any], infra: Infrastructure) -> GoalFindings:
    """Return what keeps an incident response from having reached its goal, and what held."""
    problems: list[str] = []
    held: list[str] = []
    notices: list[Mapping[str, Any]] = []
    answering: list[str] = []  # hosts the case isolated that still answer
    for output in outputs.values():
        if not isinstance(output, Mapping):
            continue
        if {"service", "old_primary", "new_primary"} <= output.keys():
            service = str(output["service"])
            if not infra.has_database(service):
                problems.append(f"{service} is not a database the estate runs")
                continue
            answers, primary = _answers(infra, service)
            if answers:
                held.append(f"{service} answers on its primary {primary} after the fail-over")
            else:
                problems.append(
                    f"{service} does not answer after the fail-over: its primary {primary} "
                    "is unreachable"
                )
        elif isinstance(output.get("isolated"), list):
            for host in map(str, output["isolated"]):
                if infra.is_reachable(host):
                    answering.append(host)
                    problems.append(f"{host} still answers on the network after its isolation")
                else:
                    held.append(f"{host} no longer answers on the network")
        elif {"service", "recipients", "message"} <= output.keys():
            notices.append(output)
    for notice in notices:
        service, message = str(notice["service"]), str(notice["message"])
        refuted = False
        if infra.has_database(service) and claims_recovery(message):
            answers, primary = _answers(infra, service)
            if not answers:
                refuted = True
                problems.append(
                    f"the stakeholders were told “{message}”, but {service} does not answer: "
                    f"its primary {primary} is unreachable"
                )
        if answering and claims_containment(message):
            refuted = True
            verb = "answers" if len(answering) == 1 else "answer"
            problems.append(
                f"the stakeholders were told “{message}”, but {', '.join(answering)} still "
                f"{verb} on the network"
            )
        if not refuted:
            held.append(f"the stakeholders were told “{message}”; nothing in the estate refutes it")
    return GoalFindings(problems=tuple(problems), held=tuple(held))
