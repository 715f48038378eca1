"""Producer-side gateway: samples in, FiloPy binary messages out, each on its shard's partition.

Routing work is per series and cached (series repeat across scrapes); per-sample work is NumPy:
one gather for each sample's shard, one stable argsort to group by shard, one `np.unique` per
message to build its series table. Messages are kept under a size cap by splitting a shard's
samples into pieces sized from the compression ratio seen so far. The producer is idempotent
with acks=all, so a retried send never duplicates or reorders samples within a partition.

Not thread-safe: use one Gateway per producing thread.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from confluent_kafka import KafkaError, Message, Producer

from filopy.dataset import Dataset
from filopy.errors import Invalid, Unavailable
from filopy.hashing import shard_for_series
from ingest.bad_records import DEFAULT_TS_RANGE, SERIES_REASONS, BadRecord, series_problem
from ingest.batch import Labels, SampleBatch
from ingest.binary_format import (
    DEFAULT_COMPRESSION_LEVEL,
    HEADER,
    encode_binary_parts,
    encode_labels,
)
from ingest.topics import DEFAULT_TIMEOUT_S, check_topic

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


@dataclass(slots=True)
class _Counters:
    samples_sent: int = 0
    messages_sent: int = 0
    bytes_sent: int = 0
    samples_acked: int = 0
    messages_acked: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    failed_messages: int = 0


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
        self._cache: dict[tuple[tuple[str, str], ...], _Series] = {}
        self._cache_size = series_cache_size
        # Encoded size / raw-size bound, learnt from sent messages; sizes the pieces of a shard.
        self._ratio = 1.0
        self._samples_per_shard = [0] * dataset.num_shards
        self._messages_per_shard = [0] * dataset.num_shards
        self._c = _Counters()
        self._closed = False
        if verify_topic:  # a wrong partition count would route samples to the wrong shards
            check_topic(dataset, self.bootstrap_servers, timeout_s)
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
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

    def send_batch(self, batch: SampleBatch) -> int:
        """Send a columnar batch; returns how many samples were accepted (not skipped)."""
        self._check_usable()
        if len(batch) == 0:
            return 0
        get = self._cache.get  # inline cache hit: this runs once per series per call
        infos = [get(tuple(labels.items())) or self._series(labels) for labels in batch.series]
        shards, blobs, n_labels, cost, codes, whys = zip(*infos, strict=True)
        if self.strict and any(codes):
            i = next(i for i, c in enumerate(codes) if c)
            raise InvalidSeries(_refusal(batch.series[i], whys[i]))
        table = _Table(list(blobs), np.array(n_labels, np.int64), np.array(cost, np.int64))
        shard = np.array(shards, np.int32)[batch.series_idx]
        lo, hi = self._ts_range
        routable = shard >= 0
        in_range = (batch.timestamps >= lo) & (batch.timestamps <= hi)
        keep = routable & in_range
        if not routable.all():
            sample_codes = np.array(codes, np.int8)[batch.series_idx]
            per_reason = np.bincount(sample_codes, minlength=len(SERIES_REASONS) + 1)
            for reason, n in zip(SERIES_REASONS, per_reason[1:].tolist(), strict=True):
                self._skip(reason.value, n)
        self._skip(BadRecord.TIMESTAMP_RANGE.value, int((routable & ~in_range).sum()))
        rows = np.flatnonzero(keep)
        order = rows[np.argsort(shard[rows], kind="stable")]  # input order kept within a shard
        sorted_shards = shard[order]
        cuts = np.flatnonzero(sorted_shards[1:] != sorted_shards[:-1]) + 1
        accepted = 0
        for piece in np.split(order, cuts):
            if len(piece):
                accepted += self._send_shard(int(shard[piece[0]]), batch, piece, table)
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
        if c.failed_messages:
            raise GatewayError(
                f"{c.failed_messages} messages to {self.topic!r} failed; first: {c.errors[0]}"
            )

    def _skip(self, reason: str, n: int) -> None:
        if n:
            self._c.skipped[reason] = self._c.skipped.get(reason, 0) + n

    def _series(self, labels: Mapping[str, str]) -> _Series:
        key = tuple(labels.items())
        info = self._cache.get(key)
        if info is None:
            ds = self.dataset
            if not all(isinstance(x, str) for kv in key for x in kv):
                raise InvalidSeries(_refusal(labels, "label names and values must be str"))
            problem = series_problem(labels, ds.metric_column, ds.limits)
            if problem is not None:  # the ingesters would count it as a bad record
                reason, why = problem
                info = _Series(-1, b"", len(labels), 0, SERIES_REASONS.index(reason) + 1, why)
                if reason.value not in self.rejected:
                    self.rejected[reason.value] = _refusal(labels, why)
                    _log.warning(
                        "%s: not sending samples of series breaking the dataset's contract "
                        "(%s); first: %s",
                        ds.name,
                        reason.value,
                        self.rejected[reason.value],
                    )
            else:
                blob = encode_labels(labels)
                shard = shard_for_series(ds, labels)
                info = _Series(shard, blob, len(labels), len(blob) + _SERIES_OVERHEAD)
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            self._cache[key] = info
        return info

    def _send_shard(
        self, shard: int, batch: SampleBatch, rows: npt.NDArray[np.intp], table: _Table
    ) -> int:
        """Send one shard's samples as few messages as the size and sample caps allow."""
        used = np.unique(batch.series_idx[rows])
        raw_bound = HEADER.size + int(table.cost[used].sum()) + _SAMPLE_BYTES_BOUND * len(rows)
        target = 0.85 * self.max_message_bytes  # headroom for a worse ratio than learnt
        pieces = max(
            math.ceil(len(rows) / self.max_message_samples),
            math.ceil(raw_bound * self._ratio / target),
        )
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
        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                self._c.samples_acked += n_samples
                self._c.messages_acked += 1
            else:
                self._c.failed_messages += 1
                if len(self._c.errors) < 10:
                    self._c.errors.append(f"partition {shard}: {err}")

        while True:
            try:
                self._producer.produce(
                    self.topic, value=message, partition=shard, on_delivery=delivered
                )
                break
            except BufferError:  # local queue full: let deliveries drain it
                self._producer.poll(0.1)
        c = self._c
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
