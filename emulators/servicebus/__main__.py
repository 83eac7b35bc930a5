"""Command line: ``python -m leasekit.emulators.servicebus --port N --http-port M [--config F]``.

Serves until SIGTERM or SIGINT, then closes the listening socket and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from types import FrameType

from .amqp import ServiceBusEmulator
from .broker import Broker
from .config import load_config


def main(argv: list[str] | None = None) -> int:
    """Run the emulator.

    Parameters:
        argv: command-line arguments (``sys.argv[1:]`` if ``None``).

    Returns:
        The process exit code.
    """
    parser = argparse.ArgumentParser(
        prog="python -m leasekit.emulators.servicebus",
        description="Azure Service Bus emulator (AMQP 1.0) for tests.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=5672, help="AMQP port to listen on")
    parser.add_argument(
        "--http-port",
        type=int,
        default=5300,
        help="port of the management API over HTTP (ServiceBusAdministrationClient), "
        "5300 as on Microsoft's emulator",
    )
    parser.add_argument("--config", help="queues JSON (Microsoft emulator Config.json shape)")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = load_config(args.config)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log = logging.getLogger("leasekit.emulators.servicebus")
    for warning in config.warnings:
        log.warning("config %s: %s", args.config, warning)
    try:
        emulator = ServiceBusEmulator(
            Broker(config), args.host, args.port, http_port=args.http_port
        )
    except OSError as exc:
        print(f"error: cannot listen on HTTP port {args.http_port}: {exc}", file=sys.stderr)
        return 2

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Only set a flag: an exception raised from a signal handler can land
        # inside a finalizer (proton objects have ``__del__``), where Python
        # prints and drops it, and the signal would be lost.
        emulator.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    emulator.run()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
