"""The storage contract: what FiloPy persists, in which shape, and the errors callers act on.

Two stores, one interface each, two backends (SQLite and Cassandra) with identical semantics:

* `MetaStore`: dataset definitions, per-shard ownership epochs and per-(shard, flush group)
  checkpoints. Checkpoint commits are fenced by the epoch: only the shard's current owner can
  advance them. Also the API tokens (`core.auth`), so every HTTP server of the cluster, on any
  host, checks requests against the same tokens and sees a revocation.
* `ColumnStore`: per-shard part keys (a series' labels with its first/last sample time) and encoded
  chunks of samples, written in batches for many series and read back by time range; and per
  flush group, snapshots of the open (not yet sealed) buffers at a checkpoint offset, which make
  the checkpoint cover samples that are not in chunks yet (docs/memstore.md).
* Retention (docs/storage.md, "Retention"): per dataset, raw chunks and the part keys of series
  with no sample left are kept `retention_ms` after their last sample (0: forever). The value is
  a MetaStore record of its own (`set_retention`), apart from the immutable definition, so it can
  change on a live dataset; without one a dataset has the cluster's `store.retention_days`.
  The ColumnStore applies it to every read (nothing older than `now - retention` answers, swept
  or not), to writes (nothing older is written) and frees the space (`sweep`, TTLs).

The public methods here validate their arguments once, for every backend, then call the backend's
`_method`. Times are int64 milliseconds since the epoch; ranges are inclusive at both ends.

Errors, and what the ingester does about them:

* `StaleEpochError`: another node has claimed the shard. Stop ingesting it, drop its in-memory
  state, report the shard as lost. Never retry the commit.
* `StoreUnavailable` (and its subclass `StoreTimeout`): the store could not be reached or did not
  answer in time. Retry with backoff. Every write here is idempotent, so a retry is always safe; a
  timed-out checkpoint commit may or may not have applied, and the retry settles it. (Except
  `put_token`, written once: its retry may meet its own token, see there.)
* `DatasetConflict`: `SetupDataset` named an existing dataset with a different definition; report
  it to the caller. `TokenConflict`: a token's id is taken (ids are random: only a bug or a
  replayed request repeats one).
* Any other `StoreError` (or `ValueError` for bad arguments) is a bug or corruption: fail loudly.

In FiloPy's error tree (`core.errors`) a `StoreError` is `Unavailable` (REST answers 503: the
store failed), while `StaleEpochError`, `DatasetConflict` and `TokenConflict` are `Conflict`s,
not `StoreError`s: the store answered, and the answer is that someone else's state wins.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Any, Self

import numpy as np
import numpy.typing as npt

from core.auth import Token, check_scopes
from core.dataset import Dataset, DatasetRef
from core.errors import Conflict, Invalid, Unavailable
from core.regex import compile_anchored
from store import encoding

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1
# The flush group whose "checkpoint" row holds a shard's seal mark (`MetaStore.raise_seal_mark`).
SEAL_MARK_GROUP = -1
# The flush group whose row holds a shard's downsampling redo record
# (`MetaStore.set_downsample_redo`); below every resolution's mark group.
REDO_GROUP = -(1 << 31)
NO_REDO = -1  # the redo record's value when there is nothing to redo
DEFAULT_MAX_CHUNK_SPAN_MS = 24 * 3600 * 1000


def _downsample_group(resolution_ms: int) -> int:
    """The reserved flush group holding a resolution's downsample mark: -1 - seconds."""
    if not isinstance(resolution_ms, int) or resolution_ms < 1000 or resolution_ms % 1000:
        raise ValueError(f"a resolution is a whole number of seconds, got {resolution_ms!r} ms")
    group = -1 - resolution_ms // 1000
    if group <= REDO_GROUP:
        raise ValueError(f"a resolution of {resolution_ms!r} ms is too long")
    return group


def downsampled_name(name: str, resolution_ms: int) -> str:
    """Where a dataset's periods of a resolution are stored: beside its chunks, under a name no
    dataset can have (names take no '@'), so they reuse the chunks' tables, buckets, byte
    counts and expiry."""
    _downsample_group(resolution_ms)
    return f"{name}@{resolution_ms}"


# --------------------------------------------------------------------------------------- errors


class StoreError(Unavailable):
    """The store failed: an outage (the subclasses: retry) or, raised as this class, a bug or
    corruption (do not retry). Either way it cannot serve the request now."""

    context = "the dataset store failed"


class StoreUnavailable(StoreError):
    """The store cannot be reached (or is closed): retry later."""


class StoreTimeout(StoreUnavailable):
    """A request timed out; a write may or may not have been applied. Retrying is safe."""


class DatasetConflict(Conflict):
    """A dataset of that name exists with a different definition."""

    def __init__(self, existing: Dataset, proposed: Dataset) -> None:
        super().__init__(
            f"dataset {existing.name!r} already exists with a different definition: "
            f"stored {existing.to_json()}, proposed {proposed.to_json()}"
        )
        self.existing = existing
        self.proposed = proposed


class TokenConflict(Conflict):
    """A token of that id exists already: a token is created once, never overwritten (that
    would replace its secret or lift its revocation)."""


class StaleEpochError(Conflict):
    """The writer's ownership epoch is not the shard's current one: it has lost the shard, and
    must stop rather than retry."""

    def __init__(self, dataset: str, shard: int, epoch: int, current_epoch: int) -> None:
        super().__init__(
            f"shard {shard} of dataset {dataset!r}: epoch {epoch} is not the current ownership "
            f"epoch {current_epoch}; the shard belongs to another writer"
        )
        self.dataset = dataset
        self.shard = shard
        self.epoch = epoch
        self.current_epoch = current_epoch


