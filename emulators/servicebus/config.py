"""Configuration of the Service Bus emulator: queue properties and the config file.

The file follows the shape of Microsoft's Service Bus emulator ``Config.json``::

    {
      "UserConfig": {
        "Namespaces": [
          {"Name": "sbemulatorns",
           "Queues": [{"Name": "orders",
                       "Properties": {"LockDuration": "PT1M", "MaxDeliveryCount": 10,
                                      "DefaultMessageTimeToLive": "PT1H",
                                      "DeadLetteringOnMessageExpiration": false}}],
           "Topics": []}
        ]
      },
      "Emulator": {"AutoCreateQueues": true,
                   "DefaultQueueProperties": {"LockDuration": "PT60S"}}
    }

A bare ``{"Queues": [...]}`` is accepted too. ``Emulator`` is this emulator's own
section (Microsoft's file has no such key): ``AutoCreateQueues`` is ``true``
(create any queue on first use), ``false``, or a regular expression a queue name
must fully match to be created on first use; ``DefaultQueueProperties`` are the
properties of queues created that way.

Durations are ISO 8601 (``PT1M``, ``PT2S``, ``PT0.5S``, ``P1DT2H``) or plain
numbers of seconds. Unlike real Service Bus (LockDuration 5 s to 5 min), the
emulator accepts any positive LockDuration up to 5 min, so tests of lock expiry
can use ``PT1S``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_LOCK_DURATION",
    "DEFAULT_MAX_DELIVERY_COUNT",
    "MAX_LOCK_DURATION",
    "EmulatorConfig",
    "QueueProperties",
    "load_config",
    "parse_config",
    "parse_duration",
]

DEFAULT_LOCK_DURATION = 60.0
DEFAULT_MAX_DELIVERY_COUNT = 10
MAX_LOCK_DURATION = 300.0

_DURATION = re.compile(
    r"^P(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$",
    re.IGNORECASE,
)


def parse_duration(value: str | float | int) -> float:
    """Parse an ISO 8601 duration (days to seconds) or a number of seconds.

    Parameters:
        value: ``"PT1M"``, ``"P10675199DT2H48M5.4775807S"``, ``"PT0.5S"``, ``30``.

    Returns:
        The duration in seconds.

    Raises:
        ValueError: the text is not a duration this parser understands.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        return float(value)
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    match = _DURATION.match(text)
    if not match or text.upper() in ("P", "PT"):
        raise ValueError(f"not an ISO 8601 duration: {value!r}")
    parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
    return (
        parts.get("days", 0.0) * 86400
        + parts.get("hours", 0.0) * 3600
        + parts.get("minutes", 0.0) * 60
        + parts.get("seconds", 0.0)
    )


