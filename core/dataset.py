"""Dataset definitions: what `SetupDataset` registers and every node must agree on.

A dataset fixes its shard count, how many nodes it is spread over, which labels form the shard
key, how widely each shard key is spread, and where its samples come from. The definition is
immutable once created: changing the shard count would re-route every series.

Numbers are strict: `"8"`, `true` or `8.0` where a count is expected is refused, naming the field,
rather than coerced (REST bodies are validated by these models).
"""

from __future__ import annotations

import functools
import re
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from core.errors import Invalid

DEFAULT_SHARD_KEY_COLUMNS: tuple[str, ...] = ("_ws_", "_ns_", "_metric_")
METRIC_COLUMN = "_metric_"
# A definition's Kafka when it names none and no cluster filled in its own (used standalone).
DEFAULT_BOOTSTRAP_SERVERS = "127.0.0.1:9092"
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,127}$")


def _check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise ValueError(
            f"invalid dataset name {name!r}: use 1-128 characters, a letter first, then letters, "
            "digits, '_' or '-'"
        )
    return name


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DatasetRef(_Frozen):
    """A dataset's identity: the key for its shard map, subscriptions and stored state."""

    name: str

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        return _check_name(v)

    def __str__(self) -> str:
        return self.name

    # A ref is a dict key on every query part's path (maps, ingesters by (ref, shard)), and a
    # pydantic model compares and hashes field by field in Python: the one instance per name
    # (`of`, what `Dataset.ref` and unpickling give) compares by identity first, and two
    # refs otherwise by name alone.
    @staticmethod
    def of(name: str) -> DatasetRef:
        """The ref of `name`, validated once and shared by this process."""
        return _ref_of(name)

    def __reduce__(self) -> tuple[Any, ...]:
        return _ref_of, (self.name,)

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if isinstance(other, DatasetRef):
            return self.name == other.name
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)


@functools.lru_cache(maxsize=4096)
def _ref_of(name: str) -> DatasetRef:
    return DatasetRef(name=name)


class RecordFormat(StrEnum):
    """How samples are encoded in the dataset's Kafka messages."""

    BINARY = "filopy-binary"  # FiloPy's compact batch format, written by the gateway
    INFLUX = "influx-line"  # Influx line protocol text, for Telegraf, kcat and friends


class SourceSettings(_Frozen):
    """The Kafka topic a dataset ingests from: one partition per shard."""

    topic: str | None = Field(
        default=None, description="Kafka topic; defaults to 'filopy-<dataset name>'."
    )
    bootstrap_servers: str = Field(
        default=DEFAULT_BOOTSTRAP_SERVERS,
        description="Kafka bootstrap servers. Left out: the cluster's kafka.bootstrap_servers, "
        "filled in when the dataset is created (SetupDataset), so the stored definition names "
        "the broker it really uses.",
    )
    record_format: RecordFormat = RecordFormat.BINARY

    @property
    def bootstrap_given(self) -> bool:
        """Whether the definition names its Kafka, rather than leaving it to the cluster."""
        return "bootstrap_servers" in self.model_fields_set


class SpreadOverride(_Frozen):
    """A spread for one exact shard key: every non-metric shard key column must be given."""

    shard_key: dict[str, str]
    spread: Annotated[int, Field(ge=0, strict=True)]


class SpreadSettings(_Frozen):
    """How many shards (2**spread) each shard key's series are spread over."""

    default: Annotated[int, Field(ge=0, strict=True)] = 1
    overrides: tuple[SpreadOverride, ...] = ()


class StoreOptions(_Frozen):
    """How the dataset's shards are kept in memory and flushed; unset: the node's `[ingest]`
    setting of the same name. Part of the definition, so every node treats the dataset alike and
    a restart never reads checkpoints written under another flush-group layout."""

    groups_per_shard: Annotated[int, Field(ge=1, le=1024, strict=True)] | None = Field(
        default=None, description="Flush groups per shard (checkpoints are per group)."
    )
    flush_interval_s: Annotated[float, Field(gt=0, le=86400, strict=True)] | None = Field(
        default=None,
        description="Every group flushes once per interval: the most a restart replays.",
    )
    max_chunk_samples: Annotated[int, Field(ge=2, le=100_000, strict=True)] | None = Field(
        default=None, description="At most this many samples of one series per chunk."
    )
    chunk_span_ms: Annotated[int, Field(ge=1, strict=True)] | None = Field(
        default=None,
        description="Chunks never cross a bucket of this many ms; at most the cluster's "
        "store.max_chunk_span_ms (checked at SetupDataset).",
    )
    memory_retention_ms: Annotated[int, Field(ge=0, strict=True)] | None = Field(
        default=None, description="Samples newer than this stay in memory for queries."
    )

    def overrides(self) -> dict[str, int | float]:
        """The options set, by `[ingest]` setting name."""
        return self.model_dump(exclude_none=True)


# The cluster-wide ceiling of `LabelLimits.max_series_key_bytes`, safe on both stores: Cassandra
# refuses keys over 65535 bytes (and its driver cannot even pack one), and the chunks' partition
# key is the series key plus the dataset name (at most 128 bytes) and the shard, each framed.
MAX_SERIES_KEY_BYTES = 60_000
MAX_LABELS_PER_SERIES = 1024


