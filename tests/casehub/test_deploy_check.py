"""Production settings, as "Running in production" in docs/operations.md sets them, pass Django's
deploy check with warnings as failures (RELIABILITY W1); the check is not a formality: each
missing hardening setting fails it."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def production_env(var_dir: Path) -> dict[str, str]:
    """Return the production environment of docs/operations.md (no database is reached)."""
    env = {
        key: value
        for key, value in os.environ.items()
        # DJANGO_ALLOW_ASYNC_UNSAFE: the browser tests set it in this process; never in production.
        if not key.startswith(("SECURE_", "CASEHUB_", "DEBUG", "SECRET_KEY", "ALLOWED_HOSTS"))
        and key != "DJANGO_ALLOW_ASYNC_UNSAFE"
    }
    env.update(
        SECRET_KEY=secrets.token_urlsafe(64),
        DEBUG="0",
        CASEHUB_VAR_DIR=str(var_dir),
        ALLOWED_HOSTS="casehub.example.org",
        CSRF_TRUSTED_ORIGINS="https://casehub.example.org",
        SECURE_SSL_REDIRECT="1",
        SECURE_HSTS_SECONDS="31536000",
    )
    return env


def deploy_check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.scenario("W1", "F8")
def test_the_production_settings_pass_the_deploy_check(tmp_path: Path) -> None:
    result = deploy_check(production_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.scenario("W1")
@pytest.mark.parametrize(
    ("change", "warning"),
    [
        ({"DEBUG": "1"}, "security.W018"),
        ({"SECRET_KEY": "short"}, "security.W009"),
        ({"SECURE_SSL_REDIRECT": "0"}, "security.W008"),
    ],
)
def test_each_missing_hardening_setting_fails_the_deploy_check(
    tmp_path: Path, change: dict[str, str], warning: str
) -> None:
    result = deploy_check({**production_env(tmp_path), **change})
    assert result.returncode != 0
    assert warning in result.stdout + result.stderr
