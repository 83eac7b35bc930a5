"""The ``servicebus_server`` fixture: leasekit's Service Bus emulator as a subprocess.

Session-scoped and lazy: the emulator starts on a free loopback port the first time
a test asks for it and stops (SIGTERM) at the end of the session. Queues are not
created on first use here, so a name nobody created is a missing entity; tests get
fresh queues from :meth:`ServiceBusEmulatorServer.create_queue`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from leasekit.emulators._process import LOOPBACK, ServerProcess, free_port, python_module

#: A queue declared in the emulator's config file (LockDuration 1 s, MaxDeliveryCount 2).
DECLARED_QUEUE = "declared-short-lock"
#: A topic declared in the config file: the emulator refuses links to it (no topics).
DECLARED_TOPIC = "declared-topic"

_PROPERTY_NAMES = {
    "lock_duration": "LockDuration",
    "max_delivery_count": "MaxDeliveryCount",
    "default_ttl": "DefaultMessageTimeToLive",
    "dead_lettering_on_message_expiration": "DeadLetteringOnMessageExpiration",
}


@dataclass
class ServiceBusEmulatorServer:
    """A running emulator.

    ``connection_string`` is what ``ServiceBusClient.from_connection_string`` takes.
    """

    host: str
    port: int
    process: ServerProcess

    @property
    def connection_string(self) -> str:
        from leasekit.emulators.servicebus import connection_string

        return connection_string(self.host, self.port)

    def queue_name(self, prefix: str = "q") -> str:
        """A fresh, unused queue name (not created)."""
        return f"{prefix}-{uuid.uuid4().hex[:12]}"

    def create_queue(self, name: str | None = None, **properties: Any) -> str:
        """Create a queue (fresh name unless given) and return its name.

        Keyword properties: ``lock_duration`` (seconds or ISO 8601), ``max_delivery_count``,
        ``default_ttl`` (seconds or ISO 8601), ``dead_lettering_on_message_expiration``;
        Config.json names (``LockDuration``...) are accepted too.
        """
        from leasekit.emulators.servicebus.admin import create_queue

        name = name or self.queue_name()
        config = {_PROPERTY_NAMES.get(key, key): value for key, value in properties.items()}
        create_queue(self.host, self.port, name, config)
        return name

    def delete_queue(self, name: str) -> None:
        """Delete a queue and its messages."""
        from leasekit.emulators.servicebus.admin import delete_queue

        delete_queue(self.host, self.port, name)


@pytest.fixture(scope="session")
def servicebus_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServiceBusEmulatorServer]:
    pytest.importorskip("proton", reason="the Service Bus emulator needs python-qpid-proton")
    config: dict[str, Any] = {
        "UserConfig": {
            "Namespaces": [
                {
                    "Name": "sbemulatorns",
                    "Queues": [
                        {
                            "Name": DECLARED_QUEUE,
                            "Properties": {"LockDuration": "PT1S", "MaxDeliveryCount": 2},
                        }
                    ],
                    "Topics": [{"Name": DECLARED_TOPIC, "Subscriptions": []}],
                }
            ]
        },
        "Emulator": {"AutoCreateQueues": False},
    }
    path = Path(tmp_path_factory.mktemp("servicebus")) / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    port = free_port()
    argv = python_module(
        "leasekit.emulators.servicebus",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--config",
        str(path),
        "--log-level",
        "WARNING",
    )
    with ServerProcess(argv, port, name="servicebus-emulator") as process:
        yield ServiceBusEmulatorServer(LOOPBACK, port, process)
