"""Parsing backend options that may arrive as strings from a URL query."""

from __future__ import annotations

import math

__all__ = ["as_bool", "as_float", "as_int"]


def as_bool(value: bool | str, name: str) -> bool:
    """A boolean option: a bool, or one of 1/0, true/false, yes/no, on/off."""
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"option {name} must be true or false, got {value!r}")


def as_float(value: float | str, name: str, *, minimum: float | None = None) -> float:
    """A finite number option, at least ``minimum`` if given."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"option {name} must be a number, got {value!r}") from None
    if not math.isfinite(number) or (minimum is not None and number < minimum):
        bound = f" >= {minimum:g}" if minimum is not None else ""
        raise ValueError(f"option {name} must be a finite number{bound}, got {value!r}")
    return number


def as_int(value: int | str, name: str, *, minimum: int | None = None) -> int:
    """A whole number option, at least ``minimum`` if given."""
    if isinstance(value, bool):
        raise ValueError(f"option {name} must be a whole number, got {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"option {name} must be a whole number, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"option {name} must be >= {minimum}, got {value!r}")
    return number
