"""What a worker does with a message, written once for the threaded and the asyncio worker.

:class:`~leasekit.Consumer` (threads) and :class:`~leasekit.aio.AsyncConsumer`
(tasks) differ only in how they wait; the rules are here: the settings and
their checks, when a message is poison, how long a failed one waits before it
is delivered again, how receive and completion failures are retried, and what
a failed completion means (:func:`completion_outcome`).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

from . import errors
from .capabilities import Capabilities
from .duration_policy import FixedLeaseDuration, LeaseDurationPolicy
from .idempotency import IdempotencyStore
from .keeper import LeaseKeeper
from .lease import Lease
from .message import LeaseState
from .options import MAX_SECONDS, check_bool, check_int, check_number

__all__ = [
    "RECEIVE_BACKOFF_MAX",
    "RECEIVE_BACKOFF_START",
    "SETTLE_BACKOFF_MAX",
    "SETTLE_BACKOFF_START",
    "SETTLE_RETRY_LIMIT",
    "SHUTDOWN_CALL_TIMEOUT",
    "WorkerSettings",
    "abandon_delay",
    "completion_outcome",
    "poison_reason",
    "receive_pause",
    "settle_pause",
    "transient",
]

_log = logging.getLogger("leasekit.consumer")

#: Backoff after a failed receive (seconds): first, and the cap. A worker loop
#: never exits on a transient fault; it waits and tries again while its workers
#: and the keeper go on.
RECEIVE_BACKOFF_START = 0.1
RECEIVE_BACKOFF_MAX = 5.0
#: Backoff between retries of a completion that failed transiently (first, cap).
SETTLE_BACKOFF_START = 0.1
SETTLE_BACKOFF_MAX = 2.0
#: Longest a handled message's completion is retried while its lease stays
#: held (the keeper renews it meanwhile); after that it is left to come back.
SETTLE_RETRY_LIMIT = 60.0
#: How long giving leases back at shutdown may take in all; a lease not given
#: back in time comes back by itself when its physical lease runs out.
SHUTDOWN_CALL_TIMEOUT = 2.0


@dataclass(frozen=True)
class WorkerSettings:
    """A worker's settings, checked once (see :class:`~leasekit.Consumer` for each)."""

    concurrency: int
    duration_policy: LeaseDurationPolicy
    max_deliveries: int | None
    idempotency: IdempotencyStore | None
    keeper: LeaseKeeper | None
    max_lifetime: float | None
    prefetch: int
    backoff_base: float
    backoff_max: float
    shutdown_grace: float
    pass_lease: bool
    handle_signals: bool

    @classmethod
    def check(
        cls,
        capabilities: Capabilities,
        default_lease: float,
        check_duration: Any,
        *,
        concurrency: object,
        lease_duration: object,
        duration_policy: object,
        max_deliveries: object,
        idempotency: object,
        keeper: object,
        max_lifetime: object,
        prefetch: object,
        backoff_base: object,
        backoff_max: object,
        shutdown_grace: object,
        pass_lease: object,
        handle_signals: object,
        receivers: int = 1,
    ) -> WorkerSettings:
        """Check every setting; raise :class:`~leasekit.InvalidArgument` for the first bad one.

        ``check_duration`` is the queue's (``Queue.check_duration``).
        """
        check_int(concurrency, "concurrency", minimum=1)
        assert isinstance(concurrency, int)
        if max_deliveries is not None:
            check_int(max_deliveries, "max_deliveries", minimum=1)
        if prefetch is not None:
            check_int(prefetch, "prefetch", minimum=0)
        for name, seconds in (
            ("backoff_base", backoff_base),
            ("backoff_max", backoff_max),
            ("shutdown_grace", shutdown_grace),
        ):
            check_number(seconds, name, minimum=0, maximum=MAX_SECONDS)
        if max_lifetime is not None:
            check_number(max_lifetime, "max_lifetime", above=0, maximum=MAX_SECONDS)
        check_bool(pass_lease, "pass_lease")
        check_bool(handle_signals, "handle_signals")
        if duration_policy is not None and not isinstance(duration_policy, LeaseDurationPolicy):
            raise errors.InvalidArgument(
                f"duration_policy must be a LeaseDurationPolicy, got {duration_policy!r}"
            )
        if keeper is not None and not isinstance(keeper, LeaseKeeper):
            raise errors.InvalidArgument(f"keeper must be a LeaseKeeper, got {keeper!r}")
        if lease_duration is not None and duration_policy is not None:
            raise errors.InvalidArgument("give lease_duration or duration_policy, not both")
        if idempotency is not None and not isinstance(idempotency, IdempotencyStore):
            raise errors.InvalidArgument("idempotency must have seen(), record() and close()")
        if duration_policy is None:
            seconds = default_lease if lease_duration is None else check_duration(lease_duration)
            duration_policy = FixedLeaseDuration(seconds)
        assert isinstance(duration_policy, LeaseDurationPolicy)
        # Default: room for a whole receive batch beyond the busy handlers, so receives
        # and grouped completions stay large; at most 4x concurrency, so a consumer
        # does not hoard a big backend's batch.
        batch = capabilities.max_receive_batch
        default_prefetch = max(concurrency, min(receivers * batch, 4 * concurrency))
        return cls(
            concurrency=concurrency,
            duration_policy=duration_policy,
            max_deliveries=max_deliveries,  # type: ignore[arg-type]
            idempotency=idempotency,
            keeper=keeper,
            max_lifetime=max_lifetime,  # type: ignore[arg-type]
            prefetch=default_prefetch if prefetch is None else prefetch,  # type: ignore[arg-type]
            backoff_base=float(backoff_base),  # type: ignore[arg-type]
            backoff_max=float(backoff_max),  # type: ignore[arg-type]
            shutdown_grace=float(shutdown_grace),  # type: ignore[arg-type]
            pass_lease=bool(pass_lease),
            handle_signals=bool(handle_signals),
        )

    def lease_duration(self, capabilities: Capabilities, check_duration: Any) -> float:
        """The physical lease for the next receive (the policy's, within the backend's range)."""
        if capabilities.fixed_lease is not None:
            return capabilities.fixed_lease
        wanted = self.duration_policy.current()
        seconds: float = check_duration(
            min(max(wanted, capabilities.min_lease), capabilities.max_lease)
        )
        return seconds


