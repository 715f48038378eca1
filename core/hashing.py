"""Shard routing, bit-compatible with FiloDB so the same labels land on the same shard number.

FiloDB hashes with XXHash32 (seed ``0x9747b28c``) over UTF-8 bytes and combines hashes like
Java's ``31 * h + x`` on a signed 32-bit int, starting at 7. The shard key hash (non-metric
shard key values in column-name order, then the metric) picks a shard *group*; the partition key
hash (every tag but the metric and ``le``) picks the shard inside that group. ``spread`` says how
many bits of the shard number come from the partition hash, i.e. how many shards (``2**spread``)
one shard key's series are spread over.

Hashes are returned as signed 32-bit ints, exactly as FiloDB's JVM code sees them; the shard
functions accept either signed or unsigned forms since only the low bits matter.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import xxhash

from core.dataset import DEFAULT_SHARD_KEY_COLUMNS, METRIC_COLUMN, Dataset

HASH_SEED = 0x9747B28C
HASH_INIT = 7
PROMETHEUS_METRIC_LABEL = "__name__"
# A histogram/summary exposes name_bucket, name_count and name_sum; strip them so all of a
# metric's series share a shard (FiloDB: DatasetOptions.ignoreShardKeyColumnSuffixes).
METRIC_SUFFIXES: tuple[str, ...] = ("_bucket", "_count", "_sum")
# Histogram bucket bounds are not part of a series' identity for placement
# (FiloDB: DatasetOptions.ignoreTagsOnPartitionKeyHash).
PARTITION_HASH_IGNORED_TAGS: frozenset[str] = frozenset({"le"})

_DEFAULT_NON_METRIC_COLUMNS = tuple(
    sorted(c for c in DEFAULT_SHARD_KEY_COLUMNS if c != METRIC_COLUMN)
)


def _int32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - 0x100000000 if x & 0x80000000 else x


def hash32(data: str | bytes) -> int:
    """XXHash32 of the UTF-8 bytes with FiloDB's seed, as a signed 32-bit int."""
    if isinstance(data, str):
        return _hash32_str(data)
    return _int32(xxhash.xxh32_intdigest(data, HASH_SEED))


@functools.lru_cache(maxsize=1 << 16)
def _hash32_str(text: str) -> int:
    """`hash32` of a string, cached: label names and most values repeat across series, so a
    new series mostly hashes strings seen before."""
    return _int32(xxhash.xxh32_intdigest(text.encode("utf-8"), HASH_SEED))


def combine_hash(h1: int, h2: int) -> int:
    """Java's ``31 * h1 + h2`` on ints, wrapping to signed 32 bits."""
    return _int32(31 * h1 + h2)


def strip_metric_suffix(metric: str, suffixes: Sequence[str] = METRIC_SUFFIXES) -> str:
    """Drop the first matching suffix, as FiloDB's ``trimShardColumn`` does."""
    for suffix in suffixes:
        if metric.endswith(suffix):
            return metric[: -len(suffix)]
    return metric


def metric_label(labels: Mapping[str, str], metric_column: str = METRIC_COLUMN) -> str | None:
    """The label holding the metric name: the dataset's column, else Prometheus ``__name__``."""
    if metric_column in labels:
        return metric_column
    if PROMETHEUS_METRIC_LABEL in labels:
        return PROMETHEUS_METRIC_LABEL
    return None


def shard_key_hash_from_values(non_metric_values: Sequence[str], metric: str) -> int:
    """FiloDB's ``RecordBuilder.shardKeyHash``: values in column order, metric already trimmed."""
    h = HASH_INIT
    for value in non_metric_values:
        h = combine_hash(h, hash32(value))
    return combine_hash(h, hash32(metric))


def shard_key_hash(labels: Mapping[str, str], dataset: Dataset | None = None) -> int:
    """Hash of a series' shard key; missing non-metric shard key tags are skipped.

    Raises ``ValueError`` if there is no metric name: such a series cannot be routed.
    """
    if dataset is None:
        columns, metric_column = _DEFAULT_NON_METRIC_COLUMNS, METRIC_COLUMN
    else:
        columns, metric_column = dataset.non_metric_shard_columns, dataset.metric_column
    label = metric_label(labels, metric_column)
    if label is None:
        raise ValueError(
            f"labels have no metric name (neither {metric_column!r} nor "
            f"{PROMETHEUS_METRIC_LABEL!r}): {dict(labels)}"
        )
    values = [labels[c] for c in columns if c in labels]
    return shard_key_hash_from_values(values, strip_metric_suffix(labels[label]))


