"""Template filters of audit events: the title an auditor reads beside an event's code."""

from __future__ import annotations

from django import template

from audit import codes

register = template.Library()


@register.filter
def event_title(code: object) -> str:
    """Return the title of an audit event code; an unregistered code is its own title."""
    return codes.title(str(code))
