"""The rows an installation cannot work without: the default reason codes and policy version 1.

Written by migration 0003 and checked again after every `migrate` (and after the test suite's
flushes), without touching what admins changed: a retired code stays retired, and policy
version 1 is only created when there is no policy version at all.
"""

from __future__ import annotations

from django.utils import timezone

from oversight.models import PolicyVersion, ReasonCode
from oversight.policy import PolicySettings

# (code, label, the kinds of decision it may justify)
REASON_CODES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("incorrect", "Incorrect: the step or plan is wrong", ("reject", "edit", "rerun")),
    ("incomplete", "Incomplete: something needed is missing", ("reject", "edit", "rerun")),
    ("too-risky", "Too risky to run as planned", ("reject", "edit", "cancel")),
    ("wrong-agent", "Assigned to the wrong agent", ("reject", "edit")),
    ("duplicate", "Duplicate of other work", ("reject", "cancel")),
    ("policy", "Required by policy", ("reject", "edit", "cancel", "policy")),
    ("threshold-review", "Periodic review of thresholds", ("policy",)),
    ("no-longer-needed", "No longer needed", ("cancel",)),
    ("other", "Other (explained in the text)", ("reject", "edit", "cancel", "rerun", "policy")),
)


def ensure_defaults() -> None:
    """Create the default reason codes and policy version 1 where they are missing."""
    for code, label, applies_to in REASON_CODES:
        ReasonCode.objects.get_or_create(
            code=code, defaults={"label": label, "applies_to": list(applies_to)}
        )
    if not PolicyVersion.objects.exists():
        PolicyVersion.objects.create(
            number=1,
            values=PolicySettings().as_data(),
            status=PolicyVersion.Status.ACTIVE,
            reason="the default policy",
            activated_at=timezone.now(),
        )
