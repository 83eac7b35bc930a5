"""The sink: ``df.write.format("leasekit")`` and ``writeStream`` send rows to a queue.

Each Spark task opens the queue on its executor and sends its rows with
:meth:`Queue.send_many` (in the backend's batch size). The column ``body``
(BINARY, or STRING sent as UTF-8) is the message body; an optional column
``properties`` (``MAP<STRING, STRING>``) becomes the message properties. Other
columns are ignored.

Delivery: **at least once, not atomic.** A queue has no transaction to roll
back: every row a task sent before it failed stays sent. A failed job (or a
failed streaming micro-batch) may have sent *part* of its rows, and Spark's
retry of the task or batch sends them again, so consumers must be idempotent
— give rows a key in ``properties`` or in the body if the message id (new per
send) is not enough. ``abort`` only logs how many rows the finished tasks
sent; it cannot take them back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from leasekit.errors import InvalidArgument

from ._options import QueueOptions

__all__ = ["LeasekitStreamWriter", "LeasekitWriter", "SentRows"]

_log = logging.getLogger("leasekit.spark")

#: Rows gathered before one ``send_many`` call: big enough to fill the backend's
#: send batches, small enough that a failing task has sent little it cannot undo.
SEND_CHUNK = 500


@dataclass
class SentRows(WriterCommitMessage):
    """What one task sent."""

    partition: int
    rows: int


class _Sender:
    """Schema checks (driver side) and the per-task send loop (executor side)."""

    def __init__(self, schema: StructType, options: Mapping[str, str], overwrite: bool) -> None:
        if overwrite:
            raise InvalidArgument(
                "a queue cannot be overwritten: write to it with mode 'append' (the default "
                "for writeStream)"
            )
        self.queue_options = QueueOptions(options)
        names = schema.fieldNames()
        if "body" not in names:
            raise InvalidArgument(
                f"the leasekit sink sends the column 'body' (BINARY or STRING); the DataFrame "
                f"has {names}"
            )
        body_type = schema["body"].dataType
        if not isinstance(body_type, BinaryType | StringType):
            raise InvalidArgument(f"column 'body' must be BINARY or STRING, got {body_type}")
        self.body_index = names.index("body")
        self.properties_index: int | None = None
        if "properties" in names:
            prop_type = schema["properties"].dataType
            if not (
                isinstance(prop_type, MapType)
                and isinstance(prop_type.keyType, StringType)
                and isinstance(prop_type.valueType, StringType)
            ):
                raise InvalidArgument(
                    f"column 'properties' must be MAP<STRING, STRING>, got {prop_type}"
                )
            self.properties_index = names.index("properties")

    def send(self, rows: Iterator[Any]) -> SentRows:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        sent = 0
        queue = self.queue_options.open()
        try:
            chunk: list[tuple[bytes, dict[str, str]]] = []
            for row in rows:
                chunk.append(self._message(row))
                if len(chunk) >= SEND_CHUNK:
                    sent += self._flush(queue, chunk)
            sent += self._flush(queue, chunk)
        finally:
            queue.close()
        return SentRows(partition, sent)

    def _message(self, row: Any) -> tuple[bytes, dict[str, str]]:
        body = row[self.body_index]
        if body is None:
            raise InvalidArgument("the leasekit sink cannot send a row whose body is null")
        if isinstance(body, str):
            body = body.encode("utf-8")
        properties: dict[str, str] = {}
        if self.properties_index is not None:
            raw = row[self.properties_index]
            if raw:
                properties = {str(k): str(v) for k, v in raw.items() if v is not None}
        return bytes(body), properties

    @staticmethod
    def _flush(queue: Any, chunk: list[tuple[bytes, dict[str, str]]]) -> int:
        if not chunk:
            return 0
        count = 0
        if all(not props for _, props in chunk):
            count = len(queue.send_many([body for body, _ in chunk]))
        else:
            # send_many takes one property map for all; group runs of equal maps.
            start = 0
            while start < len(chunk):
                end = start + 1
                while end < len(chunk) and chunk[end][1] == chunk[start][1]:
                    end += 1
                bodies = [body for body, _ in chunk[start:end]]
                count += len(queue.send_many(bodies, properties=chunk[start][1] or None))
                start = end
        chunk.clear()
        return count


def _total(messages: list[Any]) -> int:
    return sum(m.rows for m in messages if isinstance(m, SentRows))


class LeasekitWriter(DataSourceWriter):
    """The batch writer behind ``df.write.format("leasekit")``."""

    def __init__(self, schema: StructType, options: Mapping[str, str], overwrite: bool) -> None:
        self._sender = _Sender(schema, options, overwrite)

    def write(self, iterator: Iterator[Any]) -> SentRows:
        """Send this task's rows (executor side)."""
        return self._sender.send(iterator)

    def commit(self, messages: list[Any]) -> None:
        """Every task finished: nothing to do but count."""
        _log.info("leasekit sink sent %d rows", _total(messages))

    def abort(self, messages: list[Any]) -> None:
        """A task failed: the rows finished tasks sent stay sent (at least once)."""
        _log.warning(
            "leasekit sink job failed; %d rows from finished tasks were sent and stay in the "
            "queue (plus any rows the failed tasks sent before failing)",
            _total(messages),
        )


class LeasekitStreamWriter(DataSourceStreamWriter):
    """The streaming writer behind ``df.writeStream.format("leasekit")``."""

    def __init__(self, schema: StructType, options: Mapping[str, str], overwrite: bool) -> None:
        self._sender = _Sender(schema, options, overwrite)

    def write(self, iterator: Iterator[Any]) -> SentRows:
        """Send this task's rows (executor side)."""
        return self._sender.send(iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        """The micro-batch's tasks all finished."""
        _log.info("leasekit sink sent %d rows in batch %d", _total(messages), batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        """The micro-batch failed; its sent rows stay sent and a retry sends them again."""
        _log.warning(
            "leasekit sink batch %d failed; %d rows from finished tasks stay in the queue and "
            "the retried batch sends them again",
            batchId,
            _total(messages),
        )
