"""Producer-side gateway: samples in, FiloPy binary messages out, each on its shard's partition.

Routing work is per series and cached (series repeat across scrapes): a series' shard, encoded
labels and size live in a slot of NumPy arrays, found by its labels (or, for a `KeyedBatch`,
by the cheap key its decoder gives: an int per label dict the decoder caches; an
`IntKeyedBatch`'s int keys are found all at once, in NumPy). The cache belongs to the dataset
definition and is shared by every Gateway of it in the process (HTTP ingestion keeps a pool of
them). Per-sample work is NumPy: one gather for each sample's shard, one stable argsort to group
by shard, and each message's series table built for all shards at once. Messages are kept under
a size cap by splitting a shard's samples into pieces sized from the compression ratio seen so
far. The producer is idempotent with acks=all, so a retried send never duplicates or reorders
samples within a partition.

Not thread-safe: use one Gateway per producing thread (the shared series cache is safe).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from confluent_kafka import KafkaError, Message, Producer

from core.config import KafkaSettings
from core.dataset import Dataset
from core.errors import Invalid, Unavailable
from core.hashing import shard_for_series
from core.jit import kernel, warms
from ingest.bad_records import DEFAULT_TS_RANGE, SERIES_REASONS, BadRecord, series_problem
from ingest.batch import IntKeyedBatch, KeyedBatch, Labels, SampleBatch
from ingest.byte_table import new_slots
from ingest.kafka_config import ConnectionErrors, kafka_client_config
from ingest.topics import DEFAULT_TIMEOUT_S, check_topic
from ingest.wire.binary_format import (
    DEFAULT_COMPRESSION_LEVEL,
    HEADER,
    encode_binary_parts,
    encode_bodies,
    encode_labels,
    finish,
)

Sample = tuple[Mapping[str, str], int, float]  # (labels, timestamp ms, value)

DEFAULT_MAX_MESSAGE_BYTES = 900_000  # under Kafka's default 1 MB message limit
DEFAULT_MAX_MESSAGE_SAMPLES = 100_000  # bounds one decoded batch on the consumer side
MIN_MESSAGE_BYTES = 1024
TOO_LARGE = "too_large"  # skip reason: one sample's series alone exceeds the size cap
_SAMPLE_BYTES_BOUND = 8 + 8 + 4  # value + timestamp + series index, widest encodings
_SERIES_OVERHEAD = 2 + 1  # label count + separator
_SEND_CHUNK = 100_000  # rows per columnar batch when `send` consumes an iterable
_log = logging.getLogger("filopy.kafka")


class GatewayError(Unavailable):
    """Kafka did not accept some messages (or the gateway is closed); samples may be missing
    from the topic."""


class InvalidSeries(Invalid):
    """A series breaks the dataset's contract (no metric name, `Dataset.limits`, labels that
    are not str -> str); raised by a strict gateway before any sample of the call is sent."""


@dataclass(frozen=True, slots=True)
class GatewayProgress:
    """A snapshot for progress reports: sent = handed to the producer, acked = by all ISRs."""

    samples_sent: int
    messages_sent: int
    bytes_sent: int
    samples_acked: int
    messages_acked: int
    skipped: Mapping[str, int]
    elapsed_s: float
    final: bool = False

    @property
    def samples_per_s(self) -> float:
        return self.samples_sent / self.elapsed_s if self.elapsed_s > 0 else 0.0


ProgressCallback = Callable[[GatewayProgress], None]


class _Series(NamedTuple):
    shard: int  # -1: not sent (see `code`)
    blob: bytes  # binary_format.encode_labels(labels)
    n_labels: int
    cost: int  # bytes in a message's series table
    code: int = 0  # 0, or 1 + the index in SERIES_REASONS of why the series is refused
    why: str = ""  # the refusal, for the log or InvalidSeries


@dataclass(slots=True)
class _Table:
    """The series of one batch, transposed for NumPy gathers."""

    blobs: list[bytes]
    n_labels: npt.NDArray[np.int64]
    cost: npt.NDArray[np.int64]


_COLUMNS = ("shard", "n_labels", "cost", "code", "blobs", "blob_start", "blob_len")


class _Slots:
    """Cached series as columns: slot i is one series' shard, encoded labels, label count,
    size in a series table and refusal code (`_Series`' fields), for NumPy gathers. The
    encoded labels also as bytes of one `arena` (slot i's at `blob_start[i]`, `blob_len[i]`
    long), which the compiled message encoder reads."""

    def __init__(self, capacity: int = 1024) -> None:
        self.n = 0
        self.shard = np.empty(capacity, np.int32)
        self.n_labels = np.empty(capacity, np.int64)
        self.cost = np.empty(capacity, np.int64)
        self.code = np.empty(capacity, np.int8)
        self.blobs = np.empty(capacity, object)  # bytes: taken for many slots at once
        self.blob_start = np.empty(capacity, np.int64)
        self.blob_len = np.empty(capacity, np.int64)
        self.arena = np.empty(64 * capacity, np.uint8)
        self.arena_used = 0
        self.whys: list[str] = []

    def add(self, info: _Series) -> int:
        """A new slot (call with the cache's lock held)."""
        i = self.n
        if i == len(self.shard):  # double the columns: amortised O(1) per series
            for name in _COLUMNS:
                old = getattr(self, name)
                grown = np.empty(2 * len(old), old.dtype)
                grown[:i] = old
                setattr(self, name, grown)
        self.shard[i], self.n_labels[i], self.cost[i] = info.shard, info.n_labels, info.cost
        self.code[i], self.blobs[i] = info.code, info.blob
        # (the arena grows by copying: a reader's older arena holds the slots it knows)
        a, z = self.arena_used, self.arena_used + len(info.blob)
        arena = self.arena
        if z > len(arena):
            arena = np.empty(max(2 * len(arena), z), np.uint8)
            arena[:a] = self.arena[:a]
        arena[a:z] = np.frombuffer(info.blob, np.uint8)
        self.arena, self.arena_used = arena, z
        self.blob_start[i], self.blob_len[i] = a, len(info.blob)
        self.whys.append(info.why)
        self.n = i + 1
        return i


_KEY_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: an int key's hash (key * _KEY_MIX) is one to one


class _KeySlots:
    """`IntKeyedBatch` keys -> series slots in NumPy (`Slots`; a key's hash is a one-to-one
    mix of it, so equal hashes are equal keys). Keys it cannot place are in `by_key`."""

    __slots__ = ("count", "slots")

    def __init__(self) -> None:
        self.slots = new_slots(2048)
        self.count = 0

    def find(self, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """Each key's series slot, -1 if not here."""
        ids, match = self.slots.find(keys.view(np.uint64) * _KEY_MIX)
        ids[~match] = -1
        return ids

    def add(
        self, keys: npt.NDArray[np.int64], slots: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]:
        """Add distinct keys not here (call with the cache's lock held); which were placed."""
        table = self.slots
        if 2 * (self.count + len(keys)) > len(table.ids):
            table = self.slots = table.resized(self.count + len(keys))
        placed = table.place(keys.view(np.uint64) * _KEY_MIX, slots)
        self.count += int(placed.sum())
        return placed


class _SeriesCache:
    """Series -> slot, by labels and by `KeyedBatch` key. Readers take no lock: slots are
    only added (under `lock`), and columns grow by copying, so a slot once found stays valid."""

    def __init__(self) -> None:
        self.by_labels: dict[tuple[tuple[str, str], ...], int] = {}
        self.by_key: dict[Hashable, int] = {}
        self.by_int_key = _KeySlots()
        self.slots = _Slots()
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.by_labels) + len(self.by_key) + self.by_int_key.count


class _SharedCache:
    """The series cache of one dataset definition, shared by every Gateway of it in the
    process (HTTP ingestion keeps a pool of them: each would learn every series again).
    Emptied by swapping in a new `_SeriesCache`; a batch keeps the one it started with."""

    def __init__(self) -> None:
        self.current = _SeriesCache()


# the dataset definition as JSON -> its cache, while a Gateway of it lives
_shared_caches: weakref.WeakValueDictionary[str, _SharedCache] = weakref.WeakValueDictionary()
_shared_caches_lock = threading.Lock()


def _shared_cache(dataset: Dataset) -> _SharedCache:
    key = dataset.model_dump_json()  # the whole definition (some are not hashable)
    with _shared_caches_lock:
        cache = _shared_caches.get(key)
        if cache is None:
            cache = _shared_caches[key] = _SharedCache()
        return cache


class Acks:
    """Kafka's answers for the messages of one send (e.g. one HTTP request), so a caller can
    wait for its own samples while the same producer carries other sends: a count of messages
    not yet answered, the samples acknowledged and the failures. `on_done` runs once, on the
    thread delivering the last answer (or on `seal`'s if none is outstanding), after `seal`.
    """

    def __init__(self, on_done: Callable[[Acks], None]) -> None:
        self._on_done = on_done
        self._lock = threading.Lock()
        self._sealed = False
        self._fired = False
        self.pending = 0  # messages sent and not yet answered
        self.messages = 0
        self.samples_acked = 0
        self.errors: list[str] = []  # the first few failures
        self.failed = 0

    def sent(self) -> None:
        with self._lock:
            self.pending += 1
            self.messages += 1

    def answered(self, n_samples: int, error: str | None) -> None:
        with self._lock:
            self.pending -= 1
            if error is None:
                self.samples_acked += n_samples
            else:
                self.failed += 1
                if len(self.errors) < 10:
                    self.errors.append(error)
            fire = self._sealed and self.pending == 0 and not self._fired
            self._fired = self._fired or fire
        if fire:
            self._on_done(self)

    def seal(self) -> None:
        """No more messages: `on_done` runs as soon as every sent one is answered."""
        with self._lock:
            self._sealed = True
            fire = self.pending == 0 and not self._fired
            self._fired = self._fired or fire
        if fire:
            self._on_done(self)


@dataclass(slots=True)
class _Counters:
    samples_sent: int = 0
    messages_sent: int = 0
    bytes_sent: int = 0
    samples_acked: int = 0
    messages_acked: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    failed_messages: int = 0  # of untracked sends: they fail the gateway
    tracked_failures: int = 0  # of sends with `Acks`: they fail only their send
    fatal: str | None = None  # a fatal producer error: the gateway cannot send any more


class Gateway:
    """Sends samples of one dataset to its Kafka topic, one partition per shard.

    `send(samples)` takes (labels, timestamp_ms, value) rows; `send_batch(batch)` takes a
    columnar `SampleBatch` (the fast path). Samples the ingesters would refuse are never sent:
    series breaking the dataset's contract (no metric name, over `Dataset.limits`: the reasons of
    `bad_records.SERIES_REASONS`), timestamps out of range and series too large for one message
    are skipped and counted in `skipped` by reason; the first refusal of each reason is logged
    with the rule broken and kept in `rejected`. With `strict=True` a series breaking the
    contract raises `InvalidSeries` instead, before anything of that call is sent. Call
    `flush()` to wait for Kafka's acknowledgements; `close()` flushes and reports the end.
    The producer connects as `kafka` says (this process's `[kafka]` settings if None).
    """

    def __init__(
        self,
        dataset: Dataset,
        bootstrap_servers: str | None = None,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_message_samples: int = DEFAULT_MAX_MESSAGE_SAMPLES,
        compression_level: int = DEFAULT_COMPRESSION_LEVEL,
        progress: ProgressCallback | None = None,
        progress_interval_s: float = 5.0,
        ts_range: tuple[int, int] = DEFAULT_TS_RANGE,
        series_cache_size: int = 1_000_000,
        producer_config: Mapping[str, Any] | None = None,
        verify_topic: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        strict: bool = False,
        kafka: KafkaSettings | None = None,
    ) -> None:
        if max_message_bytes < MIN_MESSAGE_BYTES:
            raise ValueError(f"max_message_bytes must be at least {MIN_MESSAGE_BYTES}")
        if max_message_samples < 1:
            raise ValueError("max_message_samples must be at least 1")
        self.dataset = dataset
        self.topic = dataset.topic
        self.bootstrap_servers = bootstrap_servers or dataset.source.bootstrap_servers
        self.max_message_bytes = max_message_bytes
        self.max_message_samples = max_message_samples
        self.compression_level = compression_level
        self._progress = progress
        self._progress_interval_s = progress_interval_s
        self._ts_range = ts_range
        self.strict = strict
        self.rejected: dict[str, str] = {}  # reason -> the first refusal's message
        self._shared = _shared_cache(dataset)  # series info depends on the definition only
        self._cache_size = series_cache_size
        # Encoded size / raw-size bound, learnt from sent messages; sizes the pieces of a shard.
        self._ratio = 1.0
        self._samples_per_shard = [0] * dataset.num_shards
        self._messages_per_shard = [0] * dataset.num_shards
        self._c = _Counters()
        self._acks: Acks | None = None  # the tracked send in progress
        self._closed = False
        if verify_topic:  # a wrong partition count would route samples to the wrong shards
            check_topic(dataset, self.bootstrap_servers, timeout_s, kafka)
        self._errors = ConnectionErrors()
        config: dict[str, Any] = {
            **kafka_client_config(kafka, self.bootstrap_servers, self._errors),
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "none",  # the body is zstd-compressed already
            "linger.ms": 5,
            "message.max.bytes": max(1_000_000, max_message_bytes + 65_536),
            "logger": _log,
        }
        config.update(producer_config or {})
        self._producer = Producer(config)
        self._t0 = time.monotonic()
        self._last_report = self._t0

    # ------------------------------------------------------------------------------ public

    @property
    def samples_per_shard(self) -> list[int]:
        """Samples handed to the producer, by shard (= partition)."""
        return list(self._samples_per_shard)

    @property
    def messages_per_shard(self) -> list[int]:
        return list(self._messages_per_shard)

    @property
    def skipped(self) -> dict[str, int]:
        return dict(self._c.skipped)

    def progress(self, final: bool = False) -> GatewayProgress:
        c = self._c
        return GatewayProgress(
            samples_sent=c.samples_sent,
            messages_sent=c.messages_sent,
            bytes_sent=c.bytes_sent,
            samples_acked=c.samples_acked,
            messages_acked=c.messages_acked,
            skipped=dict(c.skipped),
            elapsed_s=time.monotonic() - self._t0,
            final=final,
        )

    def send(self, samples: Iterable[Sample]) -> int:
        """Send (labels, timestamp_ms, value) rows; returns how many were accepted."""
        accepted = 0
        index: dict[tuple[tuple[str, str], ...], int] = {}
        series: list[Labels] = []
        idx: list[int] = []
        ts: list[int] = []
        vals: list[float] = []
        for labels, t, v in samples:
            key = tuple(labels.items())
            i = index.get(key)
            if i is None:
                i = index[key] = len(series)
                series.append(dict(labels))
            idx.append(i)
            ts.append(t)
            vals.append(v)
            if len(idx) >= _SEND_CHUNK:
                accepted += self.send_batch(_batch(series, idx, ts, vals))
                index, series, idx, ts, vals = {}, [], [], [], []
        if idx:
            accepted += self.send_batch(_batch(series, idx, ts, vals))
        return accepted

    def send_batch(self, batch: SampleBatch, acks: Acks | None = None) -> int:
        """Send a columnar batch; returns how many samples were accepted (not skipped).

        With `acks`, Kafka's answers for these messages go to it (see `Acks`): the caller
        waits for them there (the producer is polled by `poll`), not with `flush`, and a failed
        message fails only this send. The caller seals `acks` once done sending."""
        self._check_usable()
        self._acks = acks
        try:
            return self._send_batch(batch)
        finally:
            self._acks = None

    def poll(self, timeout_s: float) -> int:
        """Serve Kafka's delivery reports (for `Acks`); the number served."""
        return self._producer.poll(timeout_s)

    @property
    def backlog(self) -> int:
        """Messages handed to the producer and not yet answered by Kafka."""
        return len(self._producer)

    @property
    def usable(self) -> bool:
        """False once closed or after a fatal producer error (make a new Gateway)."""
        return not self._closed and self._c.fatal is None

    def _send_batch(self, batch: SampleBatch) -> int:
        if len(batch) == 0:
            return 0
        cache = self._shared.current
        if len(cache) + len(batch.series) > self._cache_size:
            cache = self._shared.current = _SeriesCache()
        slots = self._slots_of(batch, cache)
        cached = cache.slots
        lo, hi = self._ts_range
        if len(batch.series) == len(batch):  # one sample per series, as a scrape: one pass
            plan = _scrape_plan(
                slots.astype(np.int64, copy=False), batch.series_idx, batch.timestamps,
                cached.shard, cached.code, cached.cost, lo, hi, self.dataset.num_shards,
            )  # fmt: skip
            order, bounds, group_shards, local, bases, offsets, wide, group_cost = plan
            if len(order):
                accepted = self._send_groups(
                    batch, cached, slots, order, bounds, group_shards, order, bounds, local,
                    bases, offsets, wide, group_cost,
                )  # fmt: skip
                self._producer.poll(0)
                self._maybe_report()
                return accepted
        codes = cached.code[slots]
        if codes.any():
            self._note_refusals(batch, slots, codes, cached)
            if self.strict:
                i = int(np.flatnonzero(codes)[0])
                raise InvalidSeries(_refusal(batch.series[i], cached.whys[slots[i]]))
        series_shard = cached.shard[slots]
        shard = series_shard[batch.series_idx]
        routable = shard >= 0
        in_range = (batch.timestamps >= lo) & (batch.timestamps <= hi)
        if not routable.all():
            per_reason = np.bincount(codes[batch.series_idx], minlength=len(SERIES_REASONS) + 1)
            for reason, n in zip(SERIES_REASONS, per_reason[1:].tolist(), strict=True):
                self._skip(reason.value, n)
        if routable.all() and in_range.all():
            order = _by_shard(shard, self.dataset.num_shards)  # input order kept within a shard
        else:
            self._skip(BadRecord.TIMESTAMP_RANGE.value, int((routable & ~in_range).sum()))
            rows = np.flatnonzero(routable & in_range)
            order = rows[_by_shard(shard[rows], self.dataset.num_shards)]
        accepted = 0
        if len(order):
            accepted = self._send_grouped(batch, cached, slots, series_shard, shard, order)
        self._producer.poll(0)
        self._maybe_report()
        return accepted

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until Kafka acknowledged every message; raise `GatewayError` if any failed."""
        remaining = self._producer.flush(timeout_s)
        if remaining:
            raise GatewayError(
                f"{remaining} messages to {self.topic!r} not acknowledged within {timeout_s} s"
            )
        self._raise_failures()
        self._report(final=False)

    def close(self, timeout_s: float = 60.0) -> None:
        """Flush, report the final progress, and refuse further sends."""
        if self._closed:
            return
        try:
            remaining = self._producer.flush(timeout_s)
            if remaining:
                raise GatewayError(
                    f"{remaining} messages to {self.topic!r} not acknowledged within {timeout_s} s"
                )
            self._raise_failures()
        finally:
            self._closed = True
            self._report(final=True)

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:  # keep the original exception; still try to deliver what was sent
            with contextlib.suppress(GatewayError):
                self.close()

    # ------------------------------------------------------------------------------ internals

    def _check_usable(self) -> None:
        if self._closed:
            raise GatewayError("the gateway is closed")
        self._raise_failures()

    def _raise_failures(self) -> None:
        c = self._c
        if c.fatal is not None:
            raise GatewayError(f"the Kafka producer of {self.topic!r} failed: {c.fatal}")
        if c.failed_messages:
            raise GatewayError(
                f"{c.failed_messages} messages to {self.topic!r} failed; first: {c.errors[0]}"
            )

    def _skip(self, reason: str, n: int) -> None:
        if n:
            self._c.skipped[reason] = self._c.skipped.get(reason, 0) + n

    def _slots_of(self, batch: SampleBatch, cache: _SeriesCache) -> npt.NDArray[np.intp]:
        """Each series' slot, cached or added (InvalidSeries for labels that are not str)."""
        series = batch.series
        if isinstance(batch, IntKeyedBatch) and len(batch.key_array) == len(series):
            found = cache.by_int_key.find(batch.key_array)
            missing = np.flatnonzero(found < 0)
            if len(missing):
                self._add_int_keys(batch, cache, found, missing)
            return found
        keys = batch.keys if isinstance(batch, KeyedBatch) else None
        if keys is not None and len(keys) == len(series):
            with contextlib.suppress(TypeError):  # None: a key not cached yet
                return np.fromiter(map(cache.by_key.get, keys), np.intp, len(keys))
            slots = list(map(cache.by_key.get, keys))
            if None in slots:
                for i, s in enumerate(slots):
                    if s is None:
                        slots[i] = cache.by_key[keys[i]] = self._slot(series[i], cache)
        else:
            get = cache.by_labels.get  # inline cache hit: this runs once per series per call
            slots = [get(tuple(labels.items())) for labels in series]
            if None in slots:
                for i, s in enumerate(slots):
                    if s is None:
                        slots[i] = self._slot(series[i], cache)
        return np.array(slots, np.intp)

    def _add_int_keys(
        self,
        batch: IntKeyedBatch,
        cache: _SeriesCache,
        found: npt.NDArray[np.intp],
        missing: npt.NDArray[np.intp],
    ) -> None:
        """The slots of the series `missing` from `cache.by_int_key` (new, or in `by_key`),
        into `found`; new keys added."""
        new: dict[int, int] = {}  # key -> slot
        for i in missing.tolist():
            key = int(batch.key_array[i])
            slot = new.get(key)
            if slot is None:
                slot = cache.by_key.get(key)
            if slot is None:
                slot = new[key] = self._slot(batch.series[i], cache)
            found[i] = slot
        if new:
            keys = np.fromiter(new, np.int64, len(new))
            slots = np.fromiter(new.values(), np.int64, len(new))
            with cache.lock:
                placed = cache.by_int_key.add(keys, slots)
                for k in np.flatnonzero(~placed).tolist():
                    cache.by_key[int(keys[k])] = int(slots[k])

    def _slot(self, labels: Mapping[str, str], cache: _SeriesCache) -> int:
        key = tuple(labels.items())
        slot = cache.by_labels.get(key)
        if slot is None:
            info = self._series(labels)
            with cache.lock:  # another gateway may have added it meanwhile
                slot = cache.by_labels.get(key)
                if slot is None:
                    slot = cache.by_labels[key] = cache.slots.add(info)
        return slot

    def _note_refusals(
        self,
        batch: SampleBatch,
        slots: npt.NDArray[np.intp],
        codes: npt.NDArray[np.int8],
        cached: _Slots,
    ) -> None:
        """Keep and log the first refused series of each reason (of this gateway)."""
        refused = np.flatnonzero(codes)
        found, first = np.unique(codes[refused], return_index=True)
        for code, i in sorted(
            zip(found.tolist(), refused[first].tolist(), strict=True), key=lambda x: x[1]
        ):
            reason = SERIES_REASONS[code - 1].value
            if reason not in self.rejected:
                self.rejected[reason] = _refusal(batch.series[i], cached.whys[int(slots[i])])
                _log.warning(
                    "%s: not sending samples of series breaking the dataset's contract "
                    "(%s); first: %s",
                    self.dataset.name,
                    reason,
                    self.rejected[reason],
                )

    def _series(self, labels: Mapping[str, str]) -> _Series:
        """What sending a new series takes: its shard and encoding, or why it is refused."""
        ds = self.dataset
        if not all(isinstance(x, str) for kv in labels.items() for x in kv):
            raise InvalidSeries(_refusal(labels, "label names and values must be str"))
        problem = series_problem(labels, ds.metric_column, ds.limits)
        if problem is not None:  # the ingesters would count it as a bad record
            reason, why = problem
            return _Series(-1, b"", len(labels), 0, SERIES_REASONS.index(reason) + 1, why)
        blob = encode_labels(labels)
        shard = shard_for_series(ds, labels)
        return _Series(shard, blob, len(labels), len(blob) + _SERIES_OVERHEAD)

    def _send_grouped(
        self,
        batch: SampleBatch,
        cached: _Slots,
        slots: npt.NDArray[np.intp],
        series_shard: npt.NDArray[np.int32],
        shard: npt.NDArray[np.int32],
        order: npt.NDArray[np.intp],
    ) -> int:
        """Send the rows `order` (grouped by shard, input order within one). The series table
        of every shard's message is built here at once; a shard whose samples need several
        messages gets per-piece tables (`_send_split`, `_send_piece`)."""
        sorted_shards = shard[order]
        cuts = np.flatnonzero(sorted_shards[1:] != sorted_shards[:-1]) + 1
        bounds = np.array([0, *cuts.tolist(), len(order)], np.int64)
        group_shards = sorted_shards[bounds[:-1]]
        if len(batch.series) == len(batch) and (batch.series_idx[order] == order).all():
            # each row its own series (a scrape of remote write or line protocol): the rows'
            # order is the series' order, and each row's index in its message is its place
            used_sorted = order
            series_start, series_end = bounds[:-1], bounds[1:]
            local_all = np.arange(len(order))
        else:
            # The series used, sorted by (shard, series index), and each row's index among its
            # shard's series: what np.unique(..., return_inverse) per message would give.
            used, inverse = np.unique(batch.series_idx[order], return_inverse=True)
            by_shard = np.argsort(series_shard[used], kind="stable")
            used_sorted = used[by_shard]
            rank = np.empty(len(used), np.intp)
            rank[by_shard] = np.arange(len(used))
            series_start = np.searchsorted(series_shard[used_sorted], group_shards)
            series_end = np.searchsorted(series_shard[used_sorted], group_shards, side="right")
            local_all = rank[inverse.reshape(-1)]
        cost_cum = np.concatenate(([0], np.cumsum(cached.cost[slots[used_sorted]])))
        # Every message's columns at once: each shard's rows are contiguous in `order`, so
        # its message's timestamp base and widest offset are one reduceat each.
        starts = bounds[:-1]
        ts_sorted = batch.timestamps[order]
        bases = np.minimum.reduceat(ts_sorted, starts)
        offsets = ts_sorted.view(np.uint64) - np.repeat(bases.view(np.uint64), np.diff(bounds))
        wide = np.maximum.reduceat(offsets, starts) > 0xFFFFFFFF
        return self._send_groups(
            batch, cached, slots, order, bounds, group_shards, used_sorted,
            np.append(series_start, series_end[-1:]).astype(np.int64),
            (local_all - np.repeat(series_start, np.diff(bounds))).astype(np.int64),
            bases, offsets, wide, cost_cum[series_end] - cost_cum[series_start],
        )  # fmt: skip

    def _send_groups(
        self,
        batch: SampleBatch,
        cached: _Slots,
        slots: npt.NDArray[np.intp],
        order: npt.NDArray[np.intp],
        bounds: npt.NDArray[np.int64],
        group_shards: npt.NDArray[np.int32],
        used_sorted: npt.NDArray[np.intp],
        series_bounds: npt.NDArray[np.int64],
        local: npt.NDArray[np.int64],
        bases: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.uint64],
        wide: npt.NDArray[np.bool_],
        group_cost: npt.NDArray[np.int64],
    ) -> int:
        """Send message g of the rows `order[bounds[g]:bounds[g + 1]]` to shard
        `group_shards[g]`: its series are `used_sorted[series_bounds[g]:series_bounds[g + 1]]`
        (`local`: each row's index among them), `bases[g]` its timestamps' base (`offsets`:
        each row's), `wide[g]` if an offset needs 8 bytes, `group_cost[g]` its series table's
        size. Every message's body is laid out at once in compiled code (a shard whose
        samples need several messages, for the size or sample caps, is split instead)."""
        used_slots = slots[used_sorted]
        bodies = encode_bodies(
            bounds, series_bounds, wide, batch.values[order], offsets, local,
            cached.n_labels[used_slots], used_slots.astype(np.int64), cached.arena,
            cached.blob_start, cached.blob_len,
        )  # fmt: skip
        bounds_list, series_list = bounds.tolist(), series_bounds.tolist()
        wide_list, bases_list, cost_list = wide.tolist(), bases.tolist(), group_cost.tolist()
        shards_list = group_shards.tolist()
        table: _Table | None = None  # the batch's series table, for per-piece tables

        def batch_table() -> _Table:
            nonlocal table
            if table is None:
                blobs = cached.blobs[slots].tolist()
                table = _Table(blobs, cached.n_labels[slots], cached.cost[slots])
            return table

        target = 0.85 * self.max_message_bytes  # headroom for a worse ratio than learnt
        accepted = 0
        for g, (a, b) in enumerate(itertools.pairwise(bounds_list)):
            sa, sb = series_list[g], series_list[g + 1]
            n_rows = b - a
            raw_bound = HEADER.size + cost_list[g] + _SAMPLE_BYTES_BOUND * n_rows
            pieces = max(
                math.ceil(n_rows / self.max_message_samples),
                math.ceil(raw_bound * self._ratio / target),
            )
            shard_id = shards_list[g]
            rows = order[a:b]
            if pieces > 1:
                accepted += self._send_split(shard_id, batch, rows, batch_table(), pieces)
                continue
            message = finish(
                bodies[g], sb - sa, n_rows, wide_list[g], bases_list[g], self.compression_level
            )
            self._ratio = 0.8 * self._ratio + 0.2 * min(len(message) / raw_bound, 1.0)
            if len(message) > self.max_message_bytes:  # as `_send_piece` does
                if n_rows == 1:
                    self._skip(TOO_LARGE, 1)
                    continue
                half = n_rows // 2
                accepted += self._send_piece(shard_id, batch, rows[:half], batch_table())
                accepted += self._send_piece(shard_id, batch, rows[half:], batch_table())
                continue
            self._produce(shard_id, message, n_rows)
            accepted += n_rows
        return accepted

    def _send_split(
        self,
        shard: int,
        batch: SampleBatch,
        rows: npt.NDArray[np.intp],
        table: _Table,
        pieces: int,
    ) -> int:
        """Send one shard's samples as `pieces` messages (the size and sample caps)."""
        return sum(self._send_piece(shard, batch, p, table) for p in np.array_split(rows, pieces))

    def _send_piece(
        self, shard: int, batch: SampleBatch, rows: npt.NDArray[np.intp], table: _Table
    ) -> int:
        used, local_idx = np.unique(batch.series_idx[rows], return_inverse=True)
        blobs = table.blobs
        message = encode_binary_parts(
            [blobs[i] for i in used.tolist()],
            table.n_labels[used],
            local_idx.reshape(-1),
            batch.timestamps[rows],
            batch.values[rows],
            self.compression_level,
        )
        raw_bound = HEADER.size + int(table.cost[used].sum()) + _SAMPLE_BYTES_BOUND * len(rows)
        self._ratio = 0.8 * self._ratio + 0.2 * min(len(message) / raw_bound, 1.0)
        if len(message) > self.max_message_bytes:
            if len(rows) == 1:
                self._skip(TOO_LARGE, 1)
                return 0
            half = len(rows) // 2
            return self._send_piece(shard, batch, rows[:half], table) + self._send_piece(
                shard, batch, rows[half:], table
            )
        self._produce(shard, message, len(rows))
        return len(rows)

    def _produce(self, shard: int, message: bytes, n_samples: int) -> None:
        acks = self._acks
        c = self._c
        explain = self._errors.explain  # names a refused password, an untrusted certificate

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                c.samples_acked += n_samples
                c.messages_acked += 1
            else:
                if err.fatal():
                    c.fatal = c.fatal or str(err)
                if acks is None:
                    c.failed_messages += 1
                    if len(c.errors) < 10:
                        c.errors.append(explain(f"partition {shard}: {err}"))
                else:
                    c.tracked_failures += 1
            if acks is not None:
                failed = None if err is None else explain(f"partition {shard}: {err}")
                acks.answered(n_samples, failed)

        while True:
            try:
                self._producer.produce(
                    self.topic, value=message, partition=shard, on_delivery=delivered
                )
                break
            except BufferError:  # local queue full: let deliveries drain it
                self._producer.poll(0.1)
        if acks is not None:
            acks.sent()
        c.samples_sent += n_samples
        c.messages_sent += 1
        c.bytes_sent += len(message)
        self._samples_per_shard[shard] += n_samples
        self._messages_per_shard[shard] += 1

    def _maybe_report(self) -> None:
        if self._progress is not None:
            now = time.monotonic()
            if now - self._last_report >= self._progress_interval_s:
                self._report(final=False)

    def _report(self, final: bool) -> None:
        self._last_report = time.monotonic()
        if self._progress is not None:
            self._progress(self.progress(final))


@kernel
def _scrape_plan(
    slots: npt.NDArray[np.int64],
    series_idx: npt.NDArray[np.int32],
    ts: npt.NDArray[np.int64],
    shard_of: npt.NDArray[np.int32],
    code_of: npt.NDArray[np.int8],
    cost_of: npt.NDArray[np.int64],
    lo: int,
    hi: int,
    num_shards: int,
) -> tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int32],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.uint64],
    npt.NDArray[np.bool_],
    npt.NDArray[np.int64],
]:
    """A scrape's messages in one pass, what `_send_grouped` computes in NumPy: for a batch of
    one sample per series (row i of series i), every series sendable (`slots`' shard and code)
    and every timestamp within [lo, hi], the rows grouped by shard in input order (a counting
    sort), the groups' bounds and shards, each row's index in its group, each group's
    timestamp base (its minimum), each row's offset from it (modulo 2**64), whether a group
    needs 8-byte offsets and its series table's size. Empty arrays for any other batch."""
    n = series_idx.shape[0]
    starts = np.zeros(num_shards + 1, np.int64)
    for i in range(n):
        s = slots[i]
        shard = shard_of[s]
        if series_idx[i] != i or code_of[s] != 0 or shard < 0 or ts[i] < lo or ts[i] > hi:
            e = np.empty(0, np.int64)
            return (
                e,
                e,
                np.empty(0, np.int32),
                e,
                e,
                np.empty(0, np.uint64),
                np.empty(0, np.bool_),
                e,
            )
        starts[shard + 1] += 1
    groups = 0
    for k in range(num_shards):
        groups += starts[k + 1] > 0
        starts[k + 1] += starts[k]
    place = starts[:-1].copy()
    order = np.empty(n, np.int64)
    for i in range(n):
        shard = shard_of[slots[i]]
        order[place[shard]] = i
        place[shard] += 1
    bounds = np.empty(groups + 1, np.int64)
    group_shards = np.empty(groups, np.int32)
    g = 0
    for k in range(num_shards):
        if starts[k + 1] > starts[k]:
            bounds[g] = starts[k]
            group_shards[g] = k
            g += 1
    bounds[groups] = n
    local = np.empty(n, np.int64)
    bases = np.empty(groups, np.int64)
    offsets = np.empty(n, np.uint64)
    wide = np.zeros(groups, np.bool_)
    cost = np.zeros(groups, np.int64)
    bits = ts.view(np.uint64)
    for g in range(groups):
        a, b = bounds[g], bounds[g + 1]
        lowest = order[a]
        for j in range(a + 1, b):
            if ts[order[j]] < ts[lowest]:
                lowest = order[j]
        bases[g] = ts[lowest]
        base_bits = bits[lowest]
        widest = np.uint64(0)
        for j in range(a, b):
            i = order[j]
            offsets[j] = bits[i] - base_bits
            widest = max(widest, offsets[j])
            local[j] = j - a
            cost[g] += cost_of[slots[i]]
        wide[g] = widest > np.uint64(0xFFFFFFFF)
    return order, bounds, group_shards, local, bases, offsets, wide, cost