# --------------------------------------------------------------------------- labels and matchers


def encode_part_key(labels: Mapping[str, str]) -> str:
    """The canonical part key of a series: compact JSON of its labels sorted by name.

    Labels with an empty value are dropped (Prometheus treats them as absent), so `{a="", b="x"}`
    and `{b="x"}` are one series. The key is human-readable in cqlsh/sqlite3 and decodable back to
    the labels, which is how part-key listings filter by matchers.
    """
    items = sorted((k, v) for k, v in labels.items() if v != "")
    for k, v in items:
        if not isinstance(k, str) or not isinstance(v, str) or not k:
            raise ValueError(f"labels must map non-empty str names to str values, got {k!r}: {v!r}")
    return json.dumps(dict(items), ensure_ascii=False, separators=(",", ":"))


def decode_part_key(part_key: str) -> dict[str, str]:
    """The labels of a canonical part key."""
    labels = json.loads(part_key)
    if not isinstance(labels, dict):
        raise ValueError(f"not a part key: {part_key!r}")
    return labels


class MatchOp(StrEnum):
    EQ = "="
    NE = "!="
    RE = "=~"
    NRE = "!~"


@dataclass(frozen=True, slots=True)
class LabelMatcher:
    """A Prometheus label matcher: regexes are fully anchored, a missing label equals ""."""

    label: str
    op: MatchOp
    value: str
    _regex: Any = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "op", MatchOp(self.op))
        if self.op in (MatchOp.RE, MatchOp.NRE):
            try:
                regex = compile_anchored(self.value)  # RE2, as Prometheus
            except ValueError as e:
                raise ValueError(f"bad regex in matcher {self}: {e}") from e
            object.__setattr__(self, "_regex", regex)

    def matches(self, labels: Mapping[str, str]) -> bool:
        v = labels.get(self.label, "")
        if self.op is MatchOp.EQ:
            return v == self.value
        if self.op is MatchOp.NE:
            return v != self.value
        assert self._regex is not None
        hit = self._regex.fullmatch(v) is not None
        return hit if self.op is MatchOp.RE else not hit

    def __str__(self) -> str:
        return f"{self.label}{self.op}{json.dumps(self.value)}"


# ------------------------------------------------------------------------------------- records


def _check_range(what: str, start: int, end: int) -> None:
    if not (INT64_MIN <= start <= end <= INT64_MAX):
        raise ValueError(f"{what}: need int64 start <= end, got [{start}, {end}]")


