"""A queue's dead letters as a driver (its lease in the row), for re-driving."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from leasekit import dead_letter_format as marks
from leasekit.clock import to_datetime
from leasekit.spi import (
    DriverError,
    ErrorCode,
    OutgoingMessage,
    RawMessage,
    Visibility,
)

from .driver import SqliteDriver, T, _lost, _seq_of
from .statements import _RECEIVE_DEAD


class SqliteDeadLetters(SqliteDriver):
    """The dead letters of one SQLite queue, as a driver: receive leases, delete removes.

    What :meth:`SqliteDriver.dead_letter_store` returns; the lease lives in the
    dead-letter table's ``visible_at`` and ``receipt`` columns, so a re-drive in
    another process never takes the same dead letter. Sending is refused.
    """

    def __repr__(self) -> str:
        return f"<SqliteDeadLetters {self.path!r} queue={self.queue!r}>"

    def send(self, messages: Sequence[OutgoingMessage]) -> list[str | BaseException]:
        """Refused: dead letters come from dead-lettering."""
        error = DriverError(ErrorCode.UNSUPPORTED, "sqlite: cannot send to a dead-letter store")
        return [error for _ in messages]

    def receive(self, max_messages: int, visibility: float, wait: float) -> list[RawMessage]:
        """Lease up to ``max_messages`` free dead letters, oldest first, in one transaction."""
        with self._lock:
            conn = self._connection()
            now = self._clock.time()
            with self._write(conn):
                self._exists(conn)
                rows = conn.execute(
                    _RECEIVE_DEAD,
                    {
                        "until": now + visibility,
                        "queue": self.queue,
                        "now": now,
                        "limit": max_messages,
                    },
                ).fetchall()
        rows.sort(key=lambda row: row[0])
        until = to_datetime(now + visibility)
        return [
            RawMessage(
                id=message_id,
                body=body,
                receipt=receipt,
                delivery_count=1,
                enqueued_at=to_datetime(dead_lettered_at),
                visible_until=until,
                properties=marks.marked(
                    json.loads(props) if props else {},
                    id=message_id,
                    reason=reason,
                    delivery_count=count,
                ),
                group=group,
            )
            for _, message_id, body, props, count, reason, dead_lettered_at, receipt, group in rows
        ]

    def change_visibility(
        self, receipts: Sequence[str], seconds: float
    ) -> list[Visibility | BaseException]:
        """Hide each leased dead letter for ``seconds`` from now."""
        until = self._clock.time() + seconds
        return self._each_dead(
            receipts,
            "UPDATE leasekit_dead_letters SET visible_at = ? WHERE seq = ? AND receipt = ? "
            "AND queue = ?",
            (until,),
            lambda receipt: Visibility(receipt, to_datetime(until)),
        )

    def abandon(self, receipts: Sequence[str], delay: float) -> list[BaseException | None]:
        """Give the leased dead letters back; their receipts stop working."""
        return self._each_dead(
            receipts,
            "UPDATE leasekit_dead_letters SET visible_at = ?, receipt = NULL WHERE seq = ? "
            "AND receipt = ? AND queue = ?",
            (self._clock.time() + delay,),
            lambda receipt: None,
        )

    def delete(self, receipts: Sequence[str]) -> list[BaseException | None]:
        """Remove the leased dead letters, in one transaction."""
        return self._each_dead(
            receipts,
            "DELETE FROM leasekit_dead_letters WHERE seq = ? AND receipt = ? AND queue = ?",
            (),
            lambda receipt: None,
        )

    def _each_dead(
        self,
        receipts: Sequence[str],
        statement: str,
        first: tuple[float, ...],
        ok: Callable[[str], T],
    ) -> list[T | BaseException]:
        results: list[T | BaseException] = []
        with self._lock:
            conn = self._connection()
            with self._write(conn):
                for receipt in receipts:
                    cursor = conn.execute(
                        statement, (*first, _seq_of(receipt), receipt, self.queue)
                    )
                    if cursor.rowcount == 1:
                        results.append(ok(receipt))
                    else:
                        self._exists(conn)
                        results.append(
                            _lost(f"dead-letter receipt {receipt!r} is stale or it is gone")
                        )
        return results


SqliteDriver.dead_letter_driver = SqliteDeadLetters