class LabelLimits(_Frozen):
    """What one series may carry: part of the dataset's contract, enforced where records are
    decoded (a series over a limit is a counted bad record, never stored) and by the gateway.
    Sizes are UTF-8 bytes; the defaults are far above real label sets and keep both stores safe."""

    max_label_name_bytes: StrictInt = Field(
        default=256,
        ge=1,
        le=MAX_SERIES_KEY_BYTES,
        description="Longest label name (bad record: label_name_too_long).",
    )
    max_label_value_bytes: StrictInt = Field(
        default=16_384,
        ge=1,
        le=MAX_SERIES_KEY_BYTES,
        description="Longest label value (bad record: label_too_long).",
    )
    max_labels_per_series: StrictInt = Field(
        default=64,
        ge=1,
        le=MAX_LABELS_PER_SERIES,
        description="Most labels on one series, the metric name included (too_many_labels).",
    )
    max_series_key_bytes: StrictInt = Field(
        default=32_768,
        ge=64,
        le=MAX_SERIES_KEY_BYTES,
        description="Largest stored series key: the compact JSON of the labels, sorted, without "
        f"empty values (series_key_too_long); at most {MAX_SERIES_KEY_BYTES}, which Cassandra's "
        "64 KB key limit leaves room for.",
    )


class DatasetInvalid(Invalid):
    """A definition that is valid on its own but not on this cluster (e.g. chunk span)."""


class Dataset(_Frozen):
    """A dataset definition, validated so that a bad one never reaches the shard manager."""

    name: str = Field(
        description="Letters, digits, '_' and '-', a letter first, at most 128 characters.",
        json_schema_extra={"pattern": _NAME_RE.pattern},
    )
    num_shards: Annotated[int, Field(ge=1, le=1 << 16, strict=True)] = Field(
        description="A power of two (one Kafka partition per shard); fixed once created.",
        json_schema_extra={"enum": [1 << i for i in range(17)]},
    )
    min_num_nodes: Annotated[int, Field(ge=1, strict=True)] = 1
    shard_key_columns: tuple[str, ...] = DEFAULT_SHARD_KEY_COLUMNS
    metric_column: str = METRIC_COLUMN
    spread: SpreadSettings = SpreadSettings()
    source: SourceSettings = SourceSettings()
    store: StoreOptions = StoreOptions()
    limits: LabelLimits = LabelLimits()

    @field_validator("name")
    @classmethod
    def _valid_name(cls, v: str) -> str:
        return _check_name(v)

    @field_validator("num_shards")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"num_shards must be a power of two, got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        cols = self.shard_key_columns
        if len(set(cols)) != len(cols) or not all(cols):
            raise ValueError(f"shard_key_columns must be distinct, non-empty names: {list(cols)}")
        if self.metric_column not in cols:
            raise ValueError(
                f"shard_key_columns {list(cols)} must include the metric column "
                f"{self.metric_column!r}"
            )
        max_spread = self.num_shards.bit_length() - 1
        spreads = [("spread.default", self.spread.default)] + [
            (f"spread.overrides[{i}]", o.spread) for i, o in enumerate(self.spread.overrides)
        ]
        for where, s in spreads:
            if s > max_spread:
                raise ValueError(
                    f"{where} is {s}, but with {self.num_shards} shards spread must be "
                    f"between 0 and {max_spread}"
                )
        wanted = set(self.non_metric_shard_columns)
        seen: set[tuple[tuple[str, str], ...]] = set()
        for i, o in enumerate(self.spread.overrides):
            if set(o.shard_key) != wanted:
                raise ValueError(
                    f"spread.overrides[{i}].shard_key must name exactly the non-metric shard key "
                    f"columns {sorted(wanted)}, got {sorted(o.shard_key)}"
                )
            key = tuple(sorted(o.shard_key.items()))
            if key in seen:
                raise ValueError(f"spread.overrides[{i}] repeats shard key {dict(key)}")
            seen.add(key)
        return self

    @property
    def ref(self) -> DatasetRef:
        return _ref_of(self.name)

    @property
    def topic(self) -> str:
        return self.source.topic or f"filopy-{self.name}"

    @property
    def non_metric_shard_columns(self) -> tuple[str, ...]:
        """Non-metric shard key columns in the order their values are hashed (by name)."""
        return tuple(sorted(c for c in self.shard_key_columns if c != self.metric_column))

    def spread_for(self, labels: dict[str, str]) -> int:
        """The spread for a series or query: an exact-match override, else the default."""
        for o in self.spread.overrides:
            if all(labels.get(c) == v for c, v in o.shard_key.items()):
                return o.spread
        return self.spread.default

    def with_cluster_kafka(self, bootstrap_servers: str) -> Dataset:
        """This definition as a cluster whose Kafka is `bootstrap_servers` holds it: a definition
        that names no bootstrap servers gets the cluster's; one that names its own keeps them."""
        if self.source.bootstrap_given:
            return self
        source = self.source.model_copy(update={"bootstrap_servers": bootstrap_servers})
        return self.model_copy(update={"source": source})

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> Dataset:
        return cls.model_validate_json(text)
