"""The message a lease carries, and the states a lease goes through."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["NO_PROPERTIES", "LeaseState", "Message", "received_message"]


class _NoProperties(dict[str, str]):
    """An empty ``dict`` that cannot change: the properties of a message that has none.

    One shared object instead of an empty dict per received message; a ``dict``,
    so ``json.dumps`` and ``dict()`` take it.
    """

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a received message's properties cannot be changed")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _refuse  # type: ignore[assignment]
    __ior__ = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[type[dict[str, str]], tuple[()]]:
        return (dict, ())  # a copy elsewhere is an ordinary (empty) dict


#: The properties of a received message that has none (shared, read-only).
NO_PROPERTIES: Mapping[str, str] = _NoProperties()


@dataclass(frozen=True, slots=True)
class Message:
    """A received message.

    ``id`` is stable across redeliveries (use it for idempotency);
    ``delivery_count`` is 1 on first delivery and grows by one each time the
    message is leased again. ``checkpoint`` is the progress the last earlier
    holder saved with :meth:`leasekit.Lease.checkpoint` (``None`` if none did);
    checkpoints never change ``body`` or ``properties``.
    ``group`` is the ordered group it was sent in
    (``Queue.send(..., group=...)``), ``None`` on an unordered message or queue.
    """

    id: str
    body: bytes = field(repr=False)
    delivery_count: int
    enqueued_at: datetime
    properties: Mapping[str, str] = field(default_factory=dict)
    checkpoint: bytes | None = field(default=None, repr=False)
    group: str | None = None


_new = object.__new__
_SET = tuple(
    Message.__dict__[name].__set__
    for name in ("id", "body", "delivery_count", "enqueued_at", "properties", "checkpoint", "group")
)


def received_message(
    id: str,
    body: bytes,
    delivery_count: int,
    enqueued_at: datetime,
    properties: Mapping[str, str],
    checkpoint: bytes | None,
    group: str | None,
) -> Message:
    """A :class:`Message` as ``Message(...)`` makes it, at half the cost (one per message received).

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``;
    this sets the slots directly. Every field is given: no defaults, no checks.
    """
    message = _new(Message)
    set_id, set_body, set_count, set_enqueued, set_properties, set_checkpoint, set_group = _SET
    set_id(message, id)
    set_body(message, body)
    set_count(message, delivery_count)
    set_enqueued(message, enqueued_at)
    set_properties(message, properties)
    set_checkpoint(message, checkpoint)
    set_group(message, group)
    return message


class LeaseState(enum.Enum):
    """Where a lease is in its life. Only ``HELD`` allows renew and settlement."""

    HELD = "held"
    COMPLETED = "completed"
    ABANDONED = "abandoned"
    DEAD_LETTERED = "dead_lettered"
    LOST = "lost"

    @property
    def settled(self) -> bool:
        """True once the lease can no longer be used."""
        return self is not LeaseState.HELD
