"""Receipts (``seq.token``) and property columns as the driver reads and writes them."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from leasekit.spi import (
    DriverError,
    ErrorCode,
)

#: Largest body: PostgreSQL's limit on one field (1 GB), less a margin.
MAX_FIELD = 1_000_000_000


def _lost(what: str) -> DriverError:
    return DriverError(ErrorCode.LEASE_LOST, what, backend_code="LeaseLost")


#: One well-formed receipt (ASCII digits only: ``str.isdigit`` would let ``"²"`` by).
_RECEIPT = re.compile(r"[0-9]{1,18}\.[0-9]{1,18}")
#: A comma-joined list of well-formed receipts, checked in one match.
_RECEIPTS = re.compile(r"[0-9]{1,18}\.[0-9]{1,18}(?:,[0-9]{1,18}\.[0-9]{1,18})*")


def _receipt(receipt: str) -> tuple[int, int] | None:
    """``(seq, token)`` from ``"seq.token"``; ``None`` if malformed (it reads as stale)."""
    if not isinstance(receipt, str) or _RECEIPT.fullmatch(receipt) is None:
        return None
    head, _, tail = receipt.partition(".")
    return int(head), int(tail)


def _joined(receipts: Sequence[str]) -> tuple[str, bool]:
    """The well-formed receipts as one ``"seq.token,..."`` text, and whether all were.

    One join and one regular-expression match for a whole batch (and a count of
    its commas: one receipt holding a comma, ``"1.2,3.4"``, would otherwise
    pass as two); only a batch holding a malformed receipt is checked one by one.
    """
    try:
        text = ",".join(receipts)
    except TypeError:
        text = ""
    else:
        if text.count(",") == len(receipts) - 1 and _RECEIPTS.fullmatch(text) is not None:
            return text, True
    return ",".join(r for r in receipts if _receipt(r) is not None), False


def _props(value: Any) -> dict[str, str]:
    if not value:
        return {}
    loaded = json.loads(value) if isinstance(value, str) else value
    return {str(k): str(v) for k, v in dict(loaded).items()}
