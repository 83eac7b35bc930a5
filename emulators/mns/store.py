# House docstring style uses "Parameters:"/"Returns:"/"Raises:" sections (STYLE.md 14), which
# ruff's unconfigured pydocstyle misreads as numpy sections.
"""In-memory queue state for the MNS emulator, with MNS's message lifecycle.

:class:`MnsStore` holds every queue and message and is safe to share between
threads: one lock guards all state, and each queue has a condition variable on
that lock that long-polling receivers wait on. A send, a queue deletion or the
time a hidden message becomes visible again wakes them; nothing polls.

Lifecycle (MNS "Active / Inactive / Delayed" states):

- A sent message is *Delayed* until its ``DelaySeconds`` pass, then *Active*.
- A receive makes it *Inactive* for the queue's ``VisibilityTimeout``, issues a
  fresh receipt handle and counts a dequeue; ``FirstDequeueTime`` is set once.
- ``ChangeMessageVisibility`` restarts the hidden period from now and issues a
  new handle; the previous handle stops working.
- A receipt handle is valid only until the message's ``NextVisibleTime``
  (documented for DeleteMessage: "After that time, the message changes to the
  Active state and the receipt handle expires"). An expired, replaced or deleted
  handle gets ``MessageNotExist``; one that is not in this emulator's handle
  format gets ``ReceiptHandleError``.
- After ``MessageRetentionPeriod`` (counted from the enqueue time, with the
  queue's current setting) a message is gone whatever its state.

Ordered (FIFO) queues — a queue created with ``QueueType=fifo`` through the
OpenAPI (:mod:`.openapi`) — follow Alibaba's *Ordered messages* page
(https://help.aliyun.com/zh/mns/developer-reference/sequential-message):

- every message needs a ``MessageGroupId``; a send without one gets
  ``FifoMissingMessageGroupId``;
- within a group, messages are handed out in the order they arrived; a group's
  earliest message still in the queue (its *head*) is the only one that can be
  received: "once a message of a group is pulled and not yet deleted it blocks
  the group's later messages; only after it is deleted or its visibility timeout
  expires can the next message of the group be pulled". So one batch receive
  returns at most one message per group, and a head whose visibility lapses is
  the one received next;
- different groups are independent.

Where that page is silent the store chooses (docs/ordering.md lists these):
``FifoMissingMessageGroupId`` is a 400 and refuses the whole batch; any
non-empty group id is accepted; a ``MessageGroupId`` sent to a *standard* queue
is ignored (neither stored nor returned); within a group priorities do not
reorder (arrival order); a delayed head blocks its group until it is handled;
a peek shows only what a receive could hand out (visible heads).

Time comes from an injectable clock (seconds since the epoch), so tests can age
messages without waiting; long-poll timeouts still run on the real monotonic
clock.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .errors import MnsError

__all__ = [
    "ATTRIBUTE_LIMITS",
    "DEFAULT_ATTRIBUTES",
    "MAX_BATCH",
    "MAX_SEND_BODY",
    "QUEUE_TYPES",
    "Clock",
    "MessageView",
    "MnsStore",
    "OutgoingMessage",
    "Property",
    "QueueInfo",
    "SentMessage",
]

Clock = Callable[[], float]
"""Returns the current time in seconds since the epoch (like :func:`time.time`)."""

# Documented ranges (CreateQueue / SetQueueAttributes): name -> (low, high, unit).
ATTRIBUTE_LIMITS: dict[str, tuple[int, int, str]] = {
    "DelaySeconds": (0, 604800, "seconds"),
    "MaximumMessageSize": (1024, 65536, "bytes"),
    "MessageRetentionPeriod": (60, 604800, "seconds"),
    "PollingWaitSeconds": (0, 30, "seconds"),
    "VisibilityTimeout": (1, 43200, "seconds"),
}
DEFAULT_ATTRIBUTES: dict[str, int] = {
    "DelaySeconds": 0,
    "MaximumMessageSize": 65536,
    "MessageRetentionPeriod": 345600,
    "PollingWaitSeconds": 0,
    "VisibilityTimeout": 30,
}
MAX_BATCH = 16  # BatchSend/BatchReceive/BatchPeek/BatchDelete take at most 16 entries.
#: The most body text one SendMessage or BatchSendMessage carries, all messages together:
#: "Each batch supports up to 16 messages with a combined maximum size of 64 KB"
#: (https://www.alibabacloud.com/help/en/mns/developer-reference/batchsendmessage).
MAX_SEND_BODY = 65536
PRIORITY_RANGE = (1, 16)  # 1 is the highest priority.
DEFAULT_PRIORITY = 8
MESSAGE_DELAY_RANGE = (0, 604800)
CHANGE_VISIBILITY_RANGE = (1, 43200)
WAIT_SECONDS_RANGE = (0, 30)
QUEUE_NAME_MAX = 120
#: The OpenAPI's ``QueueType`` values: "normal: standard queue. fifo: FIFO queue."
QUEUE_TYPES = ("normal", "fifo")

_QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*\Z")
_HANDLE_PREFIX = "1-"
_HANDLE_RE = re.compile(r"1-[A-Za-z0-9_-]{24}\Z")  # "1-" + base64url of 18 random bytes


@dataclass(frozen=True)
class Property:
    """One user or system property of a message, as sent on the wire."""

    name: str
    value: str
    type: str


@dataclass(frozen=True)
class OutgoingMessage:
    """A message to enqueue.

    Parameters:
        body: the ``MessageBody`` text exactly as the client sent it (the SDK
            sends base64; MNS stores and returns the text unchanged).
        delay_seconds: per-message delay; ``None`` means the queue's DelaySeconds.
        priority: 1 (highest) to 16; ``None`` means 8.
        user_properties: ``UserProperties`` entries, returned on receive.
        system_properties: ``SystemProperties`` entries, returned on receive.
        group: the ``MessageGroupId``, or ``None`` when the request had none.
    """

    body: str
    delay_seconds: int | None = None
    priority: int | None = None
    user_properties: tuple[Property, ...] = ()
    system_properties: tuple[Property, ...] = ()
    group: str | None = None


@dataclass(frozen=True)
class SentMessage:
    """The result of enqueueing one message (``group``: its group on an ordered queue)."""

    message_id: str
    body_md5: str
    group: str | None = None


@dataclass(frozen=True)
class MessageView:
    """A snapshot of a message as a receive or peek returns it.

    Times are seconds since the epoch; ``receipt_handle`` and
    ``next_visible_time`` are ``None`` for peeks. ``first_dequeue_time`` is
    ``None`` if the message was never received. ``group`` is the message's
    ``MessageGroupId`` on an ordered queue, else ``None``.
    """

    message_id: str
    body: str
    body_md5: str
    priority: int
    enqueue_time: float
    dequeue_count: int
    first_dequeue_time: float | None
    receipt_handle: str | None
    next_visible_time: float | None
    user_properties: tuple[Property, ...]
    system_properties: tuple[Property, ...]
    group: str | None = None


@dataclass(frozen=True)
class QueueInfo:
    """Attributes and message counts of one queue (GetQueueAttributes)."""

    name: str
    attributes: Mapping[str, int]
    logging_enabled: bool
    create_time: float
    last_modify_time: float
    active_messages: int
    inactive_messages: int
    delay_messages: int
    queue_type: str = "normal"


@dataclass
class _Message:
    message_id: str
    body: str
    body_md5: str
    priority: int
    enqueue_time: float
    seq: int
    visible_at: float
    user_properties: tuple[Property, ...]
    system_properties: tuple[Property, ...]
    group: str | None = None
    dequeue_count: int = 0
    first_dequeue_time: float | None = None
    receipt_handle: str | None = None

    def view(self, with_handle: bool) -> MessageView:
        return MessageView(
            message_id=self.message_id,
            body=self.body,
            body_md5=self.body_md5,
            priority=self.priority,
            enqueue_time=self.enqueue_time,
            dequeue_count=self.dequeue_count,
            first_dequeue_time=self.first_dequeue_time,
            receipt_handle=self.receipt_handle if with_handle else None,
            next_visible_time=self.visible_at if with_handle else None,
            user_properties=self.user_properties,
            system_properties=self.system_properties,
            group=self.group,
        )


@dataclass
class _Queue:
    name: str
    attributes: dict[str, int]
    logging_enabled: bool
    queue_type: str
    create_time: float
    last_modify_time: float
    cond: threading.Condition
    messages: dict[str, _Message] = field(default_factory=dict)
    handles: dict[str, str] = field(default_factory=dict)  # receipt handle -> message id
    waiters: int = 0
    deleted: bool = False


def _check_range(element: str, value: int, bounds: tuple[int, int], unit: str) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise MnsError.out_of_range(element, low, high, unit)


def check_attributes(attributes: Mapping[str, int]) -> None:
    """Validate queue attributes against the documented ranges.

    Raises:
        MnsError: ``InvalidArgument`` for an unknown name or a value out of range.
    """
    for name, value in attributes.items():
        if name not in ATTRIBUTE_LIMITS:
            raise MnsError.invalid_argument(f"Unknown queue attribute {name}.")
        low, high, unit = ATTRIBUTE_LIMITS[name]
        _check_range(name, value, (low, high), unit)


def check_receipt_handle(handle: str) -> None:
    """Reject a receipt handle that is not in the emulator's format.

    Raises:
        MnsError: ``ReceiptHandleError``.
    """
    if not _HANDLE_RE.match(handle):
        raise MnsError.receipt_handle_error()


def body_md5(body: str) -> str:
    """Return MNS's ``MessageBodyMD5``: upper-case hex MD5 of the body text (UTF-8)."""
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest().upper()


