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
section (Microsoft's file has no such key): ``AutoCreateQueues`` is ``false`` (the
default: a name nobody created is a missing entity, as on Service Bus), ``true``
(create any queue on first use, each one logged as a warning), or a regular
expression a queue name must fully match to be created on first use;
``DefaultQueueProperties`` are the properties of queues created that way.

Nothing in the file is ignored silently: an unknown key, a property the emulator
does not honour set to a value that matters (``RequiresDuplicateDetection: true``,
``ForwardTo``...) and declared topics are listed in :attr:`EmulatorConfig.warnings`,
which the command line logs at startup. A queue that sets such a property refuses
every link with ``amqp:not-implemented`` naming it, and a declared topic refuses
links the same way, rather than behaving like a plain queue.

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
        requires_session: the queue keeps message sessions (:mod:`.sessions`); it
            takes only session receivers and messages with a session id.
        unsupported: Config.json property names set to values the emulator cannot
            honour (``RequiresDuplicateDetection``, ``ForwardTo``...); such a queue
            refuses every link, naming them.
    """

    lock_duration: float = DEFAULT_LOCK_DURATION
    max_delivery_count: int = DEFAULT_MAX_DELIVERY_COUNT
    default_ttl: float | None = None
    dead_lettering_on_message_expiration: bool = False
    requires_session: bool = False
    unsupported: tuple[str, ...] = ()

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

    def updated(
        self, properties: dict[str, Any], warnings: list[str] | None = None
    ) -> QueueProperties:
        """Return a copy with the Config.json-style ``properties`` applied.

        Parameters:
            properties: keys as in Microsoft's Config.json (``LockDuration``,
                ``MaxDeliveryCount``, ``DefaultMessageTimeToLive``,
                ``DeadLetteringOnMessageExpiration``, ``RequiresSession``, and the
                unsupported ``RequiresDuplicateDetection``,
                ``DuplicateDetectionHistoryTimeWindow``, ``ForwardTo``,
                ``ForwardDeadLetteredMessagesTo``).
            warnings: where a sentence is added for each unknown key and each
                unsupported property set to a value that matters.

        Returns:
            The new properties.

        Raises:
            ValueError: a value is malformed or out of range.
        """
        notes = warnings if warnings is not None else []
        unsupported = list(self.unsupported)
        changes: dict[str, Any] = {}
        for key, value in properties.items():
            name = key.lower()
            if name in _UNSUPPORTED:
                if _matters(name, value):
                    unsupported.append(key)
                    notes.append(
                        f"{key}={value!r} is not supported by this emulator ({_UNSUPPORTED[name]})"
                    )
                continue
            if name not in _KNOWN:
                notes.append(f"unknown queue property {key!r} ignored")
                continue
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
        changes["unsupported"] = tuple(dict.fromkeys(unsupported))
        return replace(self, **changes)


_KNOWN = frozenset(
    {
        "lockduration",
        "maxdeliverycount",
        "defaultmessagetimetolive",
        "deadletteringonmessageexpiration",
        "requiressession",
    }
)
#: Config.json properties the emulator does not implement, and what each would need.
_UNSUPPORTED = {
    "requiresduplicatedetection": "duplicate detection is not emulated",
    "duplicatedetectionhistorytimewindow": "duplicate detection is not emulated",
    "forwardto": "auto-forwarding is not emulated",
    "forwarddeadletteredmessagesto": "auto-forwarding is not emulated",
}


def _matters(name: str, value: Any) -> bool:
    """Whether an unsupported property's value changes behaviour.

    Microsoft's sample Config.json sets ``RequiresDuplicateDetection: false`` and a
    history window on every queue; those change nothing.
    """
    if name == "requiresduplicatedetection":
        return _as_bool(value)
    if name == "duplicatedetectionhistorytimewindow":
        return False  # only matters with RequiresDuplicateDetection, reported there
    return value not in (None, "")


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


@dataclass
class EmulatorConfig:
    """What the emulator serves.

    Parameters:
        queues: queues that exist from the start, by name.
        auto_create: ``True`` (any name), ``False`` (the default), or a compiled
            pattern a queue name must fully match to be created on first use.
        default_properties: properties of queues created on first use.
        topics: declared topic names, casefolded: links to them are refused (topics
            are not emulated), not taken for missing or auto-created queues.
        warnings: what the file asked for that the emulator ignores or refuses, one
            sentence each (logged at startup).
        namespace: the namespace name (the first ``Namespaces`` entry's ``Name``).
    """

    queues: dict[str, QueueProperties] = field(default_factory=dict)
    auto_create: bool | re.Pattern[str] = False
    default_properties: QueueProperties = field(default_factory=QueueProperties)
    topics: frozenset[str] = frozenset()
    warnings: list[str] = field(default_factory=list)
    namespace: str = "sbemulatorns"

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
    for key in emulator:
        if key not in ("AutoCreateQueues", "DefaultQueueProperties"):
            config.warnings.append(f"unknown Emulator setting {key!r} ignored")
    auto = emulator.get("AutoCreateQueues", False)
    if isinstance(auto, str):
        config.auto_create = re.compile(auto)
    else:
        config.auto_create = bool(auto)
    config.default_properties = QueueProperties().updated(
        emulator.get("DefaultQueueProperties") or {}, config.warnings
    )
    queue_lists: list[Any] = []
    topics: list[str] = []
    if "Queues" in document:
        queue_lists.append(document["Queues"])
    for index, namespace in enumerate((document.get("UserConfig") or {}).get("Namespaces") or []):
        if index == 0 and namespace.get("Name"):
            config.namespace = str(namespace["Name"])
        queue_lists.append(namespace.get("Queues") or [])
        for topic in namespace.get("Topics") or []:
            name = topic.get("Name") if isinstance(topic, dict) else None
            if name:
                topics.append(str(name))
    for queues in queue_lists:
        for queue in queues:
            name = queue.get("Name")
            if not name or not isinstance(name, str):
                raise ValueError(f"queue without a Name: {queue!r}")
            notes: list[str] = []
            config.queues[name] = config.default_properties.updated(
                queue.get("Properties") or {}, notes
            )
            config.warnings.extend(
                f"queue {name!r}: {note}"
                + ("; the queue refuses links" if "not supported" in note else "")
                for note in notes
            )
    if topics:
        config.topics = frozenset(t.casefold() for t in topics)
        config.warnings.append(
            f"topics are not emulated; links to {', '.join(sorted(topics))} are refused"
        )
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