@dataclass(frozen=True, slots=True)
class PartKeyRecord:
    """A series of a shard: its canonical part key and the time range of its samples."""

    part_key: str
    start_time: int
    end_time: int

    def __post_init__(self) -> None:
        _check_range(f"part key {self.part_key}", self.start_time, self.end_time)

    @classmethod
    def from_labels(cls, labels: Mapping[str, str], start_time: int, end_time: int) -> Self:
        return cls(encode_part_key(labels), start_time, end_time)

    @property
    def labels(self) -> dict[str, str]:
        return decode_part_key(self.part_key)


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """One encoded chunk of one series. Its identity is (part key, start_time): rewriting a chunk
    with the same identity replaces it, so replaying after a crash never duplicates samples."""

    part_key: str
    start_time: int
    end_time: int
    num_samples: int
    data: bytes

    def __post_init__(self) -> None:
        _check_range(f"chunk of {self.part_key}", self.start_time, self.end_time)
        if not 1 <= self.num_samples <= INT32_MAX:
            raise ValueError(f"chunk of {self.part_key}: bad num_samples {self.num_samples}")

    @classmethod
    def from_samples(
        cls, part_key: str, timestamps: npt.ArrayLike, values: npt.ArrayLike
    ) -> ChunkRecord:
        """Encode samples (timestamps strictly increasing) into a chunk."""
        ts = np.asarray(timestamps, dtype=np.int64)
        data = encoding.encode_chunk(ts, values)
        return cls(part_key, int(ts[0]), int(ts[-1]), len(ts), data)

    def samples(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Decode: (int64 timestamps, float64 values), read-only (shared by a cache)."""
        hit = _decoded_cache.get(self.data) if type(self.data) is bytes else None
        return hit if hit is not None else decode_records([self])[0]


# Decoded chunks, most recently used first: dashboards ask for the same recent windows again and
# again, and decoding is most of a query's time on a node (bench/bench_promql.py, profiled).
# Keyed by the chunk's bytes (a chunk never changes once encoded; a bytes object hashes once).
# Bounded in entries, each at most ingest.max_chunk_samples samples of 16 bytes (the memory this
# bounds per process: docs/storage.md).
DECODED_CHUNKS_CACHED = 8192

Decoded = tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]


class _DecodedCache:
    """An LRU of decoded chunks that can be asked for many at once, so the misses of a read
    are decoded together (`encoding_fast.decode_chunks`) rather than one by one."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[bytes, Decoded] = OrderedDict()

    def get_many(self, keys: Sequence[bytes]) -> list[Decoded | None]:
        with self._lock:
            found = [self._items.get(k) for k in keys]
            for k, hit in zip(keys, found, strict=True):
                if hit is not None:
                    self._items.move_to_end(k)
        return found

    def get(self, key: bytes) -> Decoded | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
        return hit

    def put_many(self, items: Iterable[tuple[bytes, Decoded]]) -> None:
        with self._lock:
            for k, v in items:
                self._items[k] = v
                self._items.move_to_end(k)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


_decoded_cache = _DecodedCache(DECODED_CHUNKS_CACHED)


def decode_records(records: Sequence[ChunkRecord], cache: bool = True) -> list[Decoded]:
    """Each record's samples (read-only arrays), bit for bit `ChunkRecord.samples`. The misses
    of the cache are decoded in one compiled batch. `cache=False` (a downsampling round, which
    reads every chunk once) neither consults nor fills the cache, so dashboards keep theirs."""
    # Imported here: numba's import is needed only by processes that read chunks.
    from store.encoding_fast import decode_chunks

    keys = [r.data if type(r.data) is bytes else bytes(r.data) for r in records]
    hits = _decoded_cache.get_many(keys) if cache else [None] * len(keys)
    missing = [i for i, hit in enumerate(hits) if hit is None]
    fresh: dict[int, Decoded] = {}
    if missing:
        ts, vals, bounds = decode_chunks([keys[i] for i in missing])
        b = bounds.tolist()
        for j, i in enumerate(missing):
            t, v = ts[b[j] : b[j + 1]], vals[b[j] : b[j + 1]]
            if cache:  # copies: a cached view would keep its whole batch alive
                t, v = t.copy(), v.copy()
            t.flags.writeable = False
            v.flags.writeable = False
            fresh[i] = (t, v)
        if cache:
            _decoded_cache.put_many((keys[i], d) for i, d in fresh.items())
    return [fresh[i] if hit is None else hit for i, hit in enumerate(hits)]


@dataclass(frozen=True, slots=True)
class StoredBytes:
    """What a dataset's chunks hold in the store, counted as they are written (never by a
    scan): the encoded bytes and chunks, in total and per time bucket (bucket start ms, bytes)."""

    bytes: int
    chunks: int
    buckets: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one `ColumnStore.sweep` freed: by retention, and (SQLite) by the size limit."""

    buckets_dropped: int = 0
    bytes_freed: int = 0
    part_keys_deleted: int = 0
    size_buckets_dropped: int = 0
    size_bytes_freed: int = 0


@dataclass(frozen=True, slots=True)
class ShardEpoch:
    """A shard's current ownership epoch (0: never claimed) and who claimed it."""

    epoch: int
    owner: str


# -------------------------------------------------------------------------------------- stores


def _check_shard(shard: int) -> None:
    if not isinstance(shard, int) or not 0 <= shard <= INT32_MAX:
        raise ValueError(f"shard must be an int in [0, {INT32_MAX}], got {shard!r}")


def _check_group_offset(group: int, offset: int) -> None:
    if not 0 <= group <= INT32_MAX:
        raise ValueError(f"flush group must be in [0, {INT32_MAX}], got {group}")
    if not -1 <= offset <= INT64_MAX:
        raise ValueError(f"offset must be >= -1, got {offset}")


def _check_ref(ref: DatasetRef) -> str:
    if not isinstance(ref, DatasetRef):
        raise TypeError(f"expected a DatasetRef, got {type(ref).__name__}")
    return ref.name


# A token's id as `core.auth` makes it (hex). The store keys rows by it and REST paths name it,
# so nothing else is taken; the length is left to core.auth.
_TOKEN_ID = re.compile(r"^[0-9a-f]{1,64}$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def _check_token_id(token_id: str) -> str:
    if not isinstance(token_id, str):
        raise TypeError(f"a token id is a str, got {type(token_id).__name__}")
    if not _TOKEN_ID.match(token_id):
        raise Invalid(f"a token id is lowercase hex (as core.auth makes it), got {token_id!r}")
    return token_id


def _check_ms(what: str, ms: int) -> None:
    if isinstance(ms, bool) or not isinstance(ms, int) or not 0 <= ms <= INT64_MAX:
        raise Invalid(f"{what} must be a non-negative int64 of milliseconds, got {ms!r}")


def _check_token(token: Token) -> Token:
    """Every field of the exact type it is read back as, so a stored token compares equal to
    the one put (a list for a tuple, or a set for a frozenset, would not round-trip)."""
    if not isinstance(token, Token):
        raise TypeError(f"expected a Token, got {type(token).__name__}")
    _check_token_id(token.id)
    if not isinstance(token.name, str) or not token.name.strip():
        raise Invalid(f"token {token.id}: a token needs a name, got {token.name!r}")
    if not isinstance(token.scopes, frozenset):
        raise Invalid(f"token {token.id}: scopes must be a frozenset, got {token.scopes!r}")
    check_scopes(token.scopes)
    if not isinstance(token.secret_sha256, str) or not _SHA256_HEX.match(token.secret_sha256):
        raise Invalid(f"token {token.id}: secret_sha256 must be 64 lowercase hex digits")
    _check_ms(f"token {token.id}: created_ms", token.created_ms)
    if not isinstance(token.datasets, tuple) or not all(
        isinstance(d, str) and d for d in token.datasets
    ):
        raise Invalid(
            f"token {token.id}: datasets must be a tuple of dataset names, got {token.datasets!r}"
        )
    if token.tenant is not None and (not isinstance(token.tenant, str) or not token.tenant):
        raise Invalid(f"token {token.id}: tenant must be a non-empty str or None (any)")
    if token.revoked_ms is not None:
        _check_ms(f"token {token.id}: revoked_ms", token.revoked_ms)
    return token


class SharedHandle:
    """A connection (or file) that a backend's MetaStore and ColumnStore share: reference-counted,
    so it is shut down with the last store holding it, whichever store closes last."""

    def __init__(self) -> None:
        self._refs_lock = threading.Lock()
        self._refs = 0

    def acquire(self) -> Self:
        with self._refs_lock:
            self._refs += 1
        return self

    def release(self) -> None:
        with self._refs_lock:
            self._refs -= 1
            last = self._refs <= 0
        if last:
            self._shut_down()

    def _shut_down(self) -> None:
        raise NotImplementedError


class HoldsShared:
    """A store's hold on its backend's `SharedHandle`: released once, by the first `close()`."""

    def __init__(self, handle: SharedHandle) -> None:
        self._handle = handle.acquire()
        self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            self._handle.release()


class _Closable(ABC):
    @abstractmethod
    def close(self) -> None:
        """Release connections; idempotent. Stores sharing a connection close it last."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class OwnershipChange:
    """One change of a shard's owner, kept in the MetaStore's ownership history.

    `reason` says why (`created`, `joined`, `left (...)`, `failed (...)`, `error`, `operator`,
    `rebalance`, `drain`, `forced (...)`, `cancelled (...)`); `epoch` and `replayed_offsets` are
    the new owner's, once it went live (None: it never did, or the shard was left unowned)."""

    dataset: str
    shard: int
    at_ms: int
    from_node: str | None
    to_node: str | None
    reason: str
    epoch: int | None = None
    replayed_offsets: int | None = None


class MetaStore(_Closable):
    """Dataset definitions, ownership epochs, fenced checkpoints, the ownership history and the
    API tokens."""

    def create_dataset(self, dataset: Dataset) -> bool:
        """Register a dataset: True if created, False if an identical one exists.

        Raises DatasetConflict if one of that name exists with a different definition."""
        if not isinstance(dataset, Dataset):
            raise TypeError(f"expected a Dataset, got {type(dataset).__name__}")
        return self._create_dataset(dataset)

    def get_dataset(self, ref: DatasetRef) -> Dataset | None:
        return self._get_dataset(_check_ref(ref))

    def list_datasets(self) -> list[Dataset]:
        """All datasets, sorted by name."""
        return sorted(self._list_datasets(), key=lambda d: d.name)

    def delete_dataset(self, ref: DatasetRef) -> bool:
        """Forget a dataset's definition; True if it existed.

        Its checkpoints, epochs and stored series stay: epochs must never go back (fencing), and
        checkpoints keep describing what the ColumnStore holds, so re-creating the same dataset
        resumes where it stopped."""
        return self._delete_dataset(_check_ref(ref))

    def claim_epoch(self, ref: DatasetRef, shard: int, owner: str = "") -> int:
        """Claim a new ownership epoch for a shard, strictly greater than any before; return it.

        Call before ingesting the shard (then read its checkpoints): from now on commits carrying
        an older epoch fail with StaleEpochError. `owner` is recorded for operators only."""
        _check_shard(shard)
        return self._claim_epoch(_check_ref(ref), shard, str(owner))

    def current_epoch(self, ref: DatasetRef, shard: int) -> ShardEpoch:
        _check_shard(shard)
        return self._current_epoch(_check_ref(ref), shard)

    def commit_checkpoint(
        self, ref: DatasetRef, shard: int, group: int, offset: int, epoch: int
    ) -> int:
        """Record that a flush group's samples up to Kafka `offset` are in the ColumnStore.

        Fenced: raises StaleEpochError unless `epoch` is the shard's current epoch. Checkpoints
        never go backwards: committing a lower offset than stored keeps the stored one. Returns
        the checkpoint now stored. Idempotent, so safe to retry after StoreTimeout."""
        _check_shard(shard)
        if not isinstance(group, int) or not 0 <= group <= INT32_MAX:
            raise ValueError(f"flush group must be an int in [0, {INT32_MAX}], got {group!r}")
        if not isinstance(offset, int) or not 0 <= offset <= INT64_MAX:
            raise ValueError(f"offset must be a non-negative int64, got {offset!r}")
        if not isinstance(epoch, int) or not 1 <= epoch <= INT64_MAX:
            raise ValueError(f"epoch must be a positive int64 from claim_epoch, got {epoch!r}")
        return self._commit_checkpoint(_check_ref(ref), shard, group, offset, epoch)

    def read_checkpoints(self, ref: DatasetRef, shard: int) -> dict[int, int]:
        """All flush groups' checkpoints of a shard: {group: offset}, empty if none."""
        _check_shard(shard)
        rows = self._read_checkpoints(_check_ref(ref), shard)
        return {g: off for g, off in sorted(rows.items()) if g >= 0}  # < 0: marks

    def raise_seal_mark(self, ref: DatasetRef, shard: int, offset: int, epoch: int) -> int:
        """Record, before writing any chunk sealed from messages up to Kafka `offset`, that
        the ColumnStore may hold samples of messages up to it. A new owner holds its flushes
        only until its replay passed this mark, not the partition's end: what a crashed owner
        may have written is bounded by what it had read (docs/memstore.md, idempotency).

        Fenced like `commit_checkpoint` (a deposed owner fails here, before its chunk writes)
        and never goes backwards. Stored as the checkpoint of a reserved group, so both
        backends keep their schema. Returns the mark now stored."""
        _check_shard(shard)
        if not isinstance(offset, int) or not 0 <= offset <= INT64_MAX:
            raise ValueError(f"offset must be a non-negative int64, got {offset!r}")
        if not isinstance(epoch, int) or not 1 <= epoch <= INT64_MAX:
            raise ValueError(f"epoch must be a positive int64 from claim_epoch, got {epoch!r}")
        return self._commit_checkpoint(_check_ref(ref), shard, SEAL_MARK_GROUP, offset, epoch)

    def read_seal_mark(self, ref: DatasetRef, shard: int) -> int | None:
        """The shard's seal mark (`raise_seal_mark`); None if never raised (a shard never
        flushed, or flushed only by a FiloPy from before the mark)."""
        _check_shard(shard)
        return self._read_checkpoints(_check_ref(ref), shard).get(SEAL_MARK_GROUP)

    def commit_downsample_mark(
        self, ref: DatasetRef, shard: int, resolution_ms: int, period_end: int, epoch: int
    ) -> int:
        """Record that the shard's periods of `resolution_ms` ending at or before `period_end`
        are downsampled and stored (ingest/downsampler.py). Fenced like `commit_checkpoint`,
        never goes backwards, stored as the checkpoint of a reserved group per resolution.
        Returns the mark now stored."""
        _check_shard(shard)
        if not isinstance(period_end, int) or not 0 <= period_end <= INT64_MAX:
            raise ValueError(f"period_end must be a non-negative int64, got {period_end!r}")
        if not isinstance(epoch, int) or not 1 <= epoch <= INT64_MAX:
            raise ValueError(f"epoch must be a positive int64 from claim_epoch, got {epoch!r}")
        group = _downsample_group(resolution_ms)
        return self._commit_checkpoint(_check_ref(ref), shard, group, period_end, epoch)

    def read_downsample_marks(self, ref: DatasetRef, shard: int) -> dict[int, int]:
        """The shard's downsample marks: {resolution_ms: end of the last period done}."""
        _check_shard(shard)
        rows = self._read_checkpoints(_check_ref(ref), shard)
        return {(-g - 1) * 1000: end for g, end in rows.items() if REDO_GROUP < g < SEAL_MARK_GROUP}

    def set_downsample_redo(
        self, ref: DatasetRef, shard: int, since_ms: int | None, epoch: int
    ) -> None:
        """Record that the shard's downsampled slices holding `since_ms` and later, up to its
        marks, may miss samples and must be summarised again for every series (None: nothing
        to redo). The downsampler writes it before a checkpoint passes a late sample, so a new
        owner redoes what a crash kept the old one from redoing (ingest/downsampler.py).
        Unlike a mark, it goes both ways. Fenced like `commit_checkpoint`."""
        _check_shard(shard)
        if since_ms is not None and (not isinstance(since_ms, int) or since_ms < 0):
            raise ValueError(f"since_ms must be a non-negative int64 or None, got {since_ms!r}")
        if not isinstance(epoch, int) or not 1 <= epoch <= INT64_MAX:
            raise ValueError(f"epoch must be a positive int64 from claim_epoch, got {epoch!r}")
        value = NO_REDO if since_ms is None else since_ms
        self._set_checkpoint(_check_ref(ref), shard, REDO_GROUP, value, epoch)

    def read_downsample_redo(self, ref: DatasetRef, shard: int) -> int | None:
        """The shard's redo record (`set_downsample_redo`); None if there is nothing to redo."""
        _check_shard(shard)
        value = self._read_checkpoints(_check_ref(ref), shard).get(REDO_GROUP, NO_REDO)
        return None if value == NO_REDO else value

    def record_ownership(self, changes: Sequence[OwnershipChange], retention_ms: int) -> None:
        """Append ownership changes to the history, each kept for `retention_ms` after it
        happened (SQLite: older ones are deleted as new ones come; Cassandra: a TTL).
        Idempotent per change."""
        if retention_ms < 1:
            raise ValueError(f"retention_ms must be positive, got {retention_ms}")
        if changes:
            self._record_ownership(list(changes), retention_ms)

    def ownership_history(
        self, ref: DatasetRef, shard: int | None = None, limit: int = 100
    ) -> list[OwnershipChange]:
        """A dataset's ownership changes, newest first (of one shard, if given)."""
        if shard is not None:
            _check_shard(shard)
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        return self._ownership_history(_check_ref(ref), shard, limit)

    def put_token(self, token: Token) -> None:
        """Store a new token (`core.auth.new_token`) for every server of the cluster to check.

        Raises TokenConflict if its id is taken, whatever that token is: a token is written
        once, so neither its secret nor its revocation can be overwritten. So, unlike the other
        writes, a retry after StoreTimeout may meet its own token: `get_token` tells (the same
        `secret_sha256`: it was stored)."""
        self._put_token(_check_token(token))

    def get_token(self, token_id: str) -> Token | None:
        """The token of that id, revoked or not (the caller checks `revoked`); None if none."""
        return self._get_token(_check_token_id(token_id))

    def list_tokens(self) -> list[Token]:
        """Every token, the revoked ones too (who was revoked when), oldest first."""
        return sorted(self._list_tokens(), key=lambda t: (t.created_ms, t.id))

    def revoke_token(self, token_id: str, now_ms: int) -> bool:
        """Mark a token revoked at `now_ms`; True if it existed and was not revoked yet.

        The row stays, with its first revocation's time (a repeat changes nothing, so this is
        idempotent): lists keep showing who was revoked when."""
        _check_ms("now_ms", now_ms)
        return self._revoke_token(_check_token_id(token_id), now_ms)

    def set_retention(self, ref: DatasetRef, retention_ms: int | None) -> None:
        """Set how long the dataset's raw chunks are kept after their last sample (0: forever;
        None: forget the dataset's own value, so the cluster default applies). Never expired,
        and kept when the definition is deleted, like the checkpoints."""
        if retention_ms is not None:
            _check_ms("retention_ms", retention_ms)
        self._set_retention(_check_ref(ref), retention_ms)

    def get_retention(self, ref: DatasetRef) -> int | None:
        """The dataset's own retention in ms (0: forever); None if it has none (the cluster
        default applies: `ColumnStore.retention_ms` tells the value in force)."""
        return self._get_retention(_check_ref(ref))

    def set_size_limit(self, ref: DatasetRef, max_bytes: int | None) -> None:
        """Bound the dataset's stored chunk bytes (None: no bound): the sweep drops the oldest
        time buckets first until it holds at most `max_bytes` (Prometheus' `retention.size`).
        SQLite only: Cassandra raises `Unsupported` (its space is freed by TTLs)."""
        if max_bytes is not None and (
            isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1
        ):
            raise Invalid(f"a size limit is a positive number of bytes, got {max_bytes!r}")
        self._set_size_limit(_check_ref(ref), max_bytes)

    def get_size_limit(self, ref: DatasetRef) -> int | None:
        """The dataset's size limit in bytes; None if it has none."""
        return self._get_size_limit(_check_ref(ref))

    @abstractmethod
    def _set_size_limit(self, name: str, max_bytes: int | None) -> None: ...
    @abstractmethod
    def _get_size_limit(self, name: str) -> int | None: ...
    @abstractmethod
    def _set_retention(self, name: str, retention_ms: int | None) -> None: ...
    @abstractmethod
    def _get_retention(self, name: str) -> int | None: ...
    @abstractmethod
    def _put_token(self, token: Token) -> None: ...
    @abstractmethod
    def _get_token(self, token_id: str) -> Token | None: ...
    @abstractmethod
    def _list_tokens(self) -> list[Token]: ...
    @abstractmethod
    def _revoke_token(self, token_id: str, now_ms: int) -> bool: ...
    @abstractmethod
    def _record_ownership(self, changes: list[OwnershipChange], retention_ms: int) -> None: ...
    @abstractmethod
    def _ownership_history(
        self, name: str, shard: int | None, limit: int
    ) -> list[OwnershipChange]: ...
    @abstractmethod
    def _create_dataset(self, dataset: Dataset) -> bool: ...
    @abstractmethod
    def _get_dataset(self, name: str) -> Dataset | None: ...
    @abstractmethod
    def _list_datasets(self) -> list[Dataset]: ...
    @abstractmethod
    def _delete_dataset(self, name: str) -> bool: ...
    @abstractmethod
    def _claim_epoch(self, name: str, shard: int, owner: str) -> int: ...
    @abstractmethod
    def _current_epoch(self, name: str, shard: int) -> ShardEpoch: ...
    @abstractmethod
    def _commit_checkpoint(
        self, name: str, shard: int, group: int, offset: int, epoch: int
    ) -> int: ...
    @abstractmethod
    def _set_checkpoint(self, name: str, shard: int, group: int, value: int, epoch: int) -> None:
        """Like `_commit_checkpoint`, but the value may go down."""

    @abstractmethod
    def _read_checkpoints(self, name: str, shard: int) -> dict[int, int]: ...


class ColumnStore(_Closable):
    """Part keys and encoded chunks, per (dataset, shard).

    No chunk may span more than `max_chunk_span_ms` (end - start); that bound lets a time-range
    read be one index slice over chunk start times, [start - max_chunk_span_ms, end].

    Retention: `default_retention_ms` (0: forever) for datasets without a value of their own
    (`MetaStore.set_retention`). `clock` gives "now" in ms: the wall clock, replaced by tests
    that step through time."""

    def __init__(
        self,
        max_chunk_span_ms: int = DEFAULT_MAX_CHUNK_SPAN_MS,
        default_retention_ms: int = 0,
    ) -> None:
        if max_chunk_span_ms <= 0:
            raise ValueError(f"max_chunk_span_ms must be positive, got {max_chunk_span_ms}")
        _check_ms("default_retention_ms", default_retention_ms)
        self.max_chunk_span_ms = max_chunk_span_ms
        self.default_retention_ms = default_retention_ms
        self.clock: Callable[[], int] = _wall_ms
        # Per downsampled resolution, how long its periods are kept (0: forever); see
        # `write_downsampled`. Set from `[downsample]` by `store.open_stores`.
        self.downsample_retention_ms: dict[int, int] = {}
        # What reads returned, for tests and benchmarks that must show which data a query
        # touched: raw chunks, and downsampled records per resolution.
        self.chunks_read = 0
        self.downsampled_read: dict[int, int] = {}

    def series_cutoff(self, ref: DatasetRef) -> int:
        """The oldest time a series must still be known for: its raw chunks' cutoff, or older
        if a downsampled resolution keeps periods longer (their series stay listed with them,
        so a query past raw retention still finds them)."""
        cutoffs = [self.cutoff(ref)]
        now = self.clock()
        for kept in self.downsample_retention_ms.values():
            cutoffs.append(INT64_MIN if kept <= 0 else now - kept)
        return min(cutoffs)

    def retention_ms(self, ref: DatasetRef) -> int:
        """The retention in force for the dataset: its own, else the cluster default (0:
        forever)."""
        own = self._own_retention(_check_ref(ref))
        return self.default_retention_ms if own is None else own

    def cutoff(self, ref: DatasetRef) -> int:
        """The oldest time still answered: `now - retention` (inclusive), INT64_MIN if kept
        forever. Reads, writes and sweeps all go by it, so the boundary is exact whether or not
        a sweep or a TTL has freed the older data yet."""
        retention = self.retention_ms(ref)
        return INT64_MIN if retention <= 0 else self.clock() - retention

    def sweep(self, ref: DatasetRef) -> SweepResult:
        """Free what is past the dataset's retention: SQLite drops the chunk buckets whose every
        chunk ended before the cutoff and deletes the part keys of series with no sample left;
        Cassandra's rows expire by their TTL, so it only forgets the byte counts of days past.
        Then, if the dataset has a size limit (SQLite), drops its oldest buckets until it holds
        at most that many bytes, never the newest (what is being written).
        Idempotent, and safe when several run at once."""
        cutoff = self.cutoff(ref)
        series_cutoff = self.series_cutoff(ref)
        result = SweepResult()
        if cutoff != INT64_MIN:
            result = self._sweep(ref.name, cutoff, series_cutoff)
        now = self.clock()
        for res, kept in self.downsample_retention_ms.items():
            if kept > 0:
                self._sweep(downsampled_name(ref.name, res), now - kept, INT64_MIN)
        limit = self._own_size_limit(ref.name)
        if limit is None:
            return result
        dropped, freed = self._limit_size(ref.name, limit)
        return dataclasses.replace(result, size_buckets_dropped=dropped, size_bytes_freed=freed)

    def stored_bytes(self, ref: DatasetRef) -> StoredBytes:
        """The dataset's chunk bytes in the store (maintained at write, cheap to ask)."""
        return self._stored_bytes(_check_ref(ref))

    def write_part_keys(
        self, ref: DatasetRef, shard: int, records: Iterable[PartKeyRecord]
    ) -> None:
        """Upsert part keys; last write wins (pass the series' whole known time range)."""
        _check_shard(shard)
        name = _check_ref(ref)
        now, cutoff = self.clock(), self.series_cutoff(ref)
        retention = 0 if cutoff == INT64_MIN else now - cutoff
        recs = list(records)
        if retention:  # a series whose last sample is past retention is not written at all
            recs = [r for r in recs if r.end_time >= cutoff]
        if recs:
            self._write_part_keys(name, shard, recs, retention, now)

    def list_part_keys(
        self,
        ref: DatasetRef,
        shard: int,
        start: int = INT64_MIN,
        end: int = INT64_MAX,
        matchers: Sequence[LabelMatcher] = (),
    ) -> list[PartKeyRecord]:
        """The shard's part keys whose [start_time, end_time] overlaps [start, end] and whose
        labels satisfy every matcher, sorted by part key."""
        _check_shard(shard)
        _check_range("part key query", start, end)
        start = max(start, self.series_cutoff(ref))
        if start > end:
            return []
        found = self._list_part_keys(_check_ref(ref), shard, start, end)
        if matchers:
            found = [r for r in found if _matches_all(matchers, r.labels)]
        return sorted(found, key=lambda r: r.part_key)

    def write_chunks(self, ref: DatasetRef, shard: int, chunks: Iterable[ChunkRecord]) -> None:
        """Write chunks of any number of series; rewriting a chunk replaces it (idempotent).

        A chunk whose last sample is already past the dataset's retention is not written."""
        _check_shard(shard)
        retention, now = self._retention_now(ref)
        self._write_records(_check_ref(ref), shard, chunks, retention, now)

    def read_chunks(
        self, ref: DatasetRef, shard: int, part_keys: Iterable[str], start: int, end: int
    ) -> dict[str, list[ChunkRecord]]:
        """Chunks of the given series overlapping [start, end]: {part_key: chunks by start}.

        Series without such chunks are absent from the result."""
        _check_shard(shard)
        _check_range("chunk query", start, end)
        found = self._read_records(_check_ref(ref), shard, part_keys, start, end, self.cutoff(ref))
        self.chunks_read += sum(map(len, found.values()))
        return found

    def write_downsampled(
        self, ref: DatasetRef, shard: int, resolution_ms: int, records: Iterable[ChunkRecord]
    ) -> None:
        """Write downsampled records (ingest/downsampler.py: one series' periods of one slice
        each, `store.downsample.encode_records`), stored and expired as chunks are, under a
        name of their own (`downsampled_name`) and kept `downsample_retention_ms[resolution]`.
        Rewriting a record replaces it."""
        _check_shard(shard)
        name = downsampled_name(_check_ref(ref), resolution_ms)
        retention = self.downsample_retention_ms.get(resolution_ms, 0)
        self._write_records(name, shard, records, retention, self.clock())

    def read_downsampled(
        self,
        ref: DatasetRef,
        shard: int,
        resolution_ms: int,
        part_keys: Iterable[str],
        start: int,
        end: int,
    ) -> dict[str, list[ChunkRecord]]:
        """Downsampled records of the given series overlapping [start, end], by start."""
        _check_shard(shard)
        _check_range("downsampled query", start, end)
        name = downsampled_name(_check_ref(ref), resolution_ms)
        retention = self.downsample_retention_ms.get(resolution_ms, 0)
        cutoff = self.clock() - retention if retention else INT64_MIN
        found = self._read_records(name, shard, part_keys, start, end, cutoff)
        read = self.downsampled_read
        read[resolution_ms] = read.get(resolution_ms, 0) + sum(map(len, found.values()))
        return found

    def _write_records(
        self, name: str, shard: int, records: Iterable[ChunkRecord], retention: int, now: int
    ) -> None:
        """Chunks and downsampled records alike: spans bounded, nothing past retention."""
        batch = list(records)
        for c in batch:
            if c.end_time - c.start_time > self.max_chunk_span_ms:
                raise ValueError(
                    f"chunk of {c.part_key} at {c.start_time} spans {c.end_time - c.start_time} "
                    f"ms, more than max_chunk_span_ms={self.max_chunk_span_ms}"
                )
        if retention:
            batch = [c for c in batch if c.end_time >= now - retention]
        if batch:
            self._write_chunks(name, shard, batch, retention, now)

    def _read_records(
        self, name: str, shard: int, part_keys: Iterable[str], start: int, end: int, cutoff: int
    ) -> dict[str, list[ChunkRecord]]:
        """Records of the series overlapping [max(start, cutoff), end], by series and start."""
        start = max(start, cutoff)
        keys = sorted(set(part_keys))
        if not keys or start > end:
            return {}
        lo = max(INT64_MIN, start - self.max_chunk_span_ms)
        found = self._read_chunks(name, shard, keys, lo, start, end)
        return {k: sorted(v, key=lambda c: c.start_time) for k, v in sorted(found.items()) if v}

    def delete_series(self, ref: DatasetRef, shard: int, part_keys: Iterable[str]) -> int:
        """Remove series of a shard for good: their part keys, raw chunks in every time bucket
        and downsampled records of every configured resolution (`downsample_retention_ms`).
        Returns how many of them had a part key. Idempotent; a caller that keeps the series in
        memory must drop them there first, or its next flush writes them back."""
        _check_shard(shard)
        name = _check_ref(ref)
        keys = sorted(set(part_keys))
        if not keys:
            return 0
        for res in sorted(self.downsample_retention_ms):
            self._delete_series(downsampled_name(name, res), shard, keys)
        return self._delete_series(name, shard, keys)

    def downsampled_bytes(self, ref: DatasetRef, resolution_ms: int) -> StoredBytes:
        """A resolution's stored bytes (as `stored_bytes` for raw chunks)."""
        return self._stored_bytes(downsampled_name(_check_ref(ref), resolution_ms))

    def write_open_snapshot(
        self, ref: DatasetRef, shard: int, group: int, offset: int, epoch: int, data: bytes
    ) -> None:
        """Store a flush group's open buffers as of checkpoint `offset`, written by `epoch`.

        Written before the checkpoint is committed, so a committed checkpoint always has its
        snapshot. Idempotent: the same (group, offset, epoch) is only ever written with the same
        bytes. Several epochs may hold a snapshot at one offset (a deposed owner's late write);
        `read_open_snapshot` takes the newest epoch's."""
        _check_shard(shard)
        _check_group_offset(group, offset)
        if epoch < 1:
            raise ValueError(f"epoch must be >= 1, got {epoch}")
        self._write_open_snapshot(_check_ref(ref), shard, group, offset, epoch, bytes(data))

    def read_open_snapshot(
        self, ref: DatasetRef, shard: int, group: int, offset: int
    ) -> bytes | None:
        """The snapshot of `group` at `offset` (newest epoch's), None if there is none."""
        _check_shard(shard)
        _check_group_offset(group, offset)
        return self._read_open_snapshot(_check_ref(ref), shard, group, offset)

    def drop_open_snapshots(self, ref: DatasetRef, shard: int, group: int, below: int) -> None:
        """Forget the group's snapshots at offsets below `below` (superseded by a newer
        committed checkpoint)."""
        _check_shard(shard)
        _check_group_offset(group, below)
        self._drop_open_snapshots(_check_ref(ref), shard, group, below)

    @abstractmethod
    def _write_open_snapshot(
        self, name: str, shard: int, group: int, offset: int, epoch: int, data: bytes
    ) -> None: ...
    @abstractmethod
    def _read_open_snapshot(self, name: str, shard: int, group: int, offset: int) -> bytes | None:
        """Newest epoch's complete snapshot at (group, offset)."""

    @abstractmethod
    def _drop_open_snapshots(self, name: str, shard: int, group: int, below: int) -> None: ...
    def _retention_now(self, ref: DatasetRef) -> tuple[int, int]:
        return self.retention_ms(ref), self.clock()

    @abstractmethod
    def _own_retention(self, name: str) -> int | None:
        """The dataset's `MetaStore.set_retention` value, None if it has none."""

    def _own_size_limit(self, name: str) -> int | None:
        """The dataset's `MetaStore.set_size_limit` value (backends that enforce one)."""
        return None

    def _limit_size(self, name: str, max_bytes: int) -> tuple[int, int]:
        """Drop the oldest buckets down to `max_bytes`: (buckets dropped, bytes freed)."""
        raise NotImplementedError

    @abstractmethod
    def _sweep(self, name: str, cutoff: int, part_key_cutoff: int) -> SweepResult:
        """Free chunks that ended before `cutoff` and the part keys of series whose last sample
        is before `part_key_cutoff` (older: downsampled periods may keep a series longer)."""

    @abstractmethod
    def _delete_series(self, name: str, shard: int, part_keys: list[str]) -> int:
        """Delete the series' part keys and chunks (bytes stored too); part keys deleted."""

    @abstractmethod
    def _stored_bytes(self, name: str) -> StoredBytes: ...
    @abstractmethod
    def _write_part_keys(
        self, name: str, shard: int, records: list[PartKeyRecord], retention_ms: int, now_ms: int
    ) -> None:
        """`retention_ms` (0: forever) and `now_ms` let a backend expire what it writes."""

    @abstractmethod
    def _list_part_keys(
        self, name: str, shard: int, start: int, end: int
    ) -> list[PartKeyRecord]: ...
    @abstractmethod
    def _write_chunks(
        self, name: str, shard: int, chunks: list[ChunkRecord], retention_ms: int, now_ms: int
    ) -> None: ...
    @abstractmethod
    def _read_chunks(
        self, name: str, shard: int, part_keys: list[str], lo: int, start: int, end: int
    ) -> dict[str, list[ChunkRecord]]:
        """Chunks with lo <= start_time <= end and end_time >= start."""


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _matches_all(matchers: Sequence[LabelMatcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)