def _new_handle() -> str:
    # 18 random bytes encode to exactly 24 base64url characters: no padding, and
    # nothing the SDK would have to percent-encode when it puts the handle into a URL.
    return _HANDLE_PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(18)).decode("ascii")


class MnsStore:
    """All queues and messages of one emulated MNS account.

    Parameters:
        clock: returns the current time in seconds since the epoch.

    Every public method is thread-safe. Methods raise :class:`MnsError` with the
    code MNS would return.
    """

    def __init__(self, clock: Clock = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._queues: dict[str, _Queue] = {}
        self._seq = 0

    # ------------------------------------------------------------------ queues

    def create_queue(
        self,
        name: str,
        attributes: Mapping[str, int] | None = None,
        logging_enabled: bool | None = None,
        queue_type: str = "normal",
    ) -> bool:
        """Create a queue (CreateQueue).

        Parameters:
            name: the queue name: 1-120 letters, digits or hyphens, starting
                with a letter or digit.
            attributes: attributes by their MNS names; missing ones get defaults.
            logging_enabled: the LoggingEnabled flag; ``None`` means false.
            queue_type: ``normal`` or ``fifo`` (an ordered queue; only the
                OpenAPI's CreateQueue can ask for it).

        Returns:
            True if created; False if an identical queue already existed (MNS
            answers 204 then).

        Raises:
            MnsError: ``QueueNameLengthError``/``InvalidQueueName``,
                ``InvalidArgument``, or ``QueueAlreadyExist`` when the existing
                queue has different attributes or another type.
        """
        if len(name) > QUEUE_NAME_MAX:
            raise MnsError(
                "QueueNameLengthError",
                400,
                f"The length of queue name must be <= {QUEUE_NAME_MAX}.",
            )
        if not _QUEUE_NAME_RE.match(name):
            raise MnsError("InvalidQueueName", 400, "The queue name you provided is invalid.")
        if queue_type not in QUEUE_TYPES:
            raise MnsError.invalid_argument("The value of QueueType should be normal or fifo.")
        requested = dict(attributes or {})
        check_attributes(requested)
        wanted = {**DEFAULT_ATTRIBUTES, **requested}
        logging = bool(logging_enabled)
        with self._lock:
            existing = self._queues.get(name)
            if existing is not None:
                if (
                    existing.attributes == wanted
                    and existing.logging_enabled == logging
                    and existing.queue_type == queue_type
                ):
                    return False
                raise MnsError.queue_already_exist()
            now = self._clock()
            self._queues[name] = _Queue(
                name=name,
                attributes=wanted,
                logging_enabled=logging,
                queue_type=queue_type,
                create_time=now,
                last_modify_time=now,
                cond=threading.Condition(self._lock),
            )
            return True

    def delete_queue(self, name: str) -> None:
        """Delete a queue and its messages (DeleteQueue); a missing queue is no error.

        Receivers blocked on the queue wake up and get ``QueueNotExist``.
        """
        with self._lock:
            queue = self._queues.pop(name, None)
            if queue is not None:
                queue.deleted = True
                queue.cond.notify_all()

    def set_queue_attributes(
        self,
        name: str,
        attributes: Mapping[str, int],
        logging_enabled: bool | None = None,
    ) -> None:
        """Change some attributes of a queue (SetQueueAttributes).

        Raises:
            MnsError: ``QueueNotExist`` or ``InvalidArgument``.
        """
        check_attributes(attributes)
        with self._lock:
            queue = self._queue(name)
            queue.attributes.update(attributes)
            if logging_enabled is not None:
                queue.logging_enabled = logging_enabled
            queue.last_modify_time = self._clock()
            # A shorter PollingWaitSeconds or visibility change can matter to waiters.
            queue.cond.notify_all()

    def get_queue(self, name: str) -> QueueInfo:
        """Return a queue's attributes and message counts (GetQueueAttributes).

        Raises:
            MnsError: ``QueueNotExist``.
        """
        with self._lock:
            queue = self._queue(name)
            now = self._clock()
            self._purge(queue, now)
            active = inactive = delayed = 0
            for message in queue.messages.values():
                if message.visible_at <= now:
                    active += 1
                elif message.dequeue_count == 0:
                    delayed += 1
                else:
                    inactive += 1
            return QueueInfo(
                name=queue.name,
                attributes=dict(queue.attributes),
                logging_enabled=queue.logging_enabled,
                create_time=queue.create_time,
                last_modify_time=queue.last_modify_time,
                active_messages=active,
                inactive_messages=inactive,
                delay_messages=delayed,
                queue_type=queue.queue_type,
            )

    def list_queues(
        self, prefix: str = "", marker: str = "", limit: int = 1000
    ) -> tuple[list[str], str]:
        """List queue names in name order (ListQueue).

        Parameters:
            prefix: only names starting with this.
            marker: start at this name (the previous call's next marker).
            limit: at most this many names (1-1000).

        Returns:
            The names and the next marker ("" when there are no more).

        Raises:
            MnsError: ``InvalidArgument`` for a limit out of range.
        """
        _check_range("x-mns-ret-number", limit, (1, 1000), "")
        with self._lock:
            names = sorted(n for n in self._queues if n.startswith(prefix) and n >= marker)
        if len(names) > limit:
            return names[:limit], names[limit]
        return names, ""

    # ---------------------------------------------------------------- messages

    def send(self, name: str, messages: Sequence[OutgoingMessage]) -> list[SentMessage]:
        """Enqueue messages (SendMessage, BatchSendMessage), all or none.

        Parameters:
            name: the queue.
            messages: 1-16 messages; all are validated before any is enqueued.

        Returns:
            The id and body MD5 of each message (and its group on an ordered
            queue), in order.

        Raises:
            MnsError: ``QueueNotExist``, ``FifoMissingMessageGroupId`` (a message
                without a group on an ordered queue) or ``InvalidArgument`` (body
                size outside 1..MaximumMessageSize bytes, bodies over
                :data:`MAX_SEND_BODY` bytes together, delay or priority out of
                range, too many messages).
        """
        if not 1 <= len(messages) <= MAX_BATCH:
            raise MnsError.out_of_range("Messages", 1, MAX_BATCH, "messages")
        for message in messages:
            if message.delay_seconds is not None:
                _check_range("DelaySeconds", message.delay_seconds, MESSAGE_DELAY_RANGE, "seconds")
            if message.priority is not None:
                _check_range("Priority", message.priority, PRIORITY_RANGE, "")
        with self._lock:
            queue = self._queue(name)
            max_size = queue.attributes["MaximumMessageSize"]
            total = 0
            for message in messages:
                size = len(message.body.encode("utf-8"))
                if not 1 <= size <= max_size:
                    raise MnsError.out_of_range("MessageBody", 1, max_size, "bytes")
                total += size
            if total > MAX_SEND_BODY:
                raise MnsError.out_of_range("Messages", 1, MAX_SEND_BODY, "bytes")
            fifo = queue.queue_type == "fifo"
            if fifo and any(not message.group for message in messages):
                raise MnsError.fifo_missing_message_group_id()
            now = self._clock()
            sent = []
            for message in messages:
                delay = message.delay_seconds
                if delay is None:
                    delay = queue.attributes["DelaySeconds"]
                self._seq += 1
                stored = _Message(
                    message_id=uuid.uuid4().hex.upper(),
                    body=message.body,
                    body_md5=body_md5(message.body),
                    priority=DEFAULT_PRIORITY if message.priority is None else message.priority,
                    enqueue_time=now,
                    seq=self._seq,
                    visible_at=now + delay,
                    user_properties=message.user_properties,
                    system_properties=message.system_properties,
                    group=message.group if fifo else None,
                )
                queue.messages[stored.message_id] = stored
                sent.append(SentMessage(stored.message_id, stored.body_md5, stored.group))
            queue.cond.notify_all()
            return sent

    def receive(
        self, name: str, count: int = 1, wait_seconds: int | None = None
    ) -> list[MessageView]:
        """Receive up to ``count`` messages, long-polling if none is visible.

        Parameters:
            name: the queue.
            count: 1-16 (``numOfMessages``).
            wait_seconds: 0-30; ``None`` means the queue's PollingWaitSeconds.

        Returns:
            1 to ``count`` messages, each now hidden for VisibilityTimeout, with a
            new receipt handle and DequeueCount increased. On an ordered queue
            only group heads are eligible: at most one message per group.

        Raises:
            MnsError: ``MessageNotExist`` if nothing became visible in time,
                ``QueueNotExist`` (also if the queue is deleted while waiting),
                ``InvalidArgument`` for a count or wait out of range.
        """
        _check_range("numOfMessages", count, (1, MAX_BATCH), "")
        if wait_seconds is not None:
            _check_range("waitseconds", wait_seconds, WAIT_SECONDS_RANGE, "seconds")
        deadline: float | None = None
        with self._lock:
            queue = self._queue(name)
            while True:
                if queue.deleted:
                    raise MnsError.queue_not_exist()
                now = self._clock()
                self._purge(queue, now)
                ready = self._visible(queue, now)[:count]
                if ready:
                    visibility = queue.attributes["VisibilityTimeout"]
                    views = []
                    for message in ready:
                        if message.receipt_handle is not None:
                            queue.handles.pop(message.receipt_handle, None)
                        message.receipt_handle = _new_handle()
                        queue.handles[message.receipt_handle] = message.message_id
                        message.dequeue_count += 1
                        if message.first_dequeue_time is None:
                            message.first_dequeue_time = now
                        message.visible_at = now + visibility
                        views.append(message.view(with_handle=True))
                    return views
                if deadline is None:
                    wait = (
                        queue.attributes["PollingWaitSeconds"]
                        if wait_seconds is None
                        else wait_seconds
                    )
                    deadline = time.monotonic() + wait
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MnsError.message_not_exist()
                timeout = remaining
                upcoming = [m.visible_at for m in queue.messages.values() if m.visible_at > now]
                if upcoming:
                    # Wake when the next hidden or delayed message turns visible.
                    timeout = min(timeout, min(upcoming) - now + 0.001)
                queue.waiters += 1
                try:
                    queue.cond.wait(max(timeout, 0.001))
                finally:
                    queue.waiters -= 1

    def peek(self, name: str, count: int = 1) -> list[MessageView]:
        """Return up to ``count`` visible messages without changing them (PeekMessage).

        Raises:
            MnsError: ``MessageNotExist`` if none is visible, ``QueueNotExist``,
                ``InvalidArgument`` for a count out of range.
        """
        _check_range("numOfMessages", count, (1, MAX_BATCH), "")
        with self._lock:
            queue = self._queue(name)
            now = self._clock()
            self._purge(queue, now)
            ready = self._visible(queue, now)[:count]
            if not ready:
                raise MnsError.message_not_exist()
            return [m.view(with_handle=False) for m in ready]

    def change_visibility(self, name: str, handle: str, seconds: int) -> tuple[str, float]:
        """Hide a received message for ``seconds`` from now (ChangeMessageVisibility).

        Returns:
            The new receipt handle (the old one stops working) and the new
            NextVisibleTime in seconds since the epoch.

        Raises:
            MnsError: ``InvalidArgument`` (seconds outside 1..43200),
                ``ReceiptHandleError`` (malformed handle), ``MessageNotExist``
                (stale, expired or deleted handle), ``QueueNotExist``.
        """
        _check_range("VisibilityTimeout", seconds, CHANGE_VISIBILITY_RANGE, "seconds")
        check_receipt_handle(handle)
        with self._lock:
            queue = self._queue(name)
            now = self._clock()
            self._purge(queue, now)
            message = self._held(queue, handle, now)
            queue.handles.pop(handle, None)
            message.receipt_handle = _new_handle()
            queue.handles[message.receipt_handle] = message.message_id
            message.visible_at = now + seconds
            return message.receipt_handle, message.visible_at

    def delete(self, name: str, handle: str) -> None:
        """Delete a received message by its current receipt handle (DeleteMessage).

        Raises:
            MnsError: ``ReceiptHandleError``, ``MessageNotExist``, ``QueueNotExist``.
        """
        check_receipt_handle(handle)
        with self._lock:
            queue = self._queue(name)
            now = self._clock()
            self._purge(queue, now)
            self._remove(queue, self._held(queue, handle, now))

    def delete_batch(self, name: str, handles: Sequence[str]) -> list[tuple[str, MnsError]]:
        """Delete several messages (BatchDeleteMessage); each handle stands alone.

        Returns:
            The handles that failed, with the error for each; empty if all worked.

        Raises:
            MnsError: ``QueueNotExist``, or ``InvalidArgument`` for 0 or more than
                16 handles.
        """
        if not 1 <= len(handles) <= MAX_BATCH:
            raise MnsError.out_of_range("ReceiptHandles", 1, MAX_BATCH, "receipt handles")
        failures: list[tuple[str, MnsError]] = []
        with self._lock:
            queue = self._queue(name)
            now = self._clock()
            self._purge(queue, now)
            for handle in handles:
                try:
                    check_receipt_handle(handle)
                    self._remove(queue, self._held(queue, handle, now))
                except MnsError as exc:
                    failures.append((handle, exc))
        return failures

    def waiting(self, name: str) -> int:
        """Return how many receivers are blocked long-polling on ``name`` (a test hook)."""
        with self._lock:
            queue = self._queues.get(name)
            return queue.waiters if queue is not None else 0

    def wake(self) -> None:
        """Make blocked receivers re-check the clock, e.g. after a fake clock moved."""
        with self._lock:
            for queue in self._queues.values():
                queue.cond.notify_all()

    # ---------------------------------------------------------------- internal

    def _queue(self, name: str) -> _Queue:
        queue = self._queues.get(name)
        if queue is None:
            raise MnsError.queue_not_exist()
        return queue

    @staticmethod
    def _visible(queue: _Queue, now: float) -> list[_Message]:
        """The messages a receive may hand out now, in the order it hands them out.

        On an ordered queue a message is eligible only as its group's head: the
        group's earliest message still in the queue, whatever its state.
        """
        if queue.queue_type == "fifo":
            heads: dict[str | None, _Message] = {}
            for message in queue.messages.values():
                head = heads.get(message.group)
                if head is None or message.seq < head.seq:
                    heads[message.group] = message
            candidates: Iterable[_Message] = heads.values()
        else:
            candidates = queue.messages.values()
        ready = [m for m in candidates if m.visible_at <= now]
        ready.sort(key=lambda m: (m.priority, m.seq))
        return ready

    @staticmethod
    def _held(queue: _Queue, handle: str, now: float) -> _Message:
        message_id = queue.handles.get(handle)
        message = queue.messages.get(message_id) if message_id is not None else None
        if message is None or message.receipt_handle != handle or message.visible_at <= now:
            raise MnsError.message_not_exist()
        return message

    @staticmethod
    def _remove(queue: _Queue, message: _Message) -> None:
        queue.messages.pop(message.message_id, None)
        if message.receipt_handle is not None:
            queue.handles.pop(message.receipt_handle, None)
        if message.group is not None:
            # The group's next message is its head now: wake receivers waiting for it.
            queue.cond.notify_all()

    def _purge(self, queue: _Queue, now: float) -> None:
        retention = queue.attributes["MessageRetentionPeriod"]
        expired: Iterable[_Message] = [
            m for m in queue.messages.values() if m.enqueue_time + retention <= now
        ]
        for message in expired:
            self._remove(queue, message)
