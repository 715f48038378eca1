"""HTTP ingestion: protocols that users' agents already speak, routed by the dataset's shard key
to Kafka through `ingest.gateway.Gateway`. Needs Kafka and the dataset definitions, not Ray.

So far: Prometheus remote write 1.0 (`remote_write`). See docs/ingestion-http.md.
"""

from filopy.ingest_http.remote_write import RemoteWriteSettings, remote_write_router

__all__ = ["RemoteWriteSettings", "remote_write_router"]
