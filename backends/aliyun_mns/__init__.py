"""The Alibaba Cloud MNS (Simple Message Queue) backend, on ``aliyun-mns-sdk`` (API 2015-06-06).

URLs:
    ``aliyun-mns://HOST[:PORT]/QUEUE`` — queue ``QUEUE`` at the MNS endpoint
    ``HOST`` (``aliyun-mns://1234567890.mns.cn-hangzhou.aliyuncs.com/jobs``).
    An endpoint on a loopback host speaks ``http``, any other ``https``;
    ``?scheme=http|https`` overrides (``aliyun-mns://127.0.0.1:8080/jobs?scheme=http``).
    Other URL options: ``connect_timeout`` (seconds to open a connection,
    default 5) and ``read_timeout`` (seconds to wait for an answer, default 10;
    a receive waits its long poll beyond that); ``ordered=true`` for an ordered
    (FIFO) queue and ``control_endpoint`` for the OpenAPI endpoint (see
    "Ordered queues" below). Each call is bounded tighter
    still by core's deadline: a renewal by the time left on its lease, so a
    hung request fails before the lease would have ended. Keyword form::

        leasekit.open("aliyun-mns", queue="jobs",
                      endpoint="https://1234567890.mns.cn-hangzhou.aliyuncs.com",
                      access_key_id=AK, access_key_secret=SK)

    Credentials are **never** part of a URL (a URL with a user, password or a
    key in its query is refused). Give ``access_key_id`` and
    ``access_key_secret`` (plus ``security_token`` for STS) as keyword
    options, or ``credentials_provider`` (any object with the SDK's
    ``get_credentials()``, e.g. from ``alibabacloud_credentials``), or set
    ``ALIBABA_CLOUD_ACCESS_KEY_ID``, ``ALIBABA_CLOUD_ACCESS_KEY_SECRET`` and
    optionally ``ALIBABA_CLOUD_SECURITY_TOKEN``. Secrets never appear in a
    repr, a log line or an error message from this module.

Delivery semantics:
    At least once. MNS sets the visibility timeout **per queue**: a receive
    hides each message for the queue's ``VisibilityTimeout``. A lease of any
    other duration costs one ``ChangeMessageVisibility`` right after the
    receive (core does it: ``lease_set_after_receive=True``), so set the
    queue's visibility timeout to the lease you use most (``create=True``
    makes queues with MNS's default, 30 s, which is also leasekit's default
    lease). The receipt is MNS's receipt handle. Renew is
    ``ChangeMessageVisibility``, which **rotates the handle**
    (the old one then gets ``MessageNotExist``); core tracks the newest.
    Abandon is ``ChangeMessageVisibility`` with the delay, at least 1 s: MNS
    refuses 0, so an abandoned message is visible again after one second, not
    at once. Complete is ``DeleteMessage`` (``BatchDeleteMessage`` when core
    settles several at once, with per-handle results). A handle is valid only
    until the message's ``NextVisibleTime``: an expired handle fails
    (``LeaseLost``) even if nobody received the message again. The delivery
    count is MNS's ``DequeueCount``. Order is MNS's (priority, then roughly
    FIFO); receives long-poll (``waitseconds``, whole seconds:
    ``wait_resolution=1``, so core asks for whole seconds and polls the rest).

    Dead-lettering is not native in this API: core copies the message to
    ``<queue>-poison`` with the properties ``leasekit-dead-letter-reason``,
    ``leasekit-original-id`` and ``leasekit-delivery-count``, then deletes the
    original. ``Queue.peek_dead_letters`` peeks the poison queue
    (``BatchPeekMessage``: at most 16 messages, and only visible ones).

    **Bodies.** leasekit sends the standard base64 of the body — what the
    SDK's default (``set_encoding(True)``) producers send and consumers
    expect, so they interoperate both ways. An empty body, which MNS and the
    SDK refuse, is sent as the text ``=`` (which the SDK's base64 decoder also
    reads as empty). On receive, ``=`` gives ``b""``; strict base64 gives the
    decoded bytes; any other text (a producer with encoding off) gives its
    UTF-8 bytes unchanged. The one ambiguity is plain text that happens to be
    valid base64 (``"test"``): it is read as base64. The text as received is at
    ``lease.raw.message_body``.

    **Properties** are MNS user properties (``UserProperties``), so other MNS
    consumers see them. Plain text values go as ``STRING``; a value with
    control characters (which XML cannot carry, or would normalise, such as a
    carriage return) goes as ``BINARY`` holding its UTF-8 bytes, so it round-trips
    exactly. On receive, ``STRING``/``NUMBER``/``BOOLEAN`` values are read as
    text and ``BINARY`` values as UTF-8 (non-UTF-8 bytes from another producer
    are given as their base64 text).

Ordered queues (``ordered=true``):
    MNS's ordered (FIFO) queues keep each ``MessageGroupId`` in order and hand
    out a group's next message only after the previous one is deleted or its
    visibility timeout has run out (Alibaba's *Ordered messages* page, quoted in
    ``docs/ordering.md``). With ``ordered=true``: ``capabilities.ordered`` is
    true, ``send(..., group=...)`` sends the group as ``MessageGroupId``, every
    message needs a group (MNS answers ``FifoMissingMessageGroupId`` without one;
    leasekit refuses such a send before any call) and none can be delayed, and
    ``lease.message.group`` is read back from the receive. One receive hands out
    at most one message per group (the group's head).

    Only MNS's control-plane OpenAPI (``2022-01-19``) knows queue types, so
    ordered queues use it, through ``alibabacloud-mns-open20220119`` (part of
    the ``aliyun-mns`` extra): ``create=True`` is ``CreateQueue`` with
    ``QueueType=fifo``; an existing queue of that name that is not a FIFO queue
    is refused (``QueueAlreadyExists``), since it would not keep the order; a
    queue opened without ``create`` is checked once, before the first send or
    receive, with ``GetQueueAttributes`` (not FIFO: ``InvalidArgument``). The
    OpenAPI's host is ``mns-open.REGION.aliyuncs.com``, the region read from the
    endpoint (``ACCOUNT.mns.REGION[-internal[-vpc]].aliyuncs.com``); any other
    endpoint (the emulator) serves it itself, and ``control_endpoint=`` overrides
    both. The poison queue of an ordered queue is an ordered queue too, each dead
    letter in its group. Standard queues (the default) never touch the OpenAPI.

Limits:
    Leases 1 s – 12 h (43,200 s), whole seconds. 16 messages per receive,
    delete and send call, and 64 KiB of body text per send batch (declared as
    ``max_send_batch_bytes``: core splits batches by it); no batch visibility
    change. Bodies up to 49,152 bytes
    (48 KiB): MNS takes 64 KiB of body text and base64 makes 4 characters of 3
    bytes. Property values must not be empty (the SDK drops an empty value on
    receive, so it is refused before sending) and names must be plain text.
    Send delay up to 7 days (whole seconds, rounded up); ``delay=0`` leaves the
    queue's own ``DelaySeconds`` (0 unless an operator set one). No
    per-message time-to-live: retention is the queue's
    ``MessageRetentionPeriod`` (60 s – 7 days), so ``ttl=`` is unsupported.
    Long poll up to 30 s.

    Counts: ``Queue.stats()`` gives MNS's approximate ``ActiveMessages``
    (visible), ``InactiveMessages`` (leased; an abandoned message, hidden for its
    delay of at least 1 s, is counted here too) and ``DelayMessages`` (delayed)
    from ``GetQueueAttributes``, their sum as ``total``, and as ``dead_lettered``
    the total of ``<queue>-poison`` (core's, one more call; 0 while it does not
    exist). Alibaba Cloud has announced that these three fields will be retired
    and then always read 0 (the GetQueueAttributes reference points to the
    CloudMonitor metrics ``NumberOfMessagesVisible``, ``…Invisible`` and
    ``…Delayed`` instead, which this driver does not read); from then on the
    counts read 0 whatever the queue holds. aliyun-mns-sdk 1.3.0 marks them
    ``@deprecated`` on ``QueueMeta``; the driver reads them without that
    accessor, so no ``DeprecationWarning`` is raised.

    The SDK is synchronous and one client holds one keep-alive HTTP
    connection that is not safe to share between threads, so the driver
    keeps a small pool of clients: each call borrows one (creating it if all
    are busy) and returns it, so N threads use at most N connections, reused
    across calls. ``Driver.sibling`` (the poison queue) shares the pool.

Raw types:
    ``lease.raw`` is the SDK's ``mns.queue.Message`` from the receive (its
    ``message_body`` is the text as received; ``get_user_properties()`` the
    SDK's property objects). Errors are the SDK's
    ``mns.mns_exception.MNSServerException`` (``.type`` is MNS's error code,
    ``.request_id``), ``MNSClientNetworkException`` (connection failures and
    unreadable responses) and ``MNSClientParameterException``; the leasekit
    error's ``__cause__``.

Errors:
    Classified by MNS's error code: ``MessageNotExist`` and ``ReceiptHandleError``
    on a settle or renew → ``LeaseLost`` (on a receive or peek,
    ``MessageNotExist`` just means "no message" and gives an empty result);
    ``QueueNotExist`` → ``QueueNotFound``; ``SignatureDoesNotMatch``,
    ``AccessDenied``, ``InvalidAccessKeyId`` (and the other authorisation
    codes, ``TimeExpired`` for a skewed clock) → ``AuthenticationFailed``;
    network errors, unreadable responses, ``InternalError`` and throttling →
    ``BackendUnavailable``; ``InvalidArgument`` (an oversize body too),
    ``MalformedXML`` and the SDK's own parameter checks → ``InvalidArgument``.
    The SDK does not retry (it only re-sends once on a dropped keep-alive
    connection), so core retries ``BackendUnavailable``. A retried call whose
    first attempt did reach MNS can then report ``LeaseLost`` (the delete
    happened, or the visibility change rotated the handle): the message is
    then deleted, or comes back when its visibility ends — never lost.
"""

from __future__ import annotations

from leasekit.hookspecs import hookimpl
from leasekit.registry import BackendSpec

from .driver import AliyunMnsDriver
from .error_codes import classify
from .wire import MAX_BODY, decode_body, encode_body

__all__ = [
    "MAX_BODY",
    "AliyunMnsDriver",
    "classify",
    "decode_body",
    "encode_body",
    "leasekit_add_backends",
]


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``aliyun-mns``."""
    return [
        BackendSpec(
            name="aliyun-mns",
            driver="leasekit.backends.aliyun_mns:AliyunMnsDriver",
            extra="aliyun-mns",
            description="Alibaba Cloud MNS queues (rotating receipt handles, <queue>-poison)",
        )
    ]
