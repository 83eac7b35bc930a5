"""Project-wide test configuration.

Server fixtures (Azurite, moto, the MNS and Service Bus emulators) live one per
module in ``tests/_fixtures/`` and are loaded here as pytest plugins, so every
test folder can ask for them. Each is session-scoped and lazy: a server starts
only when a test that needs it runs, on a free loopback port, and stops at the
end of the session.
"""

from pathlib import Path

pytest_plugins = [
    *sorted(
        f"_fixtures.{path.stem}" for path in (Path(__file__).parent / "_fixtures").glob("[!_]*.py")
    ),
    "_order",  # the order a parallel run takes the tests in (see tests/_order.py)
]
