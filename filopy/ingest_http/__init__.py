"""HTTP ingestion: protocols that users' agents already speak, routed by the dataset's shard key
to Kafka through `ingest.gateway.Gateway`. Needs Kafka and the dataset definitions, not Ray.

`core` is the shared request path (limits, decompression, writing, answers, metrics); each
protocol module negotiates its content types and shapes its answers; the bodies are decoded by
`ingest.wire`, whose `Invalid` is answered 400. See docs/ingestion-http.md.
"""

from filopy.ingest_http.app import create_gateway_app, ingest_router, serve_ingestion
from filopy.ingest_http.core import Ingestion

__all__ = ["Ingestion", "create_gateway_app", "ingest_router", "serve_ingestion"]
