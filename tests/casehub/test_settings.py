from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from web.env import ConfigError, env_bool, env_choice, env_float, env_int, env_list, env_str

ROOT = Path(__file__).resolve().parent.parent.parent


def test_env_helpers_parse_and_default() -> None:
    env = {"A": " x ", "B": "yes", "C": "0", "N": "42", "L": "a, b,,c"}
    assert env_str("A", environ=env) == "x"
    assert env_str("MISSING", "d", environ=env) == "d"
    assert env_bool("B", environ=env) is True
    assert env_bool("C", True, environ=env) is False
    assert env_int("N", 1, environ=env) == 42
    assert env_list("L", [], environ=env) == ["a", "b", "c"]


def test_env_helpers_refuse_malformed_values_by_name() -> None:
    with pytest.raises(ConfigError, match="DEBUG"):
        env_bool("DEBUG", environ={"DEBUG": "maybe"})
    with pytest.raises(ConfigError, match="PORT"):
        env_int("PORT", 1, environ={"PORT": "eighty"})
    with pytest.raises(ConfigError, match="CASEHUB_LLM_CONCURRENCY must be at least 1, not 0"):
        env_int("CASEHUB_LLM_CONCURRENCY", 64, environ={"CASEHUB_LLM_CONCURRENCY": "0"}, minimum=1)
    assert env_int("N", 5, environ={}, minimum=1) == 5


def test_a_choice_setting_takes_one_of_its_values_and_names_them_otherwise() -> None:
    formats = ("json_schema", "json_object")
    assert env_choice("F", formats, "json_schema", environ={}) == "json_schema"
    assert env_choice("F", formats, "json_schema", environ={"F": " json_object "}) == "json_object"
    with pytest.raises(ConfigError, match="F must be one of json_schema, json_object, not 'text'"):
        env_choice("F", formats, "json_schema", environ={"F": "text"})


def test_a_float_setting_is_unset_or_a_number_in_its_range() -> None:
    assert env_float("T", environ={}, low=0, high=2) is None
    assert env_float("T", environ={"T": " 0 "}, low=0, high=2) == 0.0
    assert env_float("T", environ={"T": "1.5"}, low=0, high=2) == 1.5
    with pytest.raises(ConfigError, match="T must be a number"):
        env_float("T", environ={"T": "warm"}, low=0, high=2)
    with pytest.raises(ConfigError, match="T must be between 0 and 2, not '3'"):
        env_float("T", environ={"T": "3"}, low=0, high=2)


def _settings_in_subprocess(
    env: dict[str, str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    code = (
        "import json; from django.conf import settings as s; "
        "print(json.dumps({'db': s.DATABASES['default'], 'broker': s.CELERY_BROKER_URL, "
        "'opts': getattr(s, 'CELERY_BROKER_TRANSPORT_OPTIONS', {}), 'key': s.SECRET_KEY},"
        " default=str))"
    )
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "SECRET_KEY", "CASEHUB_DEMO"}
    }
    full = {
        **base,
        "DJANGO_SETTINGS_MODULE": "casehub.settings",
        "CASEHUB_VAR_DIR": str(tmp_path),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True
    )


def test_an_out_of_range_planning_setting_stops_the_start_naming_it(tmp_path: Path) -> None:
    result = _settings_in_subprocess({"SECRET_KEY": "x", "CASEHUB_LLM_CONCURRENCY": "0"}, tmp_path)
    assert result.returncode != 0
    assert "CASEHUB_LLM_CONCURRENCY must be at least 1, not 0" in result.stderr


def test_secret_key_is_required_outside_demo_mode(tmp_path: Path) -> None:
    result = _settings_in_subprocess({}, tmp_path)
    assert result.returncode != 0
    assert "SECRET_KEY is required" in result.stderr


def test_demo_mode_generates_the_secret_key_once(tmp_path: Path) -> None:
    first = json.loads(_settings_in_subprocess({"CASEHUB_DEMO": "1"}, tmp_path).stdout)
    second = json.loads(_settings_in_subprocess({"CASEHUB_DEMO": "1"}, tmp_path).stdout)
    assert len(first["key"]) > 40
    assert first["key"] == second["key"]
    assert (tmp_path / "secret_key").stat().st_mode & 0o077 == 0


def test_defaults_are_sqlite_in_wal_mode_and_the_filesystem_broker(tmp_path: Path) -> None:
    conf = json.loads(_settings_in_subprocess({"SECRET_KEY": "k"}, tmp_path).stdout)
    assert conf["db"]["ENGINE"] == "django.db.backends.sqlite3"
    assert conf["db"]["NAME"].startswith(str(tmp_path))
    assert conf["db"]["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "journal_mode=WAL" in conf["db"]["OPTIONS"]["init_command"]
    assert conf["db"]["OPTIONS"]["timeout"] >= 5
    assert conf["broker"] == "filesystem://"
    assert conf["opts"]["polling_interval"] <= 0.1
    assert conf["opts"]["data_folder_in"].startswith(str(tmp_path))


def test_database_url_selects_postgresql(tmp_path: Path) -> None:
    env = {"SECRET_KEY": "k", "DATABASE_URL": "postgres://u:p@db.internal:5433/casehub"}
    conf = json.loads(_settings_in_subprocess(env, tmp_path).stdout)
    assert conf["db"]["ENGINE"] == "django.db.backends.postgresql"
    assert (conf["db"]["NAME"], conf["db"]["PORT"]) == ("casehub", 5433)


@pytest.mark.scenario("W1")
def test_production_settings_pass_the_deployment_checks(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"CASEHUB_DEMO", "DEBUG", "SECRET_KEY", "DJANGO_ALLOW_ASYNC_UNSAFE"}
    }
    env.update(
        {
            "SECRET_KEY": "x" * 30 + "-production-like-secret-key-0123456789",
            "SECURE_SSL_REDIRECT": "1",
            "SECURE_HSTS_SECONDS": "31536000",
            "CASEHUB_VAR_DIR": str(tmp_path),
        }
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
