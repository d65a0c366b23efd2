"""The load run's short form in the suite (P1): a handful of officers against the real stack.

`bench.bench_load.run_short` drops and creates a database of its own beside the configured one
(its name with `_bench_load_short` appended), seeds officers and planned invoice cases, starts
gunicorn (two gthread workers) and a Celery worker on the configured Redis database, and runs
five simulated officers on threads (`bench/load_threads.py`) for fifteen seconds: inbox, gate and
case pages, the API's gate list and decisions by form and by API. Then two officers race on a few
plan gates (form and API released together), and the database is counted. Correctness only: the
figures' timings are the bench's business (`python -m bench load`), not this test's.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings

from bench.bench_load import Users, run_short

SECONDS = 15.0
RACES = 3


def _own_database_url() -> str:
    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the load run needs PostgreSQL (CI runs it)")
    url = os.environ["DATABASE_URL"]
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{parts.path.lstrip('/')}_bench_load_short"))


@pytest.mark.slow
@pytest.mark.scenario("P1")
def test_a_short_load_run_loses_no_decision_makes_none_twice_and_answers_no_5xx() -> None:
    url = _own_database_url()
    redis_url = settings.CELERY_BROKER_URL
    if not redis_url.startswith("redis://"):
        pytest.skip("the load run needs Redis (CI runs it)")
    figures = run_short(
        url,
        redis_url,
        seconds=SECONDS,
        users=Users(count=5, spawn_rate=5.0, wait=(0.5, 2.0), threaded=True),
        cases=16,
        races=RACES,
    )
    assert figures["load.requests"] > 0
    assert figures["load.decisions"] > RACES, "the users decided gates too"
    assert figures["load.5xx"] == 0
    assert figures["load.no_answer"] == 0
    assert figures["load.unexpected"] == 0
    assert figures["load.decided_events"] == figures["load.decisions"]
    assert figures["load.decision_rows"] == figures["load.decisions"]
    assert figures["load.duplicate_decisions"] == 0
    assert figures["load.chains_verified"] > 0
    assert figures["load.chain_problems"] == 0
    assert figures["load.race.gates"] == RACES
    assert figures["load.race.lost"] == 0
    assert figures["load.tracebacks_logged"] == 0
