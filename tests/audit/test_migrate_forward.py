"""A database made before models moved apps (to audit, accounts, execution, and planning for
the LLM budget ledger) migrates forward with nothing lost.

The fixtures in tests/fixtures/premove/ are dumps (SQLite and PostgreSQL) of a database made at
main before the move (commit ebc16b1): migrated, `seed_demo` run, two INV-1042 cases planned,
and checkpoints written: 70 audit events on three chains. Each test loads the dump into a
scratch database of the configured backend, runs today's `manage.py migrate` on it in a
subprocess, and then checks in another subprocess that every event is still there with its
hash, every chain verifies, the append-only triggers still refuse a change, and the models'
content types (with their permissions) moved to the audit app.
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "premove"
EVENTS_BEFORE = 70
CHAINS_BEFORE = ["case:1", "case:2", "system"]

CHECK = """
import json
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction
from audit.chain import append_event, check_chain
from audit.models import AuditChainHead, AuditEvent
chains = sorted(set(AuditEvent.objects.values_list("chain", flat=True)))
heads_follow = {
    head.chain: head.prev_hash
    == AuditEvent.objects.get(chain=head.chain, seq=head.seq).prev_hash
    for head in AuditChainHead.objects.all()
}
hashes = sorted(AuditEvent.objects.values_list("hash", flat=True))
appended = append_event("migrate.forward.checked", chain=chains[0])
appended_problems = [str(p) for p in check_chain(chains[0]).problems]
problems = {c: [str(p) for p in check_chain(c).problems] for c in chains}
refused = False
try:
    with transaction.atomic():
        AuditEvent.objects.filter(seq=1).update(action="tampered.event")
except Exception as exc:
    refused = "append-only" in str(exc)
with connection.cursor() as cursor:
    constraints = connection.introspection.get_constraints(cursor, "oversight_auditevent")
print(json.dumps({
    "chains": chains,
    "problems": problems,
    "hashes": hashes,
    "refused": refused,
    "heads_follow": heads_follow,
    "hash_indexes": sorted(
        name for name, c in constraints.items() if c["columns"] == ["hash"]
    ),
    "appended": [appended.seq, appended_problems],
    "content_types": sorted(
        f"{t.app_label}.{t.model}" for t in ContentType.objects.filter(model__startswith="audit")
    ),
    "moved": sorted(
        f"{t.app_label}.{t.model}"
        for t in ContentType.objects.filter(
            model__in=[
                "apitoken", "signingstate", "accessdenial", "passwordresetrequest",
                "rolegrantrequest", "llmusage", "llmreservation", "workerheartbeat",
                "executioncontrol", "leafattempt", "trustscore", "workitem",
            ]
        )
    ),
    "permissions": sorted(
        f"{p.content_type.app_label}.{p.codename}"
        for p in Permission.objects.filter(codename__endswith="auditevent")
    ),
}))
"""


def _manage(database_url: str, *args: str) -> str:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("CASEHUB_DB_APP_ROLE", "CASEHUB_DEMO", "PYTEST_CURRENT_TEST")
    }
    env.update(
        DATABASE_URL=database_url,
        SECRET_KEY="migrate-forward-test",
        CASEHUB_VAR_DIR=str(Path(settings.VAR_DIR) / "migrate-forward"),
    )
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _sqlite_hashes(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return sorted(row[0] for row in db.execute("SELECT hash FROM oversight_auditevent"))


@pytest.fixture
def premove_database(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """Load the pre-move dump into a scratch database; yield its URL and the events' hashes."""
    if connection.vendor == "sqlite":
        path = tmp_path / "premove.sqlite3"
        with gzip.open(FIXTURES / "sqlite.sql.gz", "rt") as dump, sqlite3.connect(path) as db:
            db.executescript(dump.read())
        yield f"sqlite:///{path}", _sqlite_hashes(path)
        return
    assert connection.vendor == "postgresql", connection.vendor
    params = connection.settings_dict
    name = f"casehub_premove_{uuid.uuid4().hex[:10]}"
    psql = [
        "psql",
        "-h",
        str(params["HOST"] or "127.0.0.1"),
        "-p",
        str(params["PORT"] or 5432),
        "-U",
        str(params["USER"]),
        "-v",
        "ON_ERROR_STOP=1",
        "-q",
    ]
    env = {**os.environ, "PGPASSWORD": str(params.get("PASSWORD") or "")}
    subprocess.run([*psql, "-d", "postgres", "-c", f"CREATE DATABASE {name}"], env=env, check=True)
    try:
        with gzip.open(FIXTURES / "postgresql.sql.gz", "rb") as dump:
            subprocess.run(
                [*psql, "-d", name], input=dump.read(), env=env, check=True, capture_output=True
            )
        hashes = subprocess.run(
            [*psql, "-d", name, "-Atc", "SELECT hash FROM oversight_auditevent"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        password = f":{params['PASSWORD']}" if params.get("PASSWORD") else ""
        url = (
            f"postgres://{params['USER']}{password}@{params['HOST'] or '127.0.0.1'}"
            f":{params['PORT'] or 5432}/{name}"
        )
        yield url, sorted(hashes)
    finally:
        subprocess.run(
            [*psql, "-d", "postgres", "-c", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"],
            env=env,
            check=False,
        )


@pytest.mark.slow
@pytest.mark.django_db
def test_a_database_made_before_the_move_migrates_forward_and_verifies(
    premove_database: tuple[str, list[str]],
) -> None:
    url, hashes_before = premove_database
    assert len(hashes_before) == EVENTS_BEFORE

    _manage(url, "migrate", "--verbosity", "0")
    shown = _manage(url, "showmigrations", "audit", "oversight", "planning", "execution")
    assert "[ ]" not in shown
    found = json.loads(
        _manage(url, "shell", "--verbosity", "0", "-c", CHECK).strip().splitlines()[-1]
    )

    assert found["chains"] == CHAINS_BEFORE
    assert found["hashes"] == hashes_before
    assert found["problems"] == {chain: [] for chain in CHAINS_BEFORE}
    assert found["refused"] is True
    # The heads keep the hash their last event follows (audit 0002), and appending goes on.
    assert found["heads_follow"] == {chain: True for chain in CHAINS_BEFORE}
    # The event's hash is no longer indexed (audit 0003): neither its unique index nor the
    # LIKE index beside it on PostgreSQL is left.
    assert found["hash_indexes"] == []
    assert found["appended"][1] == []
    assert found["appended"][0] > 1
    assert found["content_types"] == ["audit.auditchainhead", "audit.auditevent"]
    assert found["moved"] == [
        "accounts.accessdenial",
        "accounts.apitoken",
        "accounts.passwordresetrequest",
        "accounts.rolegrantrequest",
        "accounts.signingstate",
        "execution.executioncontrol",
        "execution.leafattempt",
        "execution.trustscore",
        "execution.workerheartbeat",
        "execution.workitem",
        "planning.llmreservation",
        "planning.llmusage",
    ]
    assert "audit.view_auditevent" in found["permissions"]
    assert not [p for p in found["permissions"] if p.startswith("oversight.")]
