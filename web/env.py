"""Typed readers for the environment variables that configure CaseHub."""

from __future__ import annotations

import os
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigError(RuntimeError):
    """A configuration variable is missing or malformed."""


def env_str(name: str, default: str = "", environ: Mapping[str, str] = os.environ) -> str:
    """Return the variable as a stripped string, or the default when unset or blank."""
    value = environ.get(name, "").strip()
    return value or default


def env_bool(name: str, default: bool = False, environ: Mapping[str, str] = os.environ) -> bool:
    """Return the variable as a boolean.

    Raises ConfigError on anything but 1/0, true/false, yes/no, on/off.
    """
    raw = environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name} must be one of 1/0/true/false/yes/no/on/off, not {raw!r}")


def env_int(
    name: str,
    default: int,
    environ: Mapping[str, str] = os.environ,
    *,
    minimum: int | None = None,
) -> int:
    """Return the variable as an integer.

    Raises ConfigError when it is not one, or is below `minimum`.
    """
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, not {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, not {value}")
    return value


def env_decimal(
    name: str, default: Decimal = Decimal(0), environ: Mapping[str, str] = os.environ
) -> Decimal:
    """Return the variable as a non-negative decimal number (``1.50``), or the default.

    Raises ConfigError when it is not a finite number, or is negative.
    """
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise ConfigError(f"{name} must be a number (e.g. 5.00), not {raw!r}") from None
    if not value.is_finite():
        raise ConfigError(f"{name} must be a finite number, not {raw!r}")
    if value < 0:
        raise ConfigError(f"{name} cannot be negative, not {raw!r}")
    return value


def env_float(
    name: str, environ: Mapping[str, str] = os.environ, *, low: float, high: float
) -> float | None:
    """Return the variable as a number between `low` and `high`, or None when unset or blank.

    Raises ConfigError when it is not a number or is out of that range.
    """
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number (e.g. 0.2), not {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} must be between {low:g} and {high:g}, not {raw!r}")
    return value


def env_choice(
    name: str, choices: tuple[str, ...], default: str, environ: Mapping[str, str] = os.environ
) -> str:
    """Return the variable when it is one of `choices`, or the default when unset or blank.

    Raises ConfigError on any other value, naming the choices.
    """
    value = env_str(name, default, environ)
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, not {value!r}")
    return value


def env_list(name: str, default: list[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """Return the variable split on commas, blanks dropped."""
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]
