"""The backend SPI: what a vendor implements to add a backend.

A driver is a thin translation layer, like an httpx transport: it turns a few
batch-shaped calls into its SDK's calls and says which leasekit error each SDK
error means. Everything else (validation, receipt tracking, retries, the
long-poll loop, the keeper, dead-lettering without a native store and the
poison-copy format, idempotency) is core's and written once. Users never call
a driver; they call :class:`leasekit.Queue`.

**One data path.** Every data operation takes a list and returns one result per
entry, in order: a value, or the raw error for that entry (Go CDK's shape). One
stale receipt never fails its neighbours. A service with no batch call covers a
list in one line with :func:`each`. Core calls a data method with at most the
capabilities' batch size for it, and a batch of one behaves as a single call.

Contract for every method:

- A driver **should not retry**. On a transient failure it raises (or returns
  for that entry) the SDK's own error; core asks :meth:`Driver.is_retryable` and
  retries with backoff, within the call's deadline.
- A driver **must raise the SDK's error unchanged** (or a :class:`DriverError`
  when it has no SDK error to raise); core maps it with :meth:`Driver.error_code`
  and raises the leasekit error once, with the original chained. A failure of the
  whole call (the queue is missing, the service is out of reach) is raised; a
  failure of one entry is that entry's result.
- **Every entry is tried**: a refused entry does not stop the ones after it.
- Core has already validated every argument against :attr:`Driver.capabilities`
  (durations in range and rounded to the resolution, batch sizes within the
  limits, bodies of ``bytes`` within the size limit) and against
  :meth:`Driver.validate` (what only the driver can check).
- Core may call a driver from several threads at once; a driver must be
  thread-safe or serialise internally.
- Nothing passed in (lists of receipts, bodies) may be kept after the call.
- :meth:`Driver.receive` should block for no more than ``wait`` seconds (which
  core keeps at or below ``capabilities.max_wait``), then return what it has,
  possibly nothing. Core loops for longer waits.
- Every call runs under core's deadline (:mod:`leasekit.deadline`): a renewal's
  is the time left on the lease it renews. A driver **must not block past it**:
  it reads :func:`leasekit.deadline.call_timeout` in the calling thread and gives
  the SDK that per-call timeout (or makes no further attempt once it passed).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, NamedTuple, TypeVar, overload

from .capabilities import Capabilities

__all__ = [
    "CheckpointEntry",
    "DeadLetter",
    "Driver",
    "DriverError",
    "ErrorCode",
    "OutgoingMessage",
    "ParsedURL",
    "QueueStats",
    "RawMessage",
    "ReceivedRows",
    "Visibility",
    "each",
    "received",
]


class ErrorCode(enum.Enum):
    """What an SDK error means, as a driver classifies it; core picks the leasekit class."""

    #: The receipt is stale, expired, or its message is gone (completed, expired TTL).
    LEASE_LOST = "lease_lost"
    #: The queue does not exist.
    QUEUE_NOT_FOUND = "queue_not_found"
    #: The queue already exists (on create).
    QUEUE_EXISTS = "queue_exists"
    #: The body is too large.
    TOO_LARGE = "too_large"
    #: An argument was refused by the service.
    INVALID_ARGUMENT = "invalid_argument"
    #: Transient: network, throttling, 5xx.
    UNAVAILABLE = "unavailable"
    #: Credentials refused or access denied.
    UNAUTHENTICATED = "unauthenticated"
    #: The service cannot do this.
    UNSUPPORTED = "unsupported"
    #: Anything else.
    UNKNOWN = "unknown"


class DriverError(Exception):
    """An error a driver raises when it has no SDK error of its own to raise.

    Parameters
    ----------
        code: what it means.
        message: for a person.
        backend_code: the backend's own code, if any.
    """

    def __init__(self, code: ErrorCode, message: str, *, backend_code: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.backend_code = backend_code


@dataclass(frozen=True)
class ParsedURL:
    """A queue URL split into parts; given to :meth:`Driver.options_from_url`.

    ``path`` keeps its leading slash. ``query`` holds each query parameter once
    (a repeated parameter is refused by the parser).
    """

    scheme: str
    host: str
    port: int | None
    path: str
    query: Mapping[str, str]
    username: str | None = None
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class OutgoingMessage:
    """One message to send (core has validated it).

    ``group`` is the ordered group it belongs to (only where
    ``capabilities.ordered``; ``None``: unordered); ``dedup_key`` the caller's
    deduplication id (only where ``capabilities.deduplicates``; ``None``: the
    driver's own rule, e.g. SQS FIFO's content-based or a fresh id per message).
    """

    body: bytes
    delay: float = 0.0
    ttl: float | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    group: str | None = None
    dedup_key: str | None = None


@dataclass(frozen=True, slots=True)
class RawMessage:
    """One received message as a driver returns it.

    ``delivery_count`` is 1 on first delivery. ``visible_until`` is when the
    lease ends (UTC, timezone-aware). ``raw`` is the SDK's own message object
    (the escape hatch, reachable as ``lease.raw``). ``checkpoint`` is the last
    checkpoint saved with the message, where ``capabilities.native_checkpoint``.
    """

    id: str
    body: bytes
    receipt: str
    delivery_count: int
    enqueued_at: datetime
    visible_until: datetime
    properties: Mapping[str, str] = field(default_factory=dict)
    raw: Any = field(default=None, repr=False, compare=False)
    checkpoint: bytes | None = field(default=None, repr=False)
    #: The ordered group the message was sent in (``None``: unordered).
    group: str | None = None


_new = object.__new__
_RAW_SET = tuple(
    RawMessage.__dict__[name].__set__
    for name in (
        "id",
        "body",
        "receipt",
        "delivery_count",
        "enqueued_at",
        "visible_until",
        "properties",
        "raw",
        "checkpoint",
        "group",
    )
)


def received(
    id: str,
    body: bytes,
    receipt: str,
    delivery_count: int,
    enqueued_at: datetime,
    visible_until: datetime,
    properties: Mapping[str, str],
    raw: Any = None,
    checkpoint: bytes | None = None,
    group: str | None = None,
) -> RawMessage:
    """A :class:`RawMessage` as ``RawMessage(...)`` makes it, at less than half the cost.

    For a driver's receive, which makes one per message: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__``; this sets the
    slots directly. No defaults are filled in but these: give ``properties``
    (an empty ``dict`` when there are none).
    """
    message = _new(RawMessage)
    (
        set_id,
        set_body,
        set_receipt,
        set_count,
        set_enqueued,
        set_until,
        set_properties,
        set_raw,
        set_checkpoint,
        set_group,
    ) = _RAW_SET
    set_id(message, id)
    set_body(message, body)
    set_receipt(message, receipt)
    set_count(message, delivery_count)
    set_enqueued(message, enqueued_at)
    set_until(message, visible_until)
    set_properties(message, properties)
    set_raw(message, raw)
    set_checkpoint(message, checkpoint)
    set_group(message, group)
    return message


class ReceivedRows(Sequence[RawMessage]):
    """A receive's messages as the rows a database gave, one tuple each: no object per message.

    For a driver whose receive yields plain rows (PostgreSQL): core makes each
    lease straight from its row, without a :class:`RawMessage` in between (one
    object fewer per message; measured, a third of the client's work per
    received message). Read as a sequence it is one of :class:`RawMessage`,
    made on first access, so whoever else calls the driver sees no difference.

    Each row is ``(id, body, properties, enqueued_at, delivery_count, receipt,
    visible_until, group)``, as :class:`RawMessage` defines them, except that
    ``properties`` is the driver's own form, which ``decode`` turns into a
    ``dict`` (called only when the row has some). ``raw`` and ``checkpoint``
    are ``None``: a driver with either returns :class:`RawMessage` objects.
    """

    __slots__ = ("_messages", "decode", "rows")

    def __init__(
        self, rows: list[tuple[Any, ...]], decode: Callable[[Any], dict[str, str]]
    ) -> None:
        self.rows = rows
        self.decode = decode
        self._messages: list[RawMessage] | None = None

    def messages(self) -> list[RawMessage]:
        """The rows as :class:`RawMessage` objects (made once)."""
        if self._messages is None:
            decode = self.decode
            self._messages = [
                received(
                    id_,
                    body,
                    receipt,
                    count,
                    enqueued_at,
                    until,
                    decode(props) if props else {},
                    None,
                    None,
                    group,
                )
                for id_, body, props, enqueued_at, count, receipt, until, group in self.rows
            ]
        return self._messages

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[RawMessage]:
        return iter(self.messages())

    @overload
    def __getitem__(self, index: int) -> RawMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[RawMessage]: ...

    def __getitem__(self, index: int | slice) -> RawMessage | list[RawMessage]:
        return self.messages()[index]

    def __eq__(self, other: object) -> bool:
        """Equal to a list (or another ``ReceivedRows``) of the same messages, as a list is."""
        if isinstance(other, ReceivedRows):
            other = other.messages()
        if not isinstance(other, list):
            return NotImplemented
        return self.messages() == other

    def __repr__(self) -> str:
        return f"ReceivedRows({self.messages()!r})"


class CheckpointEntry(NamedTuple):
    """One checkpoint for :meth:`Driver.checkpoint`: the receipt, the message as received, the data.

    ``message`` is the :class:`RawMessage` the receive returned; its ``body`` and
    ``properties`` are what a driver that rewrites the message keeps unchanged.
    """

    receipt: str
    message: RawMessage
    data: bytes


class Visibility(NamedTuple):
    """The result of a visibility change: the receipt to use from now on and the new expiry.

    A named tuple (not a dataclass): the keeper makes tens of thousands a second.
    """

    receipt: str
    visible_until: datetime


@dataclass(frozen=True)
class QueueStats:
    """Message counts, approximate on cloud services; ``None`` where the backend cannot tell.

    Which counts a backend gives is ``capabilities.counted`` (a driver's own
    ``stats()`` fills ``capabilities.counts``; core adds the rest).
    """

    #: Messages a receive can take now.
    visible: int | None = None
    #: Messages received and not yet settled whose lease has not ended (in flight).
    leased: int | None = None
    #: Messages sent with a delay (or abandoned with one, where the backend tells
    #: that apart from a lease) that are not visible yet.
    delayed: int | None = None
    #: Messages in the dead-letter place: the native store, or ``<queue>-poison``.
    dead_lettered: int | None = None
    #: Every message in the queue, whatever its state (visible + leased + delayed;
    #: dead letters not included): what a service that cannot tell the states
    #: apart still knows.
    total: int | None = None
    #: Seconds since the oldest message still in the queue (any state, dead letters
    #: not included) was sent; ``None`` when the queue is empty or the backend cannot
    #: tell (``capabilities.reports_oldest_age``). How far a backlog reaches back.
    #: A reading of time, not a count: two stats with the same counts compare equal.
    oldest_age: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class DeadLetter:
    """A dead-lettered message read back for inspection."""

    id: str
    body: bytes
    reason: str | None
    delivery_count: int | None
    properties: Mapping[str, str] = field(default_factory=dict)
    #: When it reached the dead-letter place, where the backend tells (a copy's
    #: enqueue time); ``None`` where it cannot.
    enqueued_at: datetime | None = None
    #: The ordered group it was sent in, where the store keeps it (``None``: unordered).
    group: str | None = None


T = TypeVar("T")


def each(items: Iterable[Any], call: Callable[[Any], T]) -> list[T | BaseException]:
    """One result per item for a service with no batch call: what ``call(item)`` returned or raised.

    For example ``return each(receipts, self._delete_one)`` in :meth:`Driver.delete`.
    Every item is tried; an error is that item's result.
    """
    results: list[T | BaseException] = []
    for item in items:
        try:
            results.append(call(item))
        except Exception as exc:
            results.append(exc)
    return results


class Driver(ABC):
    """The interface one backend implements for one queue.

    A driver is constructed by core as ``DriverClass(**options)`` where the
    options come from the keyword form of :func:`leasekit.open` or from
    :meth:`options_from_url`. Constructing one must do no network I/O.

    Subclasses set :attr:`capabilities` (class or instance attribute).
    """

    #: The scheme the backend registers (for messages).
    scheme: ClassVar[str] = ""
    #: What this backend guarantees; core validates against it.
    capabilities: Capabilities

    #: The queue name this driver serves.
    queue: str

    #: Whether the driver learns, without a call, that leases are lost (Service Bus:
    #: the connection they were received on is gone) and reports them through
    #: :attr:`leases_lost`. Core then keeps each received lease findable by receipt.
    reports_lost_leases: ClassVar[bool] = False
    #: Set by core (:mod:`leasekit.lost_leases`) once a lease of a driver that
    #: ``reports_lost_leases`` is received: call it as ``leases_lost(receipts, error)``
    #: when the leases of ``receipts`` are lost, from any thread; it makes no call
    #: and never raises. Core marks those leases lost at once (a driver writes no
    #: lease state). ``None`` while there is nothing to report to.
    leases_lost: Callable[[Sequence[str], BaseException], None] | None = None

    #: Option names that are credentials: core refuses them in a URL's query
    #: (as it refuses ``user:password@``); they may only be keyword options.
    secret_options: ClassVar[frozenset[str]] = frozenset()
    #: How to pass credentials instead, for that refusal's message.
    credential_hint: ClassVar[str] = "pass them as keyword options"

    # ------------------------------------------------------------------ URLs

    @classmethod
    def options_from_url(cls, url: ParsedURL) -> dict[str, Any]:
        """Turn a parsed URL into constructor options.

        The default takes the queue name from the path (``scheme://host/queue``)
        or the host (``scheme://queue``) and passes query parameters through as
        strings. Core refuses options the constructor does not accept.
        """
        options: dict[str, Any] = dict(url.query)
        name = url.path.strip("/") or url.host
        if name:
            options.setdefault("queue", name)
        return options

    # ------------------------------------------------------------------ data

    def validate(self, message: OutgoingMessage) -> None:  # noqa: B027 - optional
        """Refuse, by raising a :class:`DriverError`, a message the service would refuse.

        Core calls it for every message before sending any, after its own checks
        against the capabilities; for what only the driver can tell (SQS: body
        and properties together over the queue's limit; MNS: an empty property
        value). Must make no network call. The default accepts everything.
        """

    @abstractmethod
    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Send messages; one result per message, in order: its id, or the error it got.

        Must not return an id before the backend accepted that message. Core
        calls it with at most ``capabilities.max_send_batch`` messages (and at most
        ``max_send_batch_bytes`` of bodies and properties).
        """
        raise NotImplementedError("The 'send' method must be implemented.")  # pragma: no cover

    @abstractmethod
    def receive(self, max_messages: int, visibility: float, wait: float) -> Sequence[RawMessage]:
        """Receive up to ``max_messages`` messages and hide each for ``visibility`` seconds.

        Should block no more than ``wait`` seconds; may return fewer messages
        than asked, or none. Each message must get a receipt that is valid for
        this delivery only where ``capabilities.detects_stale_receipts``.
        A list of :class:`RawMessage`, or a :class:`ReceivedRows` of plain rows.
        """
        raise NotImplementedError("The 'receive' method must be implemented.")  # pragma: no cover

    @abstractmethod
    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """Hide each leased message for ``seconds`` from now (0 makes it visible at once).

        One result per receipt: the receipt to use from now on (a new one where
        the backend rotates receipts) and the new expiry, or the error. A stale
        receipt must give an error. Core calls it with at most
        ``capabilities.max_renew_batch`` receipts.
        """
        raise NotImplementedError(  # pragma: no cover
            "The 'change_visibility' method must be implemented."
        )

    @abstractmethod
    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """Delete (complete) the leased messages; one result per receipt (``None``: deleted).

        A stale receipt must give an error where ``capabilities.detects_stale_receipts``.
        Core calls it with at most ``capabilities.max_delete_batch`` receipts.
        """
        raise NotImplementedError("The 'delete' method must be implemented.")  # pragma: no cover

    def abandon(self, receipts: Sequence[str], delay: float) -> list[BaseException | None]:
        """Release the messages: visible again after ``delay`` seconds (0: now).

        The default is :meth:`change_visibility` with ``delay``; a backend with a
        native abandon (Service Bus) overrides it. Core calls it with at most
        ``capabilities.max_renew_batch`` receipts.
        """
        return [
            result if isinstance(result, BaseException) else None
            for result in self.change_visibility(receipts, delay)
        ]

    def checkpoint(
        self, entries: Sequence[CheckpointEntry], seconds: float
    ) -> list[Visibility | BaseException]:
        """Save each entry's ``data`` with its leased message and hide it ``seconds`` from now.

        Only called when ``capabilities.native_checkpoint``. Like
        :meth:`change_visibility`, one result per entry: the receipt to use from
        now on and the new expiry, or the error; a stale receipt must give an
        error and change nothing. The data must come back as
        :attr:`RawMessage.checkpoint` on every later receive of the message,
        until a later checkpoint replaces it; the body and properties must not
        change. A checkpoint the service cannot hold (too large) is an error
        with :attr:`ErrorCode.TOO_LARGE` for that entry, with no call made.
        Core calls it with at most ``capabilities.max_renew_batch`` entries.
        """
        raise NotImplementedError("The 'checkpoint' method is not implemented.")

    def dead_letter(self, receipt: str, reason: str, message: RawMessage) -> None:
        """Move the leased message to the backend's own dead-letter store with ``reason``.

        Only called when ``capabilities.native_dead_letter``; otherwise core
        copies the message to a dead-letter queue (see :meth:`dead_letter_queue`)
        and deletes it.
        """
        raise NotImplementedError("The 'dead_letter' method is not implemented.")

    def group_state(self, receipt: str) -> bytes | None:
        """The state kept with the group of the leased message ``receipt`` (``None``: none).

        Only called when ``capabilities.group_state``, for a held lease of a
        message sent with a group. A stale receipt must give an error.
        """
        raise NotImplementedError("The 'group_state' method is not implemented.")

    def set_group_state(self, receipt: str, state: bytes | None) -> None:
        """Replace (``None``: clear) the state of the group of the leased message ``receipt``.

        Only called when ``capabilities.group_state``; a stale receipt must give an
        error and change nothing.
        """
        raise NotImplementedError("The 'set_group_state' method is not implemented.")

    def dead_letter_queue(self) -> str | None:
        """The queue core copies dead letters to, where the service names one; ``None``: none.

        Without a native store core copies a dead-lettered message to this queue
        (SQS: the redrive policy's dead-letter queue, where the rest of the AWS
        tooling looks) through :meth:`sibling`, or to ``<queue>-poison`` when this
        is ``None`` (the default). May make a network call; core asks once.
        """
        return None

    def dead_letters(self, limit: int) -> list[DeadLetter]:
        """Read up to ``limit`` messages of the native dead-letter store without removing them."""
        raise NotImplementedError("The 'dead_letters' method is not implemented.")

    def dead_letters_after(self, after: str, limit: int) -> list[DeadLetter]:
        """Read up to ``limit`` dead letters that come after the one whose id is ``after``.

        In :meth:`dead_letters`' order (oldest first), without removing them: the
        next page, for ``Queue.peek_dead_letters(after=...)``. A driver should read
        about ``limit`` entries of its store, not the ones before ``after`` (an
        index on the id and one on the order). Must raise :class:`KeyError` when
        ``after`` is not a dead letter here (any more: re-driven or removed). The
        default raises :class:`NotImplementedError`: the backend cannot page its
        dead letters, and core says so before any call.
        """
        raise NotImplementedError("The 'dead_letters_after' method is not implemented.")

    def dead_letter_store(self) -> Driver:
        """A driver over this queue's native dead-letter store, for re-driving dead letters.

        Only called when ``capabilities.native_dead_letter`` (without a native
        store core re-drives from the dead-letter queue through :meth:`sibling`).
        The returned driver must implement :meth:`receive`, :meth:`change_visibility`
        and :meth:`delete` on the dead letters, with the same lease rules as the
        queue (a received dead letter is hidden from other receivers until its
        lease ends, and ``delete`` with a stale receipt is refused); the other
        data methods may raise. Each message it receives carries the dead letter's
        own properties plus the marks core's dead-letter copies carry
        (:func:`leasekit.dead_letter_format.marked`: the original id, the reason and the
        delivery count), and as ``enqueued_at`` the time it was dead-lettered where
        the store knows it. Constructing it must do no network I/O; core closes it.
        The default raises :class:`NotImplementedError`: the backend cannot re-drive.
        """
        raise NotImplementedError("The 'dead_letter_store' method is not implemented.")

    def peek(self, limit: int) -> list[RawMessage]:
        """Read up to ``limit`` visible messages without leasing them (core reads dead letters so).

        Where the service cannot peek, a driver may receive and release at once
        (the delivery counts then grow): say so in its documentation.
        """
        raise NotImplementedError("The 'peek' method is not implemented.")

    def stats(self) -> QueueStats:
        """Message counts for the queue (``capabilities.queue_stats``).

        Must fill exactly the counts named in ``capabilities.counts`` (the others
        ``None``; core derives ``total`` and, without a native dead-letter store,
        ``dead_lettered``). Approximate counts are fine where the service's are;
        a missing queue must raise like any other call.
        """
        raise NotImplementedError("The 'stats' method is not implemented.")

    def sibling(self, queue: str) -> Driver:
        """A driver for another queue on the same account/connection (for dead letters)."""
        raise NotImplementedError("The 'sibling' method is not implemented.")

    # ------------------------------------------------------------------ admin

    @abstractmethod
    def create_queue(self) -> None:
        """Create the queue; succeed if it already exists."""
        raise NotImplementedError(  # pragma: no cover
            "The 'create_queue' method must be implemented."
        )

    @abstractmethod
    def delete_queue(self) -> None:
        """Delete the queue and its messages; succeed if it does not exist."""
        raise NotImplementedError(  # pragma: no cover
            "The 'delete_queue' method must be implemented."
        )

    # ----------------------------------------------------------------- errors

    def error_code(self, exc: BaseException) -> ErrorCode:
        """Classify an error this driver raised. The default reads :class:`DriverError`."""
        if isinstance(exc, DriverError):
            return exc.code
        return ErrorCode.UNKNOWN

    def backend_code(self, exc: BaseException) -> str | None:
        """The backend's own error code for ``exc`` (kept on the leasekit error)."""
        if isinstance(exc, DriverError):
            return exc.backend_code
        return None

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether core should retry the call that raised ``exc``.

        Return ``False`` when the SDK already retries ("the client handles retries").
        """
        return False

    def close(self) -> None:  # noqa: B027 - a no-op default, like httpx's transport
        """Release connections and threads. Called once; must not raise on a closed driver."""
