"""Backups restored (RELIABILITY F5, F6): a real `pg_dump` of a database with finished cases,
restored with `pg_restore`, checked by CaseHub's own commands in processes of their own.

F5: restored into a fresh database, every chain and checkpoint verifies and a restored case's
export bundle is INTACT offline (`casehub_verify.py`, trusting only the public key).
F6: an older backup restored where a newer installation's checkpoints are (the anchor directory
lives outside the database, as docs/operations.md says to keep it) is reported as a rollback of
each chain that moved, audited as `oversight.audit.broken` in the restored database, and the
command fails: it is never accepted in silence.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from audit import checkpoints as anchors
from audit.chain import case_chain
from audit.export import export_case_bundle
from audit.signing import current_key
from tests import personas
from tests.execution.test_execution_pages import completed_invoice_case

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent.parent


def _pg(args: list[str], *, dbname: str = "postgres") -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL client program as the test database's user; fail on a non-zero exit."""
    db = settings.DATABASES["default"]
    env = {**os.environ, "PGPASSWORD": str(db.get("PASSWORD") or "")}
    conn = ["-h", str(db.get("HOST") or "127.0.0.1"), "-p", str(db.get("PORT") or 5432)]
    conn += ["-U", str(db["USER"])]
    command = [args[0], *conn, *args[1:]]
    if args[0] == "psql":
        command += ["-d", dbname]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result


def _url(name: str) -> str:
    db = settings.DATABASES["default"]
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return (
        f"postgres://{db['USER']}{password}@{db.get('HOST') or '127.0.0.1'}:"
        f"{db.get('PORT') or 5432}/{name}"
    )


@pytest.fixture
def databases() -> Iterator[list[str]]:
    """Fresh database names the test restores into; dropped afterwards."""
    if connection.vendor != "postgresql":
        pytest.skip("pg_dump and pg_restore need PostgreSQL (CI runs it)")
    made: list[str] = []
    yield made
    for name in made:
        _pg(["psql", "-q", "-c", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'])


def _dump(path: Path) -> Path:
    _pg(["pg_dump", "-Fc", "-f", str(path), str(settings.DATABASES["default"]["NAME"])])
    return path


def _restore(dump: Path, made: list[str]) -> str:
    name = f"casehub_restore_{uuid.uuid4().hex[:10]}"
    owner = settings.DATABASES["default"]["USER"]
    _pg(["psql", "-q", "-c", f'CREATE DATABASE "{name}" OWNER "{owner}"'])
    made.append(name)
    _pg(["pg_restore", "--exit-on-error", "-d", name, str(dump)])
    return name


def _manage(database: str, dirs: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    """Run `manage.py` against `database` with this installation's keys and checkpoints."""
    env = {
        **os.environ,
        "DATABASE_URL": _url(database),
        "SECRET_KEY": "backup-restore-test",
        "CASEHUB_VAR_DIR": str(dirs["var"]),
        "CASEHUB_AUDIT_ANCHOR_DIR": str(dirs["anchors"]),
        "CASEHUB_SIGNING_KEY_DIR": str(dirs["keys"]),
    }
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def dirs(settings: Any, tmp_path: Path) -> dict[str, Path]:
    """The directories kept outside the database: checkpoints and signing keys."""
    found = {
        "anchors": tmp_path / "audit-anchors",
        "keys": tmp_path / "signing-keys",
        "var": tmp_path / "var",
    }
    settings.CASEHUB_AUDIT_ANCHOR_DIR = found["anchors"]
    settings.CASEHUB_SIGNING_KEY_DIR = found["keys"]
    found["var"].mkdir()
    return found


@pytest.mark.scenario("F5")
def test_a_backup_restored_into_a_fresh_database_verifies_and_exports_intact(
    databases: list[str], dirs: dict[str, Path], tmp_path: Path
) -> None:
    officer = personas.officer()
    case_id = completed_invoice_case(personas.analyst(), officer)
    run = anchors.write_checkpoints()
    assert case_chain(case_id) in {checkpoint.chain for checkpoint in run.written}
    restored = _restore(_dump(tmp_path / "casehub.dump"), databases)

    checked = _manage(restored, dirs, "audit_checkpoint")
    assert checked.returncode == 0, checked.stderr
    assert "every chain is intact" in checked.stdout

    bundle = tmp_path / "restored-case.zip"
    export = (
        "from django.contrib.auth.models import User; from audit.export import export_case_bundle; "
        f"user = User.objects.get(username={officer.username!r}); "
        f"b = export_case_bundle(case_id={case_id}, exporter=user); "
        f"b.file.seek(0); open({str(bundle)!r}, 'wb').write(b.file.read())"
    )
    exported = _manage(restored, dirs, "shell", "-c", export)
    assert exported.returncode == 0, exported.stderr
    public_key = current_key().public_key.hex()
    offline = subprocess.run(
        [sys.executable, "casehub_verify.py", str(bundle), "--public-key", public_key],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert "INTACT" in offline.stdout


@pytest.mark.scenario("F6")
def test_an_older_backup_restored_under_newer_checkpoints_is_reported_as_a_rollback(
    databases: list[str], dirs: dict[str, Path], tmp_path: Path
) -> None:
    analyst, officer = personas.analyst(), personas.officer()
    first = completed_invoice_case(analyst, officer)
    anchors.write_checkpoints()
    older = _dump(tmp_path / "older.dump")
    # The installation goes on: a second case, an export (a system event), newer checkpoints.
    second = completed_invoice_case(analyst, officer)
    export_case_bundle(case_id=first, exporter=personas.auditor()).file.close()
    newer = anchors.write_checkpoints()
    assert {"system", case_chain(second)} <= {checkpoint.chain for checkpoint in newer.written}
    restored = _restore(older, databases)

    checked = _manage(restored, dirs, "audit_checkpoint")
    assert checked.returncode == 1, checked.stdout
    assert "BROKEN: system" in checked.stderr and "rollback" in checked.stderr
    # The first case's chain did not move after the older backup: it verifies. The second case
    # is not in the older backup at all, and its checkpoint says it existed.
    assert f"BROKEN: {case_chain(first)}" not in checked.stderr
    assert f"BROKEN: {case_chain(second)}" in checked.stderr
    alerts = _pg(
        [
            "psql",
            "-At",
            "-c",
            "SELECT data->>'chain' FROM oversight_auditevent "
            "WHERE action = 'oversight.audit.broken' ORDER BY seq",
        ],
        dbname=restored,
    ).stdout.split()
    assert "system" in alerts and case_chain(second) in alerts
    # Run again: still refused, still alerting (a restore is never accepted by waiting).
    again = _manage(restored, dirs, "audit_checkpoint")
    assert again.returncode == 1 and "rollback" in again.stderr
