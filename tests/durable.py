"""What the store holds durably, read as a new owner of a shard would recover it.

Flushes write complete chunks and keep the rest of each flush group's open buffers in a snapshot
beside the checkpoint (docs/memstore.md), so "everything is stored" means chunks plus snapshots:
tests read both through the real recovery path instead of the chunks table alone.
"""

from __future__ import annotations

import numpy as np

from core.dataset import Dataset
from ingest.flush import recover_shard
from ingest.memstore import ShardMemstore
from ingest.shard_reader import read_merged
from store import ColumnStore, MetaStore


def durable_series(
    meta: MetaStore, column: ColumnStore, dataset: Dataset, shard: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every series of the shard with its samples in the ColumnStore's chunks and the
    checkpoints' open-buffer snapshots, concatenated as stored (nothing de-duplicated)."""
    mem = ShardMemstore(dataset, shard)
    recover_shard(mem, meta, column, dataset.ref, shard, end_offset=0)
    return {
        mem.part_key(sid): read_merged(mem, column, dataset.ref, shard, sid)
        for sid in range(mem.num_series)
    }
