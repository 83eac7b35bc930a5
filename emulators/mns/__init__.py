"""A wire-level emulator of Alibaba Cloud MNS (Simple Message Queue) queues.

MNS has no local emulator, so leasekit's MNS backend is tested against this one.
It speaks MNS's HTTP/XML protocol (API version ``2015-06-06``) to the real
``aliyun-mns-sdk`` client, checks request signatures, and keeps state in memory.

Run it with ``python -m leasekit.emulators.mns --port 8080`` (see ``--help``) or
in-process::

    from leasekit.emulators.mns import MnsEmulator
    with MnsEmulator() as mns:
        account = Account(mns.endpoint, DEFAULT_ACCESS_KEY_ID, DEFAULT_ACCESS_KEY_SECRET)

What is emulated: queue create/delete/attributes/list; send and batch send with
delay and priority; receive and batch receive (up to 16) with long polling;
peek and batch peek; ChangeMessageVisibility with receipt-handle rotation;
delete and batch delete with per-handle errors; visibility expiry and
redelivery (new handle, DequeueCount + 1); message retention; DequeueCount,
EnqueueTime, FirstDequeueTime, NextVisibleTime, MessageBodyMD5, Priority and
user/system properties; MNS error codes and HTTP statuses.

Receipt handles follow the documented rule that a handle expires at the
message's NextVisibleTime: once a message's visibility lapses, its handle gets
``MessageNotExist`` even if nobody has received the message again.

Ordered (FIFO) queues: created through the control-plane OpenAPI
(``2022-01-19``, ``CreateQueue`` with ``QueueType=fifo``, served on the same
port, see :mod:`.openapi`); ``MessageGroupId`` on send and receive; the group
lock (a group's next message only after its head is deleted or visible again);
``FifoMissingMessageGroupId``. See :mod:`.store` for the rules and the choices
made where Alibaba's documentation is silent.

What is not emulated: topics and subscriptions, account attributes,
dead-letter policies, logging, QPS limits, STS
tokens, request-date skew (``TimeExpired``), durability (state is lost on
exit). Module docstrings of :mod:`.server` and :mod:`.store` list the smaller
choices made where MNS's documentation is silent.
"""

from .errors import MnsError
from .server import DEFAULT_ACCESS_KEY_ID, DEFAULT_ACCESS_KEY_SECRET, MnsEmulator, serve
from .store import MnsStore

__all__ = [
    "DEFAULT_ACCESS_KEY_ID",
    "DEFAULT_ACCESS_KEY_SECRET",
    "MnsEmulator",
    "MnsError",
    "MnsStore",
    "serve",
]
