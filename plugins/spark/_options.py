"""Reading the ``.option(...)`` strings every leasekit data source shares (no pyspark here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import leasekit
from leasekit.errors import InvalidArgument
from leasekit.options import as_bool, as_float, as_int

__all__ = ["BACKEND_PREFIX", "QueueOptions", "bool_option", "float_option", "int_option"]

#: Options under this prefix go to :func:`leasekit.open` as keyword options
#: (``.option("backend.access_key_id", ...)`` → ``access_key_id=...``); the
#: prefix keeps them apart from the source's own options and Spark's.
BACKEND_PREFIX = "backend."


class QueueOptions:
    """Where the queue is: the ``url`` option plus ``backend.*`` keyword options.

    Picklable and small: it travels to executors (the sink and the consumer
    tasks open the queue there; the source's reader never does).
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        url = options.get("url")
        if not url:
            raise InvalidArgument(
                "the leasekit data source needs .option('url', ...), "
                "e.g. 'sqlite:///jobs.db?queue=jobs'"
            )
        self.url: str = str(url)
        self.backend: dict[str, str] = {
            key[len(BACKEND_PREFIX) :]: str(value)
            for key, value in options.items()
            if key.lower().startswith(BACKEND_PREFIX)
        }
        self.create: bool = as_bool(options.get("create", "false"), "create")

    def open(self, *, lease_duration: float | None = None) -> leasekit.Queue:
        """Open the queue (created first with the ``create`` option)."""
        backend: dict[str, Any] = dict(self.backend)
        return leasekit.open(self.url, create=self.create, lease_duration=lease_duration, **backend)

    def __repr__(self) -> str:
        # Backend options may hold secrets: show their names only.
        return f"QueueOptions(url={self.url!r}, backend={sorted(self.backend)})"


def _get(options: Mapping[str, str], name: str) -> Any:
    # Spark lower-cases option names; accept both spellings from plain dicts too.
    if name in options:
        return options[name]
    return options.get(name.lower())


def float_option(
    options: Mapping[str, str], name: str, default: float | None, *, minimum: float = 0
) -> float | None:
    """A number option (``None`` when absent and the default is ``None``)."""
    value = _get(options, name)
    if value is None or value == "":
        return default
    try:
        return as_float(value, name, minimum=minimum)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def int_option(options: Mapping[str, str], name: str, default: int, *, minimum: int = 1) -> int:
    """A whole-number option."""
    value = _get(options, name)
    if value is None or value == "":
        return default
    try:
        return as_int(value, name, minimum=minimum)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    """A true/false option."""
    value = _get(options, name)
    if value is None or value == "":
        return default
    try:
        return as_bool(value, name)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