def _java_order(keys: list[str]) -> list[str]:
    # FiloDB sorts with Java String.compareTo (UTF-16 code units); that differs from Python's
    # code point order only when characters beyond the BMP are involved.
    if all(k.isascii() for k in keys):
        return sorted(keys)
    return sorted(keys, key=lambda k: k.encode("utf-16-be"))


def partition_key_hash(
    labels: Mapping[str, str],
    dataset: Dataset | None = None,
    ignored_tags: frozenset[str] = PARTITION_HASH_IGNORED_TAGS,
) -> int:
    """Hash of a series' identity: all tags but the metric name and ``le``, sorted by key."""
    metric_column = METRIC_COLUMN if dataset is None else dataset.metric_column
    skip = metric_label(labels, metric_column)
    keys = [k for k in labels if k != skip and k not in ignored_tags]
    h = HASH_INIT
    for k in _java_order(keys):
        h = combine_hash(h, combine_hash(hash32(k), hash32(labels[k])))
    return h


def log2_shards(num_shards: int) -> int:
    """``log2(num_shards)``; ``ValueError`` unless ``num_shards`` is a positive power of two."""
    if num_shards < 1 or num_shards & (num_shards - 1):
        raise ValueError(f"num_shards must be a positive power of two, got {num_shards}")
    return num_shards.bit_length() - 1


def check_spread(spread: int, num_shards: int) -> int:
    """Validate a spread against the shard count; returns ``log2(num_shards)``."""
    n = log2_shards(num_shards)
    if not 0 <= spread <= n:
        raise ValueError(
            f"invalid spread {spread}: with {num_shards} shards spread must be between 0 and {n}"
        )
    return n


def ingestion_shard(shard_key_hash: int, partition_hash: int, spread: int, num_shards: int) -> int:
    """The one shard a series is ingested into.

    The low ``n - spread`` bits come from the shard key hash (so a shard key's series stay in
    one group), the upper ``spread`` bits from the partition hash (spreading them over the group).
    """
    n = check_spread(spread, num_shards)
    key_mask = (1 << (n - spread)) - 1
    part_mask = key_mask ^ (num_shards - 1)
    return (shard_key_hash & key_mask) | (partition_hash & part_mask)


def query_shards(shard_key_hash: int, spread: int, num_shards: int) -> list[int]:
    """Every shard that may hold series of this shard key: ``2**spread`` shards, ascending."""
    n = check_spread(spread, num_shards)
    step = 1 << (n - spread)
    return list(range(shard_key_hash & (step - 1), num_shards, step))


def resolve_spread(dataset: Dataset, labels: Mapping[str, str], override: int | None = None) -> int:
    """A per-query override if given, else the dataset's exact-match override, else its default."""
    spread = dataset.spread_for(dict(labels)) if override is None else override
    check_spread(spread, dataset.num_shards)
    return spread


def shard_for_series(
    dataset: Dataset,
    labels: Mapping[str, str],
    spread: int | None = None,
    partition_hash: int | None = None,
) -> int:
    """The ingestion shard of a full series label set (`partition_hash`: its
    `partition_key_hash`, if the caller has it already)."""
    if partition_hash is None:
        partition_hash = partition_key_hash(labels, dataset)
    return ingestion_shard(
        shard_key_hash(labels, dataset),
        partition_hash,
        resolve_spread(dataset, labels, spread),
        dataset.num_shards,
    )


def shards_for_query(
    dataset: Dataset, shard_key: Mapping[str, str], spread: int | None = None
) -> list[int]:
    """The shards a query on one shard key (metric + non-metric shard key tags) must visit."""
    return query_shards(
        shard_key_hash(shard_key, dataset),
        resolve_spread(dataset, shard_key, spread),
        dataset.num_shards,
    )
