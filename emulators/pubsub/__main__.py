"""Command line: ``python -m leasekit.emulators.pubsub --port N``.

Options:
    --host ADDRESS        listen address (default 127.0.0.1)
    --port N              port (default 8085, the gcloud emulator's; 0 picks a free one)
    --heartbeat SECONDS   send an empty StreamingPull response after this long idle (default 15)
    --log-level LEVEL     default INFO

SIGTERM and Ctrl-C stop the server.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from .server import DEFAULT_HEARTBEAT, PubSubEmulator, log


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, then serve until SIGTERM or Ctrl-C; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m leasekit.emulators.pubsub",
        description="Wire-level Google Cloud Pub/Sub emulator (gRPC, in memory).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default %(default)s)")
    parser.add_argument("--port", type=int, default=8085, help="port; 0 picks a free one")
    parser.add_argument("--heartbeat", type=float, default=DEFAULT_HEARTBEAT, metavar="SECONDS")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    emulator = PubSubEmulator(args.host, args.port, heartbeat=args.heartbeat).start()
    stopped = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("Pub/Sub emulator listening on %s", emulator.address)
    stopped.wait()
    emulator.stop()
    log.info("Pub/Sub emulator stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
