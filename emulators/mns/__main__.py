"""Command line: ``python -m leasekit.emulators.mns --port N``.

Options:
    --host ADDRESS            listen address (default 127.0.0.1)
    --port N                  port (default 0: pick a free one and log it)
    --access-key-id ID        accepted AccessKey ID (default $LEASEKIT_MNS_ACCESS_KEY_ID,
                              else "leasekit-mns-emulator")
    --access-key-secret S     its secret (default $LEASEKIT_MNS_ACCESS_KEY_SECRET, else
                              "leasekit-mns-emulator-secret"); prefer the environment
                              variable, which other users cannot see in the process list
    --idle-timeout SECONDS    close a connection idle (or stalled mid-request) this long
                              (default 45; 0 never closes one)
    --log-level LEVEL         DEBUG logs every request (default INFO)

SIGTERM and Ctrl-C stop the server.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from .server import (
    DEFAULT_ACCESS_KEY_ID,
    DEFAULT_ACCESS_KEY_SECRET,
    DEFAULT_IDLE_TIMEOUT,
    MnsEmulator,
    log,
)


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, not {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m leasekit.emulators.mns",
        description="Wire-level Alibaba Cloud MNS queue emulator (in memory).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default %(default)s)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one")
    parser.add_argument(
        "--access-key-id",
        default=os.environ.get("LEASEKIT_MNS_ACCESS_KEY_ID", DEFAULT_ACCESS_KEY_ID),
        help="accepted AccessKey ID (env LEASEKIT_MNS_ACCESS_KEY_ID)",
    )
    parser.add_argument(
        "--access-key-secret",
        default=os.environ.get("LEASEKIT_MNS_ACCESS_KEY_SECRET", DEFAULT_ACCESS_KEY_SECRET),
        help="its secret (env LEASEKIT_MNS_ACCESS_KEY_SECRET, preferred)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=DEFAULT_IDLE_TIMEOUT,
        metavar="SECONDS",
        help="close a connection idle or stalled mid-request this long; 0 never "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="DEBUG logs every request (default %(default)s)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, then serve until SIGTERM or Ctrl-C.

    Returns:
        The process exit status.
    """
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    emulator = MnsEmulator(
        args.host,
        args.port,
        access_key_id=args.access_key_id,
        access_key_secret=args.access_key_secret,
        idle_timeout=args.idle_timeout or None,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Raising from a signal handler is unreliable (the exception can land in a
        # finalizer, where Python drops it); ``shutdown`` blocks until the serving
        # loop has left, so it runs on a thread of its own.
        threading.Thread(target=emulator.shutdown, name="mns-emulator-stop").start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("MNS emulator listening on %s (AccessKeyId %s)", emulator.endpoint, args.access_key_id)
    with contextlib.suppress(KeyboardInterrupt):
        emulator.serve_forever()
    log.info("MNS emulator stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
