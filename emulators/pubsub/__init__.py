"""A wire-level emulator of Google Cloud Pub/Sub over gRPC, with exactly-once delivery.

Google's own emulator is a gcloud Java component (and has no exactly-once
delivery); Go's ``pstest`` uses the message id as the ack id. Neither checks
stale ack ids, so leasekit's Pub/Sub backend is tested against this one. It is
written from Google's documents: the ``google.pubsub.v1`` API reference and the
pages on resource limits, exactly-once delivery, dead-letter topics, retry
policies, ordering and filters. :mod:`.broker` and :mod:`.server` list what it
emulates and every choice made where the documents are silent.

Run it with ``python -m leasekit.emulators.pubsub --port 8085`` and point the
official client at it with ``PUBSUB_EMULATOR_HOST=127.0.0.1:8085``; or in-process::

    from leasekit.emulators.pubsub import ManualClock, PubSubEmulator
    clock = ManualClock()
    with PubSubEmulator(clock=clock) as emulator:
        os.environ["PUBSUB_EMULATOR_HOST"] = emulator.address
        ...
        clock.advance(11)  # every ack deadline up to 11 s from now has passed

State is in memory and lost on exit.
"""

from .broker import Broker, Clock, EmulatorError, ManualClock, SystemClock
from .server import PubSubEmulator

__all__ = ["Broker", "Clock", "EmulatorError", "ManualClock", "PubSubEmulator", "SystemClock"]
