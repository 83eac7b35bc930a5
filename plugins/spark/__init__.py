"""leasekit on Spark: a leased streaming source, a sink, and consumers as Spark tasks."""
