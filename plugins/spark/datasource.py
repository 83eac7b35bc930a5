"""The ``leasekit`` Python data source: the streaming source and the sinks in one format."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .sink import LeasekitStreamWriter, LeasekitWriter
from .source import LeasekitStreamReader, source_schema

__all__ = ["LeasekitDataSource"]


class LeasekitDataSource(DataSource):
    """Format ``"leasekit"``: ``readStream`` leases messages, ``write``/``writeStream`` send rows.

    Register it once per session with :func:`leasekit.plugins.spark.register`.
    The options are documented on :class:`~leasekit.plugins.spark.source.LeasekitStreamReader`
    (source) and in :mod:`leasekit.plugins.spark.sink`.
    """

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "leasekit"

    def schema(self) -> StructType:
        """The source's rows: id, body, delivery_count, enqueued_at, properties."""
        return source_schema()

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The leased streaming source."""
        return LeasekitStreamReader(schema, self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The batch sink (``df.write.format("leasekit")``)."""
        return LeasekitWriter(schema, self.options, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The streaming sink (``df.writeStream.format("leasekit")``)."""
        return LeasekitStreamWriter(schema, self.options, overwrite)
