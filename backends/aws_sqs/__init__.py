"""The AWS SQS backend, on boto3: standard queues, tested against moto's server.

URLs:
    ``aws-sqs://REGION/QUEUE`` — e.g. ``aws-sqs://eu-west-1/orders``; the region may
    be left out (``aws-sqs:///orders``) to take it from the boto3 chain
    (``AWS_REGION``/``AWS_DEFAULT_REGION``, the profile). A queue owned by another
    account: ``aws-sqs://eu-west-1/123456789012/orders``. Query options:
    ``endpoint_url`` (moto, LocalStack, a VPC endpoint), ``profile``,
    ``maximum_message_size``, ``max_attempts``, ``max_pool_connections``,
    ``connect_timeout`` (seconds to open a connection, default 5) and
    ``read_timeout`` (seconds to wait for an answer, default 10; a receive waits
    its long poll beyond that). Each call is bounded tighter still by core's
    deadline: a renewal by the time left on its lease.
    Keyword form: ``leasekit.open("aws-sqs", queue="orders", region="eu-west-1",
    endpoint_url=...)``; ``queue`` may also be a queue URL
    (``https://sqs.eu-west-1.amazonaws.com/123456789012/orders``), which saves the
    ``GetQueueUrl`` call. Credentials come from the usual boto3 chain (environment,
    profile, instance role) or from keyword options ``aws_access_key_id``,
    ``aws_secret_access_key``, ``aws_session_token``, or a ready ``client``; they
    are refused in a URL and never appear in a repr or message. Constructing the
    driver does no network I/O: the boto3 client is created on first use and
    shared with :meth:`SqsDriver.sibling` drivers. A queue named ``*.fifo`` is a
    FIFO queue (``create=True`` creates it with ``FifoQueue=true``): see below.

Delivery semantics:
    At least once. A lease is ``ReceiveMessage`` with ``VisibilityTimeout`` (the
    lease) and ``WaitTimeSeconds`` (long poll, at most 20 s per call; core loops
    for longer waits); renew is ``ChangeMessageVisibility`` and keeps the receipt
    handle; abandon sets the visibility to 0 (or to the delay); complete is
    ``DeleteMessage``; the batch forms use ``ChangeMessageVisibilityBatch`` and
    ``DeleteMessageBatch`` with a result per entry. ``delivery_count`` is
    ``ApproximateReceiveCount``. SQS does **not** promise to refuse a stale
    receipt handle: a delete with an old handle "succeeds but might not delete"
    (and moto accepts stale handles for every call), so
    ``detects_stale_receipts=False`` — a stale complete/renew/abandon may act on
    the message the new holder has, or do nothing, without an error. SQS says a
    change or delete after the lease ended "might result in an error", so
    ``expired_receipt_usable=False``. Invisibility since receive is capped at 12 h
    in total (``max_total_lease``), which core enforces. ``wait=0`` is a short
    poll: real SQS then samples a subset of its servers and may return nothing
    although messages exist; use a wait of 1 s or more when it matters.

    Dead-lettering is core's (``leasekit.dead_letters``): it copies the message,
    with the reason, original id and delivery count as properties, to the queue
    this driver names (:meth:`SqsDriver.dead_letter_queue`: the redrive policy's
    ``deadLetterTargetArn`` queue, where SQS's own redrive puts messages after
    ``maxReceiveCount`` and the rest of the AWS tooling looks) or, without a
    redrive policy, to ``<queue>-poison``; then deletes the original. A copy too
    large for the queue goes with its reason shortened, then without it.
    ``Queue.delete_queue()`` deletes ``<queue>-poison``, never a redrive-policy DLQ.
    Reading dead letters back (``peek_dead_letters``) receives them with a 30 s
    visibility and then releases them (visibility 0): SQS cannot peek, so this
    raises their receive count in the DLQ.

    FIFO queues (``capabilities.ordered`` and ``deduplicates``): every message
    needs ``group=`` (SQS's ``MessageGroupId``; a send without one is refused
    before any call) and cannot be delayed. SQS hands a group's messages out in
    the order sent, possibly several in one receive, and none of the group while
    any of them is in flight; ``lease.message.group`` is read back from the
    ``MessageGroupId`` attribute. Each send carries a deduplication id:
    ``dedup_key=`` when given, else none where the queue has
    ``ContentBasedDeduplication`` (SQS hashes the body), else a fresh UUID per
    message — so a send core retries after a timeout may be stored twice, as on a
    standard queue; give ``dedup_key=`` to make retries safe. (Asked once with
    ``GetQueueAttributes``, on the first send.) Dead letters go to the redrive
    DLQ or to ``<name>-poison.fifo``, a FIFO queue too, each copy in its group.

Limits:
    Leases 1 s – 12 h in whole seconds (SQS accepts 0–43200 s; a 0 s lease hides
    nothing, so leasekit's shortest lease is 1 s, and abandon still uses 0); 12 h
    in total since receive; 10 messages per receive, delete, renew and send call;
    long poll up to 20 s per receive; send delay up to 900 s; abandon delay up
    to 12 h; no per-message time-to-live (the queue's retention period applies).
    Bodies are bytes, sent base64-encoded because an SQS body is text from a
    restricted Unicode set; SQS limits body *plus* message attributes to the
    queue's ``MaximumMessageSize`` (``maximum_message_size``, default 262144 bytes,
    the SQS default and moto's; queues can be set up to 1 MiB). Of that,
    :data:`ATTRIBUTE_ROOM` bytes are kept for properties, so the largest body is
    ``(maximum_message_size - 8192) // 4 * 3`` = 190464 bytes by default. A send
    whose body and properties together exceed the limit is refused before any
    call (``MessageTooLarge``). Properties map to String message attributes, one
    each, when there are at most 10 with names SQS accepts and non-empty values;
    otherwise (more than 10 — e.g. a dead-letter copy of a message with 8 — or a
    name SQS refuses) they travel together as JSON in one attribute,
    ``leasekit-properties``, and are unpacked on receive.

    Counts: ``Queue.stats()`` gives SQS's approximate ``ApproximateNumberOfMessages``
    (visible), ``…NotVisible`` (leased; a message abandoned with a delay is
    counted here too, as SQS hides it like a lease) and ``…Delayed`` (delayed),
    their sum as ``total``, and (core's) as ``dead_lettered`` every message in the
    dead-letter queue core copies to (the redrive DLQ, else ``<queue>-poison``; 0
    while neither exists). SQS documents these counts as eventually consistent, settling up to
    about a minute after traffic stops. A redrive DLQ shared by several queues is
    counted whole: SQS does not tell which queue a letter came from.

Raw types:
    ``lease.raw`` is the message dict from boto3's ``receive_message``
    (``MessageId``, ``ReceiptHandle``, ``Body``, ``Attributes``,
    ``MessageAttributes``). SDK errors are :class:`botocore.exceptions.ClientError`
    (service errors; ``.response["Error"]["Code"]``) and
    :class:`botocore.exceptions.BotoCoreError` (network, credentials); per-entry
    batch failures are :class:`leasekit.spi.DriverError` carrying the entry's code.

Errors:
    ``ReceiptHandleIsInvalid``, ``MessageNotInflight``, ``InvalidParameterValue``
    about the receipt handle (expired) → ``LeaseLost``; ``QueueDoesNotExist`` /
    ``AWS.SimpleQueueService.NonExistentQueue`` → ``QueueNotFound``;
    ``InvalidClientTokenId``, ``SignatureDoesNotMatch``, ``AccessDenied``, missing
    credentials… → ``AuthenticationFailed``; throttling, ``OverLimit``, 5xx and
    network errors (``EndpointConnectionError``, timeouts) →
    ``BackendUnavailable``; other ``InvalidParameterValue`` → ``InvalidArgument``.
    Core retries transient errors, within each call's deadline, so boto3 makes
    one attempt per call by default (``max_attempts=1``); with more, boto3
    retries itself (standard mode, backoff of up to seconds between attempts,
    which a short lease may not have) and core does not retry again.
"""

from __future__ import annotations

from leasekit.hookspecs import hookimpl
from leasekit.registry import BackendSpec

from .driver import SqsDriver
from .wire import ATTRIBUTE_ROOM, PACKED

__all__ = [
    "ATTRIBUTE_ROOM",
    "PACKED",
    "SqsDriver",
    "leasekit_add_backends",
]


@hookimpl
def leasekit_add_backends() -> list[BackendSpec]:
    """Register ``aws-sqs``."""
    return [
        BackendSpec(
            name="aws-sqs",
            driver="leasekit.backends.aws_sqs:SqsDriver",
            extra="sqs",
            description="Amazon SQS standard queues through boto3 (moto for local tests)",
        )
    ]
