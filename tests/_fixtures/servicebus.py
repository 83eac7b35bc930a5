"""The ``servicebus_server`` fixture: leasekit's Service Bus emulator as a subprocess.

Session-scoped and lazy: the emulator starts on two free loopback ports (AMQP, and
HTTP for management) the first time a test asks for it and stops (SIGTERM) at the
end of the session. Queues are not created on first use, so a name nobody created
is a missing entity; tests get fresh queues from
:meth:`ServiceBusEmulatorServer.create_queue`, which calls the real
``ServiceBusAdministrationClient`` on the emulator's management port.
"""

from __future__ import annotations

import datetime
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
#: A queue declared with RequiresDuplicateDetection: the emulator refuses links to it.
DECLARED_DEDUP_QUEUE = "declared-duplicate-detection"

#: Keyword properties of create_queue given in seconds (the admin client takes timedeltas).
_DURATIONS = {"lock_duration", "default_message_time_to_live"}


@dataclass
class ServiceBusEmulatorServer:
    """A running emulator.

    ``connection_string`` is what ``ServiceBusClient.from_connection_string`` takes;
    ``http_port`` is the management port (the driver's ``admin_port``).
    """

    host: str
    port: int
    http_port: int
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

        Keyword properties are ``ServiceBusAdministrationClient.create_queue``'s
        (``lock_duration``, ``max_delivery_count``, ``default_message_time_to_live``,
        ``dead_lettering_on_message_expiration``, ``requires_session``...); durations
        may be given in seconds.
        """
        name = name or self.queue_name()
        options = {
            key: datetime.timedelta(seconds=value)
            if key in _DURATIONS and isinstance(value, int | float)
            else value
            for key, value in properties.items()
        }
        with self.admin_client() as admin:
            admin.create_queue(name, **options)
        return name

    def delete_queue(self, name: str) -> None:
        """Delete a queue and its messages."""
        with self.admin_client() as admin:
            admin.delete_queue(name)

    def admin_client(self) -> Any:
        """The real ``ServiceBusAdministrationClient``, on the management port."""
        from leasekit.emulators.servicebus import admin_client

        return admin_client(self.host, self.http_port)


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
                        },
                        {
                            "Name": DECLARED_DEDUP_QUEUE,
                            "Properties": {"RequiresDuplicateDetection": True},
                        },
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
    http_port = free_port()
    argv = python_module(
        "leasekit.emulators.servicebus",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--http-port",
        str(http_port),
        "--config",
        str(path),
        "--log-level",
        "WARNING",
    )
    with ServerProcess(argv, port, name="servicebus-emulator") as process:
        yield ServiceBusEmulatorServer(LOOPBACK, port, http_port, process)