@warms
def _warm() -> None:
    """`_scrape_plan` with the argument types `Gateway.send_batch` gives it."""
    one = np.zeros(1, np.int64)
    _scrape_plan(
        one, np.zeros(1, np.int32), one, np.zeros(1, np.int32), np.zeros(1, np.int8), one,
        -(2**63), 2**63 - 1, 1,
    )  # fmt: skip


def _by_shard(shard: npt.NDArray[np.int32], num_shards: int) -> npt.NDArray[np.intp]:
    """The rows grouped by shard (>= 0), in input order within one: a stable argsort, on bytes
    for up to 256 shards (a radix sort, several times faster than on int32)."""
    if num_shards <= 256:
        return np.argsort(shard.astype(np.uint8), kind="stable")
    return np.argsort(shard, kind="stable")


def _refusal(labels: Mapping[str, str], why: str) -> str:
    """A short, clear message: the rule broken and the series (clipped)."""
    shown = ", ".join(f"{k!r}: {v!r}"[:80] for k, v in list(labels.items())[:6])
    more = f", ... ({len(labels)} labels)" if len(labels) > 6 else ""
    return f"{why}; series {{{shown}{more}}}"


def _batch(series: list[Labels], idx: list[int], ts: list[int], vals: list[float]) -> SampleBatch:
    return SampleBatch(
        series,
        np.array(idx, dtype=np.int32),
        np.array(ts, dtype=np.int64),
        np.array(vals, dtype=np.float64),
    )
