"""Scripted answers of the fake LLM for the planning tests: the model's side of a conversation."""

from __future__ import annotations

import json

from tests.fakes.openai_server import RecordedRequest


def fraud_plan_responder(request: RecordedRequest) -> str:
    """Answer like a model planning seed 000's fraud investigation at depth 2.

    The root answer has two agent steps and one subtask; the subtask's answer has two steps.
    """
    if "Goal: prepare-report" in request.user_prompt:
        steps = [
            {
                "id": "draft",
                "agent": "fraud-analyst",
                "task": "Draft the findings",
                "rationale": "writes reports",
                "depends_on": [],
            },
            {
                "id": "legal",
                "agent": "legal-counsel",
                "task": "Review the draft",
                "rationale": "legal sign-off",
                "depends_on": ["draft"],
            },
        ]
    else:
        steps = [
            {
                "id": "pull",
                "agent": "transaction-monitor",
                "task": "Pull the transactions",
                "rationale": "has the data",
                "depends_on": [],
            },
            {
                "id": "screen",
                "agent": "sanctions-screener",
                "task": "Screen the parties",
                "rationale": "sanctions lists",
                "depends_on": [],
            },
            {
                "id": "prepare-report",
                "subtask": "prepare-report",
                "description": "compile findings into a structured report",
                "depends_on": ["pull", "screen"],
            },
        ]
    return json.dumps({"steps": steps})  # fmt: skip


def incident_responder(request: RecordedRequest) -> str:
    """Answer like a model planning an incident that no static method covers."""
    steps = [
        {
            "id": "triage",
            "agent": "incident-commander",
            "task": "Triage the certificate expiry",
            "rationale": "owns incidents",
            "depends_on": [],
        },
        {
            "id": "notify",
            "agent": "comms-officer",
            "task": "Tell the stakeholders",
            "rationale": "communications",
            "depends_on": ["triage"],
        },
    ]
    return json.dumps({"steps": steps})  # fmt: skip
