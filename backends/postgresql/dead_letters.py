"""A queue's dead letters as a driver (its lease in the row), for re-driving."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from leasekit import dead_letter_format as marks
from leasekit.spi import (
    DriverError,
    ErrorCode,
    OutgoingMessage,
    RawMessage,
    Visibility,
)

from .driver import PostgresqlDriver
from .receipts import _joined, _lost, _props
from .statements import _ABANDON_DEAD, _DELETE_DEAD, _RECEIVE_DEAD, _RENEW_DEAD


class PostgresqlDeadLetters(PostgresqlDriver):
    """The dead letters of one PostgreSQL queue, as a driver: receive leases, delete removes.

    What :meth:`PostgresqlDriver.dead_letter_store` returns. A dead letter's
    lease lives in its row (``visible_at``, ``token``: schema version 3), so a
    re-drive in another process or on another machine never takes the same
    one, and a stale receipt settles nothing. It shares the queue's pool:
    closing it leaves the pool to the queue. Sending is refused.
    """

    def __repr__(self) -> str:
        return f"<PostgresqlDeadLetters {self._where} schema={self.schema!r} queue={self.queue!r}>"

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Refused: dead letters come from dead-lettering."""
        error = DriverError(ErrorCode.UNSUPPORTED, "postgresql: cannot send to a dead-letter store")
        return [error for _ in messages]

    def receive(self, max_messages: int, visibility: float, wait: float) -> list[RawMessage]:
        """Lease up to ``max_messages`` free dead letters, oldest first, in one statement."""
        params = {"queue": self.queue, "limit": max_messages, "seconds": float(visibility)}
        with self._connection() as conn:
            rows = conn.execute(self._q("receive_dead", _RECEIVE_DEAD), params).fetchall()
            if not rows:
                self._check_exists(conn)
                return []
        rows.sort(key=lambda row: row[0])
        return [
            RawMessage(
                id=message_id,
                body=bytes(body),
                receipt=receipt,
                delivery_count=1,
                enqueued_at=dead_lettered_at,
                visible_until=until,
                properties=marks.marked(
                    _props(props), id=message_id, reason=reason, delivery_count=count
                ),
                group=group,
            )
            for (
                _,
                message_id,
                body,
                props,
                count,
                reason,
                dead_lettered_at,
                receipt,
                until,
                group,
            ) in rows
        ]

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """Hide each leased dead letter for ``seconds`` from now (its receipt kept)."""
        rows = self._each_dead("renew_dead", _RENEW_DEAD, receipts, {"seconds": float(seconds)})
        until = dict(rows)
        return [
            Visibility(r, until[r]) if r in until else _lost(f"dead-letter receipt {r!r} is stale")
            for r in receipts
        ]

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """Remove the leased dead letters whose tokens match, in one statement."""
        done = {row[0] for row in self._each_dead("delete_dead", _DELETE_DEAD, receipts, {})}
        return _settled_dead(receipts, done)

    def abandon(self, receipts: Sequence[str], delay: float) -> list[BaseException | None]:
        """Give the leased dead letters back (visible after ``delay``); their receipts stop."""
        params = {"delay": float(delay)}
        done = {row[0] for row in self._each_dead("abandon_dead", _ABANDON_DEAD, receipts, params)}
        return _settled_dead(receipts, done)

    def _each_dead(
        self, name: str, text: str, receipts: Sequence[str], extra: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        """Run one fenced statement over the well-formed receipts; the rows it returned."""
        if not receipts:
            return []
        joined, _ = _joined(receipts)
        rows: list[tuple[Any, ...]] = []
        with self._connection() as conn:
            if joined:
                params = {"queue": self.queue, "receipts": joined, **extra}
                rows = conn.execute(self._q(name, text), params).fetchall()
            if len(rows) < len(receipts):
                self._check_exists(conn)
        return rows

    def dead_letter(self, receipt: str, reason: str, message: RawMessage) -> None:
        """Refused: a dead letter is dead-lettered already."""
        raise NotImplementedError("a dead-letter store cannot dead-letter")

    def dead_letter_store(self) -> PostgresqlDeadLetters:
        """Refused: a dead-letter store has no dead letters of its own."""
        raise NotImplementedError("a dead-letter store has no dead-letter store")

    def close(self) -> None:
        """Nothing: the pool is the queue's, closed with it."""


def _settled_dead(receipts: Sequence[str], done: set[str]) -> list[BaseException | None]:
    return [None if r in done else _lost(f"dead-letter receipt {r!r} is stale") for r in receipts]


PostgresqlDriver.dead_letter_driver = PostgresqlDeadLetters
