"""FiloPy: a FiloDB-style time-series ingestion cluster on Kafka, Ray and Cassandra."""

from core.dataset import Dataset, DatasetRef
from core.hashing import (
    ingestion_shard,
    partition_key_hash,
    query_shards,
    shard_for_series,
    shard_key_hash,
    shards_for_query,
)
from core.mapper import ShardEventError, ShardMapper
from core.shard_status import (
    Active,
    Assigned,
    CurrentShardSnapshot,
    Degraded,
    Down,
    Error,
    Handoff,
    IngestionDegraded,
    IngestionError,
    IngestionStarted,
    IngestionStopped,
    Recovery,
    RecoveryInProgress,
    ShardAssignmentStarted,
    ShardDown,
    ShardDrained,
    ShardEvent,
    ShardHandoffStarted,
    ShardMapState,
    ShardStatus,
    Stopped,
    Unassigned,
)

__all__ = [
    "Active",
    "Assigned",
    "CurrentShardSnapshot",
    "Dataset",
    "DatasetRef",
    "Degraded",
    "Down",
    "Error",
    "Handoff",
    "IngestionDegraded",
    "IngestionError",
    "IngestionStarted",
    "IngestionStopped",
    "Recovery",
    "RecoveryInProgress",
    "ShardAssignmentStarted",
    "ShardDown",
    "ShardDrained",
    "ShardEvent",
    "ShardEventError",
    "ShardHandoffStarted",
    "ShardMapState",
    "ShardMapper",
    "ShardStatus",
    "Stopped",
    "Unassigned",
    "ingestion_shard",
    "partition_key_hash",
    "query_shards",
    "shard_for_series",
    "shard_key_hash",
    "shards_for_query",
]


def __getattr__(name: str) -> object:
    # `filopy.connect` brings in Ray, `filopy.load_settings` pydantic-settings and the config
    # files; importing `filopy` for hashing or mappers must not.
    if name == "connect":
        from coordinator.client import connect

        return connect
    if name == "load_settings":
        from core.config import load_settings

        return load_settings
    raise AttributeError(f"module 'filopy' has no attribute {name!r}")
