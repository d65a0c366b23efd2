"""The rules of a case, named once: field limits, input bounds and who may do what.

The form, the API schemas and the actions all read these, so a limit or a permission is
changed in one place. Nothing here touches the database.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.models import User as AccountUser
from django.core.exceptions import PermissionDenied

from accounts.roles import CONFIGURE, DECIDE_GATE, SUBMIT_CASE, VIEW_ALL_CASES, VIEW_AUDIT
from planning.models import PACK_STRATEGIES, Strategy

# -- field limits ---------------------------------------------------------------------------

TITLE_MAX_LENGTH = 200
GOAL_MAX_LENGTH = 500
# The description feeds every LLM prompt of the case and is shown on the case page.
DESCRIPTION_MAX_LENGTH = 10_000
MIN_DEPTH = 1
MAX_DEPTH_LIMIT = 5
DEFAULT_MAX_DEPTH = 2

# Domain-less inputs go into prompts as they are: bound their size, nesting and keys.
INPUTS_MAX_CHARS = 20_000
INPUTS_MAX_NESTING = 6
INPUTS_MAX_KEY_LENGTH = 100
INPUTS_MAX_ITEMS = 500

# -- permissions ----------------------------------------------------------------------------

# Permissions that make a user one of the product's roles; anybody else reads nothing.
ROLE_PERMISSIONS = (SUBMIT_CASE, VIEW_ALL_CASES, VIEW_AUDIT, CONFIGURE)

# CaseHub uses Django's default user model (AUTH_USER_MODEL is not swapped).
type User = AccountUser | AnonymousUser


def _has(user: User, perm: str) -> bool:
    return bool(user.is_authenticated and user.has_perm(perm))


def can_submit_cases(user: User) -> bool:
    """Tell whether the user submits cases (analysts)."""
    return _has(user, SUBMIT_CASE)


def can_view_all_cases(user: User) -> bool:
    """Tell whether the user reads every case (officers, auditors)."""
    return _has(user, VIEW_ALL_CASES)


def can_read_cases(user: User) -> bool:
    """Tell whether the user reads cases at all (their own or everyone's)."""
    return can_view_all_cases(user) or can_submit_cases(user)


def can_view_quality(user: User) -> bool:
    """Tell whether the user reads the planning-quality metrics (compliance officers and admins)."""
    return _has(user, DECIDE_GATE) or _has(user, CONFIGURE)


def has_role(user: User) -> bool:
    """Tell whether the user holds any CaseHub role."""
    return any(_has(user, perm) for perm in ROLE_PERMISSIONS)


def require_submitter(user: User) -> None:
    """Raise PermissionDenied unless the user submits cases."""
    if not can_submit_cases(user):
        raise PermissionDenied("Only analysts submit cases.")


def require_case_reader(user: User) -> None:
    """Raise PermissionDenied unless the user reads cases."""
    if not can_read_cases(user):
        raise PermissionDenied("Only analysts, compliance officers and auditors read cases.")


def require_role(user: User) -> None:
    """Raise PermissionDenied unless the user holds a CaseHub role."""
    if not has_role(user):
        raise PermissionDenied("Your account has no CaseHub role.")


# -- strategies -----------------------------------------------------------------------------


def unavailable_strategies(*, has_domain: bool, has_provider: bool) -> dict[str, str]:
    """Return the strategies that cannot run for this choice, each with the reason in words."""
    reasons: dict[str, str] = {}
    for strategy in Strategy:
        if strategy in PACK_STRATEGIES and not has_domain:
            reasons[strategy] = "needs a domain pack"
        elif strategy == Strategy.LLM and not has_provider:
            reasons[strategy] = "needs an LLM provider, and this server has none configured"
        elif strategy == Strategy.HYBRID and not (has_provider or has_domain):
            reasons[strategy] = "needs a domain pack or an LLM provider (this server has none)"
    return reasons


# -- text and JSON values -------------------------------------------------------------------


def text_problem(value: str) -> str | None:
    """Return why a string cannot be stored or sent to a model, or None when it is fine."""
    if "\x00" in value:
        return "Must not contain NUL characters."
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "Must be valid Unicode text (it contains a lone surrogate)."
    return None


def json_problems(value: Any, path: str, *, bounded: bool) -> dict[str, list[str]]:
    """Return the problems of a JSON value by field path: bad text, non-finite numbers.

    With `bounded`, also the nesting depth, key length and item count limits for inputs that
    no pack schema checks.
    """
    problems: dict[str, list[str]] = {}
    count = 0

    def add(where: str, message: str) -> None:
        problems.setdefault(where, []).append(message)

    def walk(item: Any, where: str, depth: int) -> None:
        nonlocal count
        count += 1
        if bounded and depth > INPUTS_MAX_NESTING:
            add(where, f"Nested more than {INPUTS_MAX_NESTING} levels deep.")
            return
        if isinstance(item, str):
            if (problem := text_problem(item)) is not None:
                add(where, problem)
        elif isinstance(item, float) and not math.isfinite(item):
            add(where, "Must be a finite number (not NaN or infinite).")
        elif isinstance(item, Mapping):
            for key, child in item.items():
                key_text = str(key)
                if (problem := text_problem(key_text)) is not None:
                    add(where, f"Key: {problem}")
                    continue
                if bounded and len(key_text) > INPUTS_MAX_KEY_LENGTH:
                    add(where, f"Keys have at most {INPUTS_MAX_KEY_LENGTH} characters.")
                    continue
                walk(child, f"{where}.{key_text}", depth + 1)
        elif isinstance(item, list | tuple):
            for index, child in enumerate(item):
                walk(child, f"{where}.{index}", depth + 1)

    walk(value, path, 0)
    if bounded and count > INPUTS_MAX_ITEMS:
        add(path, f"At most {INPUTS_MAX_ITEMS} values in all.")
    return problems