@dataclass(frozen=True)
class QueueProperties:
    """The properties of one queue that the emulator honours.

    Parameters:
        lock_duration: seconds a PeekLock receive locks a message (renew extends by it).
        max_delivery_count: failed deliveries (abandon or lock expiry) after which a
            message is dead-lettered with reason ``MaxDeliveryCountExceeded``.
        default_ttl: seconds a message lives when it sets no shorter time-to-live;
            ``None`` means for ever.
        dead_lettering_on_message_expiration: move expired messages to the
            dead-letter queue instead of dropping them.
        requires_session: sessions are not emulated; such a queue refuses receivers.
    """

    lock_duration: float = DEFAULT_LOCK_DURATION
    max_delivery_count: int = DEFAULT_MAX_DELIVERY_COUNT
    default_ttl: float | None = None
    dead_lettering_on_message_expiration: bool = False
    requires_session: bool = False

    def __post_init__(self) -> None:
        """Validate the values.

        Raises:
            ValueError: a value is out of the range the emulator supports.
        """
        if not 0 < self.lock_duration <= MAX_LOCK_DURATION:
            raise ValueError(f"LockDuration must be in (0, 5 min], got {self.lock_duration} s")
        if self.max_delivery_count < 1:
            raise ValueError(f"MaxDeliveryCount must be >= 1, got {self.max_delivery_count}")
        if self.default_ttl is not None and self.default_ttl <= 0:
            raise ValueError(f"DefaultMessageTimeToLive must be positive, got {self.default_ttl}")

    def updated(self, properties: dict[str, Any]) -> QueueProperties:
        """Return a copy with the Config.json-style ``properties`` applied.

        Parameters:
            properties: keys as in Microsoft's Config.json (``LockDuration``,
                ``MaxDeliveryCount``, ``DefaultMessageTimeToLive``,
                ``DeadLetteringOnMessageExpiration``, ``RequiresSession``);
                unknown keys are ignored.

        Returns:
            The new properties.

        Raises:
            ValueError: a value is malformed or out of range.
        """
        changes: dict[str, Any] = {}
        for key, value in properties.items():
            name = key.lower()
            if name == "lockduration":
                changes["lock_duration"] = parse_duration(value)
            elif name == "maxdeliverycount":
                changes["max_delivery_count"] = int(value)
            elif name == "defaultmessagetimetolive":
                ttl = parse_duration(value) if value not in (None, "") else None
                # Service Bus' "infinite" default (TimeSpan.MaxValue) means no expiry.
                changes["default_ttl"] = None if ttl is None or ttl >= 10**9 else ttl
            elif name == "deadletteringonmessageexpiration":
                changes["dead_lettering_on_message_expiration"] = _as_bool(value)
            elif name == "requiressession":
                changes["requires_session"] = _as_bool(value)
        return replace(self, **changes)


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


@dataclass
class EmulatorConfig:
    """What the emulator serves.

    Parameters:
        queues: queues that exist from the start, by name.
        auto_create: ``True`` (any name), ``False``, or a compiled pattern a queue
            name must fully match to be created on first use.
        default_properties: properties of queues created on first use.
    """

    queues: dict[str, QueueProperties] = field(default_factory=dict)
    auto_create: bool | re.Pattern[str] = True
    default_properties: QueueProperties = field(default_factory=QueueProperties)

    def may_auto_create(self, name: str) -> bool:
        """Whether a queue called ``name`` is created when first used.

        Parameters:
            name: the queue name.

        Returns:
            ``True`` when first use creates it.
        """
        if isinstance(self.auto_create, bool):
            return self.auto_create
        return self.auto_create.fullmatch(name) is not None


def parse_config(document: dict[str, Any]) -> EmulatorConfig:
    """Build an :class:`EmulatorConfig` from a parsed JSON document.

    Parameters:
        document: the JSON object (see the module docstring for its shape).

    Returns:
        The configuration.

    Raises:
        ValueError: the document is malformed.
    """
    if not isinstance(document, dict):
        raise ValueError("the config must be a JSON object")
    emulator = document.get("Emulator") or {}
    config = EmulatorConfig()
    auto = emulator.get("AutoCreateQueues", True)
    if isinstance(auto, str):
        config.auto_create = re.compile(auto)
    else:
        config.auto_create = bool(auto)
    config.default_properties = QueueProperties().updated(
        emulator.get("DefaultQueueProperties") or {}
    )
    queue_lists: list[Any] = []
    if "Queues" in document:
        queue_lists.append(document["Queues"])
    for namespace in (document.get("UserConfig") or {}).get("Namespaces") or []:
        queue_lists.append(namespace.get("Queues") or [])
    for queues in queue_lists:
        for queue in queues:
            name = queue.get("Name")
            if not name or not isinstance(name, str):
                raise ValueError(f"queue without a Name: {queue!r}")
            config.queues[name] = config.default_properties.updated(queue.get("Properties") or {})
    return config


def load_config(path: str | Path | None) -> EmulatorConfig:
    """Read the config file at ``path``; no path gives the defaults.

    Parameters:
        path: a JSON file, or ``None``.

    Returns:
        The configuration.

    Raises:
        ValueError: the file is not valid JSON or has a malformed entry.
        OSError: the file cannot be read.
    """
    if path is None:
        return EmulatorConfig()
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    return parse_config(document)
