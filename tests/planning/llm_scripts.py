"""Scripted answers of the fake LLM for the planning tests: the model's side of a conversation."""

from __future__ import annotations

import json

from tests.fakes.openai_server import RecordedRequest


def fraud_plan_responder(request: RecordedRequest) -> str:
    """Answer like a model planning seed 000's fraud investigation at depth 2.

    The root answer has two agent steps and one subtask; the subtask's answer has two steps.
    Only the pack's llm and human agents are named: they are the ones the model is offered.
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
                "id": "review",
                "agent": "fraud-analyst",
                "task": "Review the flagged transactions",
                "rationale": "reads transaction patterns",
                "depends_on": [],
            },
            {
                "id": "interview",
                "agent": "investigator",
                "task": "Interview the account holder",
                "rationale": "talks to people",
                "depends_on": [],
            },
            {
                "id": "prepare-report",
                "subtask": "prepare-report",
                "description": "compile findings into a structured report",
                "depends_on": ["review", "interview"],
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
            "agent": "forensic-analyst",
            "task": "Draft the notice to the stakeholders",
            "rationale": "knows what happened",
            "depends_on": ["triage"],
        },
    ]
    return json.dumps({"steps": steps})  # fmt: skip