def poison_reason(delivery_count: int, max_deliveries: int | None) -> str | None:
    """Why a message delivered ``delivery_count`` times is poison, or ``None`` if it is not."""
    if max_deliveries is None or delivery_count <= max_deliveries:
        return None
    return f"delivered {delivery_count} times; max_deliveries is {max_deliveries}"


def abandon_delay(
    delivery_count: int, settings: WorkerSettings, capabilities: Capabilities
) -> float:
    """How long a message whose handler failed waits: ``base * 2**(count-1)``, capped."""
    limit = capabilities.max_abandon_delay
    if limit <= 0 or settings.backoff_base <= 0:
        return 0.0
    delay = settings.backoff_base * 2.0 ** min(max(0, delivery_count - 1), 64)
    return float(min(delay, settings.backoff_max, limit))


def receive_pause(failures: int) -> float:
    """Seconds to wait after ``failures`` failed receives in a row (capped, jittered)."""
    pause = min(RECEIVE_BACKOFF_MAX, RECEIVE_BACKOFF_START * 2.0 ** min(failures - 1, 64))
    return pause * (0.5 + random.random() / 2)


def settle_pause(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` of a completion (capped, jittered)."""
    pause = min(SETTLE_BACKOFF_MAX, SETTLE_BACKOFF_START * 2.0 ** min(attempt - 1, 64))
    return pause * (0.5 + random.random() / 2)


def transient(failure: BaseException | None) -> bool:
    """Whether a failed completion may work if tried again (the backend was unreachable)."""
    return isinstance(failure, errors.BackendUnavailable)


def completion_outcome(
    lease: Lease, failure: BaseException | None, *, shutting_down: bool
) -> tuple[str, str | None, BaseException | None]:
    """What completing a handled lease came to: ``(outcome, counter, error)``.

    ``outcome`` is the worker hook's (``completed``, ``stale``, ``error``,
    ``abandoned_at_shutdown``), ``counter`` the stats field to add one to
    (``None``: none; ``completed`` is counted by the caller, in bulk). Failures
    are logged here.
    """
    if failure is None:
        return "completed", None, None
    if isinstance(failure, errors.LeaseLost):
        _log.warning(
            "message %r was handled but its receipt was stale on complete (%s); "
            "it may be delivered again",
            lease.message.id,
            failure,
        )
        return "stale", "stale_on_complete", failure
    if isinstance(failure, errors.LeaseStateError):
        if lease.state is LeaseState.ABANDONED and shutting_down:
            return "abandoned_at_shutdown", None, None
        _log.error("could not complete message %r: %s", lease.message.id, failure)
        return "error", "settle_errors", failure
    _log.error("could not settle message %r: %s", lease.message.id, failure)
    return "error", "settle_errors", failure
