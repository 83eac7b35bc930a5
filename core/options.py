"""Checking options and arguments: one place that turns bad input into a typed error.

Backend options arrive as strings from a URL query or as any Python value from
keyword arguments; worker settings (``Consumer``, ``LeaseKeeper``) as keywords.
Each helper accepts the forms that make sense, returns the value in its one
type, and refuses anything else with an :class:`~leasekit.errors.InvalidURL`
(for ``open()`` options, the default) or the error class given — never a
``TypeError``, ``AttributeError`` or ``OverflowError`` from deeper down.
Messages name the option and repeat the value (never use these for secrets).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import InvalidArgument, InvalidURL

__all__ = [
    "MAX_SECONDS",
    "as_bool",
    "as_choice",
    "as_float",
    "as_int",
    "as_items",
    "as_object",
    "as_text",
    "check_bool",
    "check_callable",
    "check_int",
    "check_number",
    "check_text",
    "is_number",
]

#: Longest span of seconds a setting may have: the longest wait a thread can make.
MAX_SECONDS = threading.TIMEOUT_MAX

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
#: Longest value repeated in an error message.
_SHOWN = 60


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def is_number(value: object) -> bool:
    """Whether ``value`` is an ``int`` or ``float`` (not a ``bool``) that fits a float."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    if isinstance(value, int):
        try:
            float(value)
        except OverflowError:
            return False
    return True


def as_bool(value: object, name: str, *, error: type[InvalidArgument] = InvalidURL) -> bool:
    """A boolean option: a bool, 0 or 1, or one of 1/0, true/false, yes/no, on/off as text."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise error(f"option {name} must be true or false, got {_shown(value)}")


def as_float(
    value: object,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    error: type[InvalidArgument] = InvalidURL,
) -> float:
    """A finite number option (a number, or its text), within ``minimum``..``maximum`` if given."""
    number: float | None = None
    if is_number(value):
        number = float(value)  # type: ignore[arg-type]
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None or not math.isfinite(number):
        raise error(f"option {name} must be a finite number, got {_shown(value)}")
    _check_range(number, name, minimum, maximum, value, error)
    return number


def as_int(
    value: object,
    name: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    error: type[InvalidArgument] = InvalidURL,
) -> int:
    """A whole number option (an int, a whole float, or the text of an int), within bounds."""
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:  # also the text of a number too long to convert
            number = None
    if number is None:
        raise error(f"option {name} must be a whole number, got {_shown(value)}")
    _check_range(number, name, minimum, maximum, value, error)
    return number


def as_text(
    value: object,
    name: str,
    *,
    empty: bool = False,
    error: type[InvalidArgument] = InvalidURL,
) -> str:
    """A text option: a ``str`` that encodes as UTF-8 (no lone surrogates), no NUL character."""
    if not isinstance(value, str):
        raise error(f"option {name} must be text (str), got {type(value).__name__}")
    if not value and not empty:
        raise error(f"option {name} must not be empty")
    check_text(value, f"option {name}", error=error)
    if "\x00" in value:
        raise error(f"option {name} must not contain a NUL character")
    return value


def as_choice(
    value: object,
    name: str,
    choices: Iterable[str],
    *,
    error: type[InvalidArgument] = InvalidURL,
) -> str:
    """One of ``choices`` (upper case), matched without regard to case."""
    allowed = tuple(choices)
    if isinstance(value, str) and value.strip().upper() in allowed:
        return value.strip().upper()
    raise error(f"option {name} must be one of {', '.join(allowed)}, got {_shown(value)}")


def as_object(
    value: object,
    name: str,
    *,
    kind: type | tuple[type, ...] | None = None,
    methods: Iterable[str] = (),
    what: str,
    error: type[InvalidArgument] = InvalidURL,
) -> Any:
    """An object option (keyword only): an instance of ``kind``, or one with ``methods``.

    A class where an instance is wanted, or text (from a URL), is refused too.
    """
    needed = tuple(methods)
    ok = not isinstance(value, type | str | bytes)
    if ok and kind is not None:
        ok = isinstance(value, kind)
    if ok and needed:
        ok = all(callable(getattr(value, method, None)) for method in needed)
    if not ok:
        source = " (objects cannot come from a URL)" if isinstance(value, str) else ""
        raise error(f"option {name} must be {what}, got {_shown(value)}{source}")
    return value


def as_items(value: object, what: str) -> list[Any]:
    """The items of a list-like argument: any iterable but text, bytes or a mapping."""
    if type(value) is list:  # the common case, without the isinstance checks
        return list(value)
    if isinstance(value, str | bytes | bytearray | memoryview | Mapping) or not isinstance(
        value, Iterable
    ):
        raise InvalidArgument(
            f"{what} must be a list (or another iterable), got {type(value).__name__}"
        )
    return list(value)


def check_number(
    value: object,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
) -> float:
    """A finite ``int``/``float`` argument (not text, not a bool) within the bounds given.

    ``minimum``/``maximum`` are inclusive, ``above``/``below`` exclusive.
    """
    if not is_number(value) or not math.isfinite(value):  # type: ignore[arg-type]
        raise InvalidArgument(f"{name} must be a finite number, got {_shown(value)}")
    number = float(value)  # type: ignore[arg-type]
    if (
        (minimum is not None and number < minimum)
        or (maximum is not None and number > maximum)
        or (above is not None and number <= above)
        or (below is not None and number >= below)
    ):
        bounds = [
            f"{sign} {bound:g}"
            for sign, bound in ((">=", minimum), ("<=", maximum), (">", above), ("<", below))
            if bound is not None
        ]
        raise InvalidArgument(f"{name} must be {' and '.join(bounds)}, got {_shown(value)}")
    return number


def check_int(value: object, name: str, *, minimum: int | None = None) -> int:
    """An ``int`` argument (not a bool, not a float), at least ``minimum`` if given."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{name} must be an int, got {_shown(value)}")
    if minimum is not None and value < minimum:
        raise InvalidArgument(f"{name} must be >= {minimum}, got {_shown(value)}")
    return value


def check_bool(value: object, name: str) -> bool:
    """A ``bool`` argument (``True``/``False``, nothing merely truthy)."""
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be True or False, got {_shown(value)}")
    return value


def check_callable(value: object, name: str) -> Any:
    """A callable argument."""
    if not callable(value):
        raise InvalidArgument(f"{name} must be callable, got {_shown(value)}")
    return value


def check_text(value: str, what: str, *, error: type[InvalidArgument] = InvalidArgument) -> str:
    """``value`` if it encodes as UTF-8; lone surrogates (such as U+D800) are refused.

    Every backend stores text as UTF-8, so text that cannot be encoded is
    refused the same way everywhere, before anything is sent.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(
            f"{what} must be valid Unicode text (encodable as UTF-8); it has "
            f"{value[exc.start : exc.end]!r} at position {exc.start}"
        ) from None
    return value


def _check_range(
    number: float,
    name: str,
    minimum: float | None,
    maximum: float | None,
    value: object,
    error: type[InvalidArgument],
) -> None:
    if minimum is not None and number < minimum:
        raise error(f"option {name} must be >= {minimum:g}, got {_shown(value)}")
    if maximum is not None and number > maximum:
        raise error(f"option {name} must be <= {maximum:g}, got {_shown(value)}")
