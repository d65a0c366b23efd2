"""Trust learned from outcomes (pure: no database): whose failure moves it, and how far."""

from __future__ import annotations

import pytest

from execution.common import ErrorClass
from execution.trust import Evidence, failure_kind, score


@pytest.mark.parametrize(
    ("error_class", "kind"),
    [
        (ErrorClass.CONFIGURATION, "configuration"),
        (ErrorClass.TRANSIENT, "transient"),
        (ErrorClass.OUTPUT_INVALID, "agent"),
        (ErrorClass.TOOL_FAILURE, "agent"),
        (ErrorClass.POLICY_DENIAL, "agent"),
        (ErrorClass.TIMEOUT, "agent"),
        (ErrorClass.INVALID_INPUT, "agent"),
        (ErrorClass.POISON, "agent"),
    ],
)
def test_only_the_agents_own_failures_are_its_own(error_class: str, kind: str) -> None:
    assert failure_kind(error_class) == kind


def test_one_failure_lowers_a_060_prior_to_0545_as_routing_reads_it() -> None:
    assert score(0.6, Evidence()) == 0.6
    assert score(0.6, Evidence().adding("failed")) == pytest.approx(0.545, abs=5e-4)
