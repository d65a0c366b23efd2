"""The broker's visibility timeout: a setting, its transport options, and a deploy-check warning
when it is shorter than a leaf's task may run (RELIABILITY E7, W1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from execution.checks import check_visibility_timeout
from tests.casehub.test_deploy_check import deploy_check, production_env
from tests.casehub.test_settings import _settings_in_subprocess

REDIS = "redis://127.0.0.1:6379/0"


def test_the_visibility_timeout_defaults_to_an_hour_and_is_swept_like_kombu_does(
    tmp_path: Path,
) -> None:
    opts = json.loads(
        _settings_in_subprocess({"SECRET_KEY": "k", "CELERY_BROKER_URL": REDIS}, tmp_path).stdout
    )["opts"]
    assert opts == {
        "visibility_timeout": 3600,
        "unacked_restore_interval": 10,
        "unacked_restore_throttle": 10,
    }


def test_a_short_visibility_timeout_is_swept_every_second(tmp_path: Path) -> None:
    env = {"SECRET_KEY": "k", "CELERY_BROKER_URL": REDIS}
    env["CASEHUB_BROKER_VISIBILITY_TIMEOUT_S"] = "3"
    opts = json.loads(_settings_in_subprocess(env, tmp_path).stdout)["opts"]
    assert opts == {
        "visibility_timeout": 3,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }


def test_a_visibility_timeout_shorter_than_a_leaf_task_is_warned_about(settings: Any) -> None:
    settings.CELERY_BROKER_URL = REDIS
    settings.CASEHUB_LEAF_HARD_LIMIT_S = 180
    settings.CASEHUB_BROKER_VISIBILITY_TIMEOUT_S = 389
    (warning,) = check_visibility_timeout()
    assert warning.id == "oversight.W001"
    assert "389 s" in warning.msg and "390 s" in warning.msg
    settings.CASEHUB_BROKER_VISIBILITY_TIMEOUT_S = 390
    assert check_visibility_timeout() == []
    settings.CELERY_BROKER_URL = "filesystem://"  # no visibility timeout there
    settings.CASEHUB_BROKER_VISIBILITY_TIMEOUT_S = 5
    assert check_visibility_timeout() == []


def test_the_deploy_check_refuses_a_short_visibility_timeout_in_production(tmp_path: Path) -> None:
    env = {**production_env(tmp_path), "CELERY_BROKER_URL": REDIS}
    assert deploy_check(env).returncode == 0
    result = deploy_check({**env, "CASEHUB_BROKER_VISIBILITY_TIMEOUT_S": "60"})
    assert result.returncode != 0
    assert "oversight.W001" in result.stdout + result.stderr
