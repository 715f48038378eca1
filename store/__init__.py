"""FiloPy's storage layer: MetaStore (datasets, epochs, checkpoints, tokens) and ColumnStore
(part keys, chunks), on SQLite (embedded default) or Cassandra (production). See docs/storage.md."""

from __future__ import annotations

from typing import Any

from core.config import CassandraSettings, Settings, check_readable
from store.api import (
    INT64_MAX,
    INT64_MIN,
    ChunkRecord,
    ColumnStore,
    DatasetConflict,
    LabelMatcher,
    MatchOp,
    MetaStore,
    OwnershipChange,
    PartKeyRecord,
    ShardEpoch,
    StaleEpochError,
    StoredBytes,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
    SweepResult,
    TokenConflict,
    decode_part_key,
    encode_part_key,
)
from store.encoding import decode_chunk, encode_chunk

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "ChunkRecord",
    "ColumnStore",
    "DatasetConflict",
    "LabelMatcher",
    "MatchOp",
    "MetaStore",
    "OwnershipChange",
    "PartKeyRecord",
    "ShardEpoch",
    "StaleEpochError",
    "StoreError",
    "StoreTimeout",
    "StoreUnavailable",
    "StoredBytes",
    "SweepResult",
    "TokenConflict",
    "decode_chunk",
    "decode_part_key",
    "encode_chunk",
    "encode_part_key",
    "open_stores",
    "retention_ms",
]


def retention_ms(days: float) -> int:
    """A retention in days (settings) as the stores' milliseconds; 0 stays 0 (forever)."""
    return round(days * 86_400_000)


def open_stores(settings: Settings) -> tuple[MetaStore, ColumnStore]:
    """The MetaStore and ColumnStore of the configured backend (`store.backend`).

    Both share one connection (or file); close both when done. Raises StoreUnavailable if the
    backend cannot be reached within its connect timeout."""
    meta, column = _open_backend(settings)
    down = settings.downsample
    column.downsample_retention_ms = {r: down.retention_ms(r) for r in down.resolutions_ms}
    return meta, column


def _open_backend(settings: Settings) -> tuple[MetaStore, ColumnStore]:
    store = settings.store
    if store.backend == "sqlite":
        from store.sqlite import open_sqlite_stores

        return open_sqlite_stores(
            store.sqlite_path,
            busy_timeout_s=store.sqlite_busy_timeout_s,
            max_chunk_span_ms=store.max_chunk_span_ms,
            default_retention_ms=retention_ms(store.retention_days),
            bucket_ms=store.sqlite_bucket_ms,
        )
    from store.cassandra import open_cassandra_stores  # imports the driver only if used

    c = settings.cassandra
    return open_cassandra_stores(
        c.contact_points,
        c.port,
        c.keyspace,
        c.replication,
        c.consistency,
        c.connect_timeout_s,
        c.request_timeout_s,
        data_consistency=c.data_consistency or None,
        local_dc=c.local_dc or None,
        max_chunk_span_ms=store.max_chunk_span_ms,
        write_concurrency=c.write_concurrency,
        read_concurrency=c.read_concurrency,
        **cassandra_security(c),
        default_retention_ms=retention_ms(store.retention_days),
    )


def cassandra_security(c: CassandraSettings) -> dict[str, Any]:
    """The driver's `auth_provider` and `ssl_context` from `[cassandra]`: a password login and
    TLS only where set. The password is read here, so a new connection sees a rotated one."""
    out: dict[str, Any] = {}
    if c.username:
        from cassandra.auth import PlainTextAuthProvider

        out["auth_provider"] = PlainTextAuthProvider(c.username, c.secret())
    if c.ssl:
        import ssl

        check_readable(
            **{
                "cassandra.ssl_ca_file": c.ssl_ca_file,
                "cassandra.ssl_cert_file": c.ssl_cert_file,
                "cassandra.ssl_key_file": c.ssl_key_file,
            }
        )
        context = ssl.create_default_context(cafile=c.ssl_ca_file or None)
        context.check_hostname = c.ssl_check_hostname  # the chain is verified either way
        if c.ssl_cert_file:
            context.load_cert_chain(c.ssl_cert_file, c.ssl_key_file)
        out["ssl_context"] = context
    return out
