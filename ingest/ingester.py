"""The Kafka-partition ingester: one shard's partition into its memstore, flushed and checkpointed.

Lifecycle, on its own thread (confluent-kafka's consumer blocks; decoding is NumPy):
claim the shard's ownership epoch; read checkpoints, stored part keys and the checkpoints'
open-buffer snapshots (`recover_shard`); note the partition's end offset; replay from the lowest
checkpoint + 1, reporting `RecoveryInProgress` in ~5% steps, then `IngestionStarted`; from then on
consume, ingest and let the flusher write chunks, snapshots and fenced checkpoints. The consumer
is `assign()`ed to exactly its partition at an explicit offset: no consumer group rebalancing, no
offsets committed to Kafka (checkpoints live in the MetaStore). A `StaleEpochError` means another
node owns the shard now: stop, log a WARNING and count it (`stale_epoch_rejections`).

Outages are not ingestion errors. A store outage (`StoreUnavailable`/`StoreTimeout`) while claiming
the epoch or reading checkpoints is retried with backoff; during flushes the flusher retries with
backoff while this thread keeps consuming into memory, up to `ingest.max_unflushed_samples`, past
which it pauses the partition (never drops) until flushes get through. Transient Kafka errors (no
partition leader yet, lost connection) are ridden out quietly for `ingest.kafka_retry_timeout_s`,
then retried on. Meanwhile the shard is reported `IngestionDegraded` with the reason, and
`IngestionStarted` again once all is well. Any other unrecoverable error (a data error, a bug) is
reported as `IngestionError` and releases the shard.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from core.backoff import Backoff
from core.config import Settings
from core.dataset import Dataset
from core.errors import Unavailable
from core.shard_status import (
    IngestionDegraded,
    IngestionError,
    IngestionStarted,
    RecoveryInProgress,
    ShardEvent,
)
from core.worker import CheckedWorker, Worker
from ingest.base import EventReporter, ReportingIngester
from ingest.downsampler import Downsampler, DownsampleWorker
from ingest.flush import Flusher, recover_shard
from ingest.kafka_config import ConnectionErrors, kafka_client_config
from ingest.memstore import ShardMemstore
from ingest.records import decoder_for
from ingest.shard_reader import read_merged
from ingest.tenure import Tenure, note_release, noted_release, offsets_read_before, record
from store import ColumnStore, MetaStore, StaleEpochError, StoreUnavailable
from store.api import LabelMatcher

log = logging.getLogger(__name__)

PROGRESS_STEP_PCT = 5
T = TypeVar("T")

# Errors a healthy cluster passes through: a partition without a leader (just created, or during
# an election), a topic not yet in the broker's metadata, a lost connection. librdkafka does not
# flag all of them retriable() when a synchronous call such as get_watermark_offsets fails.
_TRANSIENT = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,  # timed out still queued to a broker it cannot reach
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
    }
)


def is_transient(err: KafkaError) -> bool:
    """Whether a Kafka error may clear up by itself, so the call is worth retrying."""
    return not err.fatal() and (err.retriable() or err.code() in _TRANSIENT)


PROBE_TIMEOUT_S = 2.0  # a broker asked for a partition's offsets answers in ms when reachable


class _Stopped(Exception):
    """Told to stop while waiting for Kafka or the store."""


# Stale-epoch commit rejections in this process, per (dataset, shard): the ingester that met
# one is gone by the time anyone scrapes, so the count outlives it (every ingester of the dataset
# on this node reports the dataset's counts in `stats()`).
_stale_lock = threading.Lock()
_stale_epoch_rejections: Counter[tuple[str, int]] = Counter()


def stale_epoch_rejections(dataset: str) -> dict[int, int]:
    """Per shard of `dataset`: checkpoint commits this process had rejected as stale."""
    with _stale_lock:
        return {s: n for (d, s), n in _stale_epoch_rejections.items() if d == dataset}


def _watermarks(consumer: Consumer, partition: TopicPartition) -> tuple[int, int]:
    """The partition's offsets, asked of the broker. On failure the consumer is polled once
    (nothing is assigned yet, so no message is taken), which hands the error callback why its
    connections failed."""
    try:
        return consumer.get_watermark_offsets(partition, timeout=5)
    except KafkaException:
        consumer.poll(0)
        raise


class KafkaShardIngester(ReportingIngester):
    """Ingests one shard from its Kafka partition until `stop()`."""

    def __init__(
        self,
        dataset: Dataset,
        shard: int,
        node: str,
        *,
        meta: MetaStore,
        columns: ColumnStore,
        settings: Settings,
        report: EventReporter,
    ) -> None:
        self.dataset, self.shard, self.node = dataset, shard, node
        self._meta, self._columns, self._settings = meta, columns, settings
        super().__init__(report)
        self._worker = Worker(f"ingest-{dataset.name}-{shard}", self._run)
        # The dataset's own store options win over the node's [ingest] defaults.
        self._ingest = cfg = settings.ingest.model_copy(update=dataset.store.overrides())
        self.memstore = ShardMemstore(
            dataset,
            shard,
            groups_per_shard=cfg.groups_per_shard,
            max_chunk_samples=cfg.max_chunk_samples,
            chunk_span_ms=cfg.chunk_span_ms,
            retention_ms=cfg.memory_retention_ms,
            max_samples=cfg.max_samples_per_shard,
        )
        self.bad_records: Counter[str] = Counter()
        self.messages = 0
        self.offsets_lost = 0  # offsets retention dropped before they were checkpointed
        self.replayed_from: int | None = None  # first offset read at start; > 0: checkpoints used
        # Offsets read at start that an owner before this one had read (`offsets_read_before`):
        # 0 after a drain; after a kill, all from `replayed_from` to the end offset at the claim.
        self.replayed_offsets = 0
        self.open_samples_loaded = 0  # from the checkpoints' open-buffer snapshots at start
        self.downsampler: Downsampler | None = None  # made with the flusher
        self.flusher: Flusher | None = None
        # Consumer lag = end of the partition (as of the last fetch) - the next offset to read.
        self.end_offset: int | None = None
        self.next_offset: int | None = None
        # The Kafka timestamp (ms) of the newest record read, None until one with a timestamp:
        # how far behind in time the ingester is while records wait (ingest/topics.py).
        self.read_ts_ms: int | None = None
        # When (wall ms) the ingester last knew it had read the partition to its end: from a
        # fetch that brought records, or a probe asking the broker (never from the end offset
        # cached by fetches alone, which a stalled fetch leaves stale). With `read_ts_ms`, how
        # old the oldest unread record can be while a shard that read nothing lately is behind.
        self.current_ms: int | None = None
        self.recovery_s: float | None = None  # from start to IngestionStarted
        self._started = time.monotonic()
        # Health: what is wrong now (None: nothing), and what was last reported about it.
        self._live_now = False  # replay done (IngestionStarted is the healthy status)
        self._recovery_pct = 0
        self._store_problem: str | None = None  # store unreachable outside the flusher
        self._kafka_since: float | None = None  # first transient Kafka error of a streak
        self._kafka_error: str | None = None
        self.paused = False  # consumption paused: too many unflushed samples
        self.pauses = 0
        self._health_key: tuple[object, ...] | None = None
        self._tenure: Tenure | None = None  # this ingester's hold on the shard, once claimed
        self._errors = ConnectionErrors()  # why Kafka connections fail, for the Degraded reason
        self._flushing: _FlushThread | None = None  # while consuming: runs `delete_series`

    async def start(self) -> None:
        self._worker.start()

    async def stop(self) -> None:
        """Stop consuming, flush what is in memory (a clean handoff), and wait for the thread."""
        if not self._worker.stop(timeout=0):  # told at once, waited for off the event loop
            await asyncio.to_thread(self._worker.stop)

    # ----- the ingestion thread --------------------------------------------------------------

    def _consumer(self) -> Consumer:
        cfg = self._ingest
        return Consumer(
            {
                **kafka_client_config(
                    self._settings.kafka, self.dataset.source.bootstrap_servers, self._errors
                ),
                # Required by librdkafka even though FiloPy never joins a group or commits.
                "group.id": f"filopy-{self.dataset.name}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": False,
                "fetch.wait.max.ms": cfg.fetch_wait_max_ms,
                "queued.min.messages": cfg.queued_min_messages,
                "queued.max.messages.kbytes": cfg.queued_max_messages_kbytes,
                "fetch.queue.backoff.ms": cfg.fetch_queue_backoff_ms,
            }
        )

    def _run(self) -> None:
        ref, shard = self.dataset.ref, self.shard
        consumer: Consumer | None = None
        flusher: Flusher | None = None
        try:
            self._epoch = self._store_retrying(
                "claiming the shard", lambda: self._meta.claim_epoch(ref, shard, self.node)
            )
            self._tenure = Tenure(ref.name, shard, self.node, self._epoch, time.time())
            consumer = self._consumer()
            partition = TopicPartition(self.dataset.topic, shard)
            low, high = self._retrying(
                "reading the partition's offsets",
                lambda: _watermarks(consumer, partition),
            )
            plan = self._store_retrying(
                "reading checkpoints",
                lambda: recover_shard(self.memstore, self._meta, self._columns, ref, shard, high),
            )
            start = plan.start_offset
            self.open_samples_loaded = plan.open_samples_loaded
            if plan.open_samples_loaded:
                log.info(
                    "%s shard %d: %d open samples loaded from the checkpoints' snapshots",
                    ref.name,
                    shard,
                    plan.open_samples_loaded,
                )
            if start is not None and start < low:
                self.offsets_lost = low - start
                lost = (
                    f"Kafka retention dropped offsets {start}..{low - 1} of partition {shard} "
                    f"before they were checkpointed: {low - start} offsets lost"
                )
                log.warning("%s shard %d: %s", ref.name, shard, lost)
                # Subscribers hear it too, not only the log and the offsets_lost metric.
                self._emit(RecoveryInProgress(ref, shard, self.node, 0, lost))
            first = low if start is None else max(start, low)
            self.replayed_from = first
            self.replayed_offsets = self._replayed(first, high, plan.checkpoints)
            self.end_offset, self.next_offset = high, first
            self._tenure = replace(self._tenure, first_offset=first, end_offset=high)
            down = self._settings.downsample
            if down.resolutions_ms:
                self.downsampler = Downsampler(
                    self.memstore, self._columns, self._meta, ref, shard, self._epoch,
                    down.resolutions_ms, delay_ms=round(down.delay_s * 1000),
                    interval_s=down.interval_s,
                )  # fmt: skip
                # Before the replay: a replayed sample older than a mark is late (and redone).
                self._store_retrying("reading downsample marks", self.downsampler.marks)
            self.flusher = flusher = Flusher(
                self.memstore,
                self._columns,
                self._meta,
                ref,
                shard,
                self._epoch,
                flush_interval_s=self._ingest.flush_interval_s,
                checkpoints=plan.checkpoints,
                retry_initial_s=self._ingest.store_retry_initial_s,
                retry_max_s=max(self._ingest.store_retry_max_s, self._ingest.store_retry_initial_s),
                before_checkpoint=self.downsampler.keep_late if self.downsampler else None,
            )
            consumer.assign(
                [
                    TopicPartition(
                        self.dataset.topic, shard, OFFSET_BEGINNING if start is None else first
                    )
                ]
            )
            self._consume(consumer, flusher, first, high)
            self._final_flush(flusher)
        except StaleEpochError as e:
            with _stale_lock:
                _stale_epoch_rejections[(ref.name, shard)] += 1
            log.warning("%s shard %d: another node owns it now (%s); stopping", ref.name, shard, e)
        except _Stopped:
            pass
        except Exception as e:
            log.exception("%s shard %d: ingestion failed", ref.name, shard)
            self._emit(IngestionError(ref, shard, self.node, f"{type(e).__name__}: {e}"))
        finally:
            if consumer is not None:
                consumer.close()
            if self._tenure is not None:
                self._tenure = self._tenure.released(self.next_offset)
                record(self._tenure)
                self._note_release(self._tenure)

    def _note_release(self, held: Tenure) -> None:
        """Tell the next owner where this one stopped (`note_release`): past the end offset it
        started from if it went live, else owners before it may have read up to there."""
        if held.next_offset is None or held.end_offset is None:
            return  # it never got to read
        read_to = held.next_offset
        if not self._live_now:
            read_to = max(read_to, held.end_offset)
        note_release(self._columns, self.dataset.ref, self.shard, held.epoch, read_to)

    def _replayed(self, first: int, high: int, checkpoints: Mapping[int, int]) -> int:
        """The offsets from `first` that an owner before this one had read (`offsets_read_before`):
        exact when the previous owner noted where it stopped, else all below `high`. The epoch
        before this one is the previous claim's (no note under it: no such claim, or a kill)."""
        noted = None
        if self._epoch > 1:
            ref, shard, before = self.dataset.ref, self.shard, self._epoch - 1
            noted = self._store_retrying(
                "reading where the last owner stopped",
                lambda: noted_release(self._columns, ref, shard, before),
            )
        return offsets_read_before(
            first, high, checkpoints, earlier_owner=self._epoch > 1, noted=noted
        )

    @property
    def tenure(self) -> Tenure | None:
        """This ingester's hold on the shard (None before its claim); while held, with how far
        it has read so far, so a node's log tells even of the holds a kill will cut short."""
        held = self._tenure
        if held is None or held.released_at is not None:
            return held
        return replace(held, next_offset=self.next_offset)

    def _final_flush(self, flusher: Flusher) -> None:
        """A clean handoff: flush everything so the next owner replays nothing. With the store
        out, give up after one try: the next owner replays from the last checkpoints instead."""
        try:
            flusher.flush_all()
        except StoreUnavailable as e:
            log.warning(
                "%s shard %d: could not flush on stop (%s); the next owner replays from the "
                "last checkpoints",
                self.dataset.name,
                self.shard,
                e,
            )

    def _consume(self, consumer: Consumer, flusher: Flusher, first: int, high: int) -> None:
        ref, shard, cfg = self.dataset.ref, self.shard, self._ingest
        decode = decoder_for(self.dataset)
        partition = TopicPartition(self.dataset.topic, shard)
        backlog = max(0, high - first)
        # Replaying (status Recovery, with progress) lasts until the end offset seen at start;
        # the memstore's flush hold only until the seal mark, usually much sooner.
        replaying = backlog > 0
        if replaying:
            self._emit(RecoveryInProgress(ref, shard, self.node, 0))
            self._health_key = None
            self._report_health()
        else:
            self.current_ms = int(time.time() * 1000)
            self.memstore.end_recovery()
            self._live()
        last_bad_log = last_misrouted_log = 0.0
        last_heard = time.monotonic()  # the last message, or the last answer to a probe
        idle_probe_s = min(15.0, max(1.0, cfg.kafka_retry_timeout_s / 4))
        limit = cfg.max_unflushed_samples
        # Flushes run on a thread of their own, so the store's latency (a Cassandra round trip,
        # an SQLite commit) overlaps consuming instead of stalling it.
        flushing = self._flushing = _FlushThread(
            flusher, lambda: self.paused, f"flush-{ref.name}-{shard}"
        )
        downsampling = (
            None
            if self.downsampler is None
            else DownsampleWorker(
                self.downsampler,
                lambda: flusher.store_error is None,
                f"downsample-{ref.name}-{shard}",
            )
        )
        try:
            while not self._worker.stopping:
                flushing.check()
                if downsampling is not None:
                    downsampling.check()
                if self._pause_or_resume(consumer, partition):
                    # Paused: nothing to read until flushes get through; the flush thread flushes
                    # (or retries) every group meanwhile.
                    flushing.wake()
                    self._report_health()
                    self._worker.wait(cfg.consume_timeout_s)
                    continue
                got = False
                for m in consumer.consume(
                    num_messages=cfg.consume_batch, timeout=cfg.consume_timeout_s
                ):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            continue
                        if not is_transient(err):
                            raise KafkaException(err)
                        self._kafka_trouble(err)
                        continue
                    got = True
                    ts_type, ts_ms = m.timestamp()
                    if ts_type != TIMESTAMP_NOT_AVAILABLE:
                        self.read_ts_ms = ts_ms
                    decoded = decode(m.value() or b"", ts_ms)
                    bad = decoded.batch.bad_records
                    if bad:
                        self.bad_records.update(bad)
                        now = time.monotonic()
                        if now - last_bad_log >= cfg.bad_record_log_interval_s:
                            last_bad_log = now
                            log.warning(
                                "%s shard %d: skipped bad records %s at offset %d, e.g. %r",
                                ref.name,
                                shard,
                                dict(bad),
                                m.offset(),
                                decoded.first_bad,
                            )
                    st = self.memstore.ingest(decoded.batch, m.offset())
                    if st.misrouted:
                        now = time.monotonic()
                        if now - last_misrouted_log >= cfg.bad_record_log_interval_s:
                            last_misrouted_log = now
                            log.warning(
                                "%s shard %d: %d samples at offset %d belong to another shard by "
                                "the dataset's shard key (kept; queries routed by shard key miss "
                                "them: producers must route by FiloPy's hash or use the gateway), "
                                "e.g. series %s",
                                ref.name,
                                shard,
                                st.misrouted,
                                m.offset(),
                                self.memstore.part_key(st.first_misrouted),
                            )
                    self.messages += 1
                    self.next_offset = m.offset() + 1
                    if self.memstore.unflushed_samples() > limit:
                        # Over the memory bound: leave the rest of the batch to be read again.
                        consumer.seek(TopicPartition(self.dataset.topic, shard, self.next_offset))
                        break
                now = time.monotonic()
                if got:
                    self._kafka_since = self._kafka_error = None
                    last_heard = now
                elif self._kafka_since is not None or now - last_heard >= idle_probe_s:
                    # Nothing read: an idle partition, or a broker we no longer reach (a cut
                    # link shows no error until requests time out, ~a minute): ask it.
                    last_heard = now
                    self._probe_kafka(consumer, partition)
                # The end offset librdkafka learnt from its last fetch: no request to the broker.
                _, end = consumer.get_watermark_offsets(partition, cached=True)
                if end >= 0:
                    self.end_offset = end
                    if got and self.next_offset is not None and self.next_offset >= end:
                        self.current_ms = int(time.time() * 1000)
                if replaying and self._replay_progress(consumer, first, high):
                    replaying = False
                    self._live()
                self._report_health()
        finally:
            self._flushing = None
            if downsampling is not None:
                downsampling.stop()
            flushing.stop()
        flushing.check()
        if downsampling is not None:
            downsampling.check()

    def _replay_progress(self, consumer: Consumer, first: int, high: int) -> bool:
        """Whether the consumer passed the end offset seen at start (the replay is over: the
        flush hold too, if offsets without a message kept it); report `RecoveryInProgress` in
        steps meanwhile."""
        position = self._position(consumer)
        backlog = max(0, high - first)
        # The consumer's position also covers a backlog ending in offsets that carry no message
        # (e.g. transaction markers).
        read = max(self.next_offset or 0, position or 0)
        if read >= high:
            self.memstore.end_recovery()
            return True
        if position is not None and backlog > 0:
            pct = min(99, int(100 * (position - first) / backlog))
            if pct >= self._recovery_pct + PROGRESS_STEP_PCT:
                self._recovery_pct = pct - pct % PROGRESS_STEP_PCT
                ref, shard = self.dataset.ref, self.shard
                self._emit(RecoveryInProgress(ref, shard, self.node, self._recovery_pct))
                self._health_key = None
        return False

    # ----- health: Degraded while the store or Kafka is out ------------------------------------

    def _pause_or_resume(self, consumer: Consumer, partition: TopicPartition) -> bool:
        """Stop reading the partition while more than `max_unflushed_samples` wait for the
        store (memory is the only buffer left; nothing is dropped), go on below it. Returns
        whether consumption is paused now. Paused means not calling consume(): librdkafka's
        prefetch stays bounded by `queued_max_messages_kbytes`, and with `assign()` there is no
        group session to lose."""
        # Not while recovering: flushes wait for the replay to pass the seal mark, so pausing
        # would wait forever. What is held then is bounded by what the last owner had read.
        over = (
            self.memstore.unflushed_samples() > self._ingest.max_unflushed_samples
            and not self.memstore.recovering
        )
        if over and not self.paused:
            self.paused = True
            self.pauses += 1
            log.warning(
                "%s shard %d: paused consuming at offset %s: %d samples wait for the store "
                "(limit ingest.max_unflushed_samples=%d)",
                self.dataset.name,
                self.shard,
                self.next_offset,
                self.memstore.unflushed_samples(),
                self._ingest.max_unflushed_samples,
            )
        elif not over and self.paused:
            self.paused = False
            log.warning(
                "%s shard %d: resumed consuming at offset %s",
                self.dataset.name,
                self.shard,
                self.next_offset,
            )
        return self.paused

    def _kafka_trouble(self, err: object) -> None:
        if self._kafka_since is None:
            self._kafka_since = time.monotonic()
        self._kafka_error = self._errors.explain(str(err))
        log.warning("%s shard %d: %s", self.dataset.name, self.shard, self._kafka_error)

    def _probe_kafka(self, consumer: Consumer, partition: TopicPartition) -> None:
        """No message lately: is the broker answering (again)? A failure starts or continues
        the Kafka trouble that makes the shard Degraded after `kafka_retry_timeout_s`."""
        try:
            _, end = consumer.get_watermark_offsets(partition, timeout=PROBE_TIMEOUT_S)
        except KafkaException as e:
            err = e.args[0] if e.args else None
            if isinstance(err, KafkaError) and not is_transient(err):
                raise
            if self._kafka_since is None:
                self._kafka_trouble(err)  # starts it, said once in the log
            else:
                self._kafka_error = self._errors.explain(str(err))
            return
        self._kafka_since = self._kafka_error = None
        if self.next_offset is not None and self.next_offset >= end:
            self.current_ms = int(time.time() * 1000)

    def _problem(self) -> str | None:
        """What keeps the shard from being healthy, for `IngestionDegraded` (None: nothing)."""
        flusher = self.flusher
        now = time.monotonic()
        if flusher is not None and flusher.store_error is not None:
            since = now - (flusher.failing_since or now)
            text = (
                f"store unavailable for {since:.0f} s, flushes retrying, "
                f"{self.memstore.unflushed_samples()} samples in memory: {flusher.store_error}"
            )
            if self.paused:
                text += (
                    f"; consumption paused at offset {self.next_offset} "
                    f"(ingest.max_unflushed_samples={self._ingest.max_unflushed_samples})"
                )
            return text
        if self._store_problem is not None:
            return self._store_problem
        if (
            self._kafka_since is not None
            and now - self._kafka_since >= self._ingest.kafka_retry_timeout_s
        ):
            return f"Kafka unreachable for {now - self._kafka_since:.0f} s: {self._kafka_error}"
        return None

    def _report_health(self) -> None:
        """Report Degraded when a problem starts or changes kind, and the healthy status
        (Active, or Recovery during replay) once it is over."""
        problem = self._problem()
        flusher = self.flusher
        flushing_failed = flusher is not None and flusher.store_error is not None
        key: tuple[object, ...] = (
            (True,)
            if problem is None
            else (False, flushing_failed, self._store_problem is not None, self.paused)
        )
        if key == self._health_key:
            return
        first = self._health_key is None
        self._health_key = key
        ref, shard = self.dataset.ref, self.shard
        if problem is not None:
            log.warning("%s shard %d: degraded: %s", ref.name, shard, problem)
            self._emit(IngestionDegraded(ref, shard, self.node, problem))
        elif not first:
            log.warning("%s shard %d: healthy again", ref.name, shard)
            self._emit(self._healthy_event())

    def _healthy_event(self) -> ShardEvent:
        ref, shard = self.dataset.ref, self.shard
        if self._live_now:
            return self._started_event()
        return RecoveryInProgress(ref, shard, self.node, self._recovery_pct)

    @property
    def degraded(self) -> str | None:
        """Why the shard is Degraded now (None: it is not)."""
        return self._problem()

    def _started_event(self) -> IngestionStarted:
        return IngestionStarted(
            self.dataset.ref,
            self.shard,
            self.node,
            epoch=self._epoch,
            replayed_offsets=self.replayed_offsets,
        )

    def _live(self) -> None:
        self.recovery_s = time.monotonic() - self._started
        self._live_now = True
        problem = self._problem()
        if problem is None:
            self._emit(self._started_event())
        self._health_key = None
        self._report_health()

    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """`call()`, retried with backoff while it fails with a transient Kafka error; quietly
        for `kafka_retry_timeout_s`, then reporting the shard Degraded until it succeeds. Raises
        `_Stopped` if told to stop meanwhile, and non-transient errors at once."""
        backoff = Backoff(0.05, 2.0)
        try:
            while True:
                try:
                    return call()
                except KafkaException as e:
                    err = e.args[0] if e.args else None
                    if not isinstance(err, KafkaError) or not is_transient(err):
                        raise
                    if self._kafka_since is None:
                        self._kafka_since = time.monotonic()
                    self._kafka_error = self._errors.explain(f"{what}: {err}")
                    log.info(
                        "%s shard %d: %s: %s; retrying", self.dataset.name, self.shard, what, err
                    )
                    self._report_health()
                if self._worker.wait(backoff.next()):
                    raise _Stopped
        finally:
            self._kafka_since = self._kafka_error = None

    def _store_retrying(self, what: str, call: Callable[[], T]) -> T:
        """`call()`, retried with backoff while the store is out, reporting the shard Degraded
        meanwhile. Raises `_Stopped` if told to stop while waiting."""
        backoff = Backoff(self._ingest.store_retry_initial_s, self._ingest.store_retry_max_s)
        since = time.monotonic()
        try:
            while True:
                try:
                    return call()
                except StoreUnavailable as e:
                    self._store_problem = (
                        f"store unavailable for {time.monotonic() - since:.0f} s while {what}, "
                        f"retrying: {type(e).__name__}: {e}"
                    )
                    log.warning(
                        "%s shard %d: %s", self.dataset.name, self.shard, self._store_problem
                    )
                    self._report_health()
                if self._worker.wait(backoff.next()):
                    raise _Stopped
        finally:
            self._store_problem = None

    def _position(self, consumer: Consumer) -> int | None:
        pos = consumer.position([TopicPartition(self.dataset.topic, self.shard)])[0].offset
        return None if pos < 0 else int(pos)

    def delete_series(self, selectors: Sequence[Sequence[LabelMatcher]], timeout_s: float) -> int:
        """Delete the series any selector matches from memory and the store; how many. Run on
        the flush thread, between flushes (docs/lifecycle.md, "Deleting series"): flush
        everything, forget the series in memory, flush again so every group's checkpoint
        passes what was ingested (a replay cannot bring them back, and no open-buffer snapshot
        holds them), then delete them from the store. `Unavailable` while the shard is not
        consuming or still replaying: the caller retries."""
        flushing = self._flushing
        if flushing is None or self.memstore.recovering:
            raise Unavailable(
                f"{self.dataset.name} shard {self.shard} is starting, replaying or stopping: "
                "retry the delete"
            )
        return flushing.submit(lambda f: self._delete_here(f, selectors)).result(timeout_s)

    def _delete_here(self, flusher: Flusher, selectors: Sequence[Sequence[LabelMatcher]]) -> int:
        # No downsampling round overlaps: one that read a series before the delete must not
        # write its records after.
        with nullcontext() if self.downsampler is None else self.downsampler.paused():
            ref, shard = self.dataset.ref, self.shard
            if any(r.held for r in flusher.flush_all()):
                raise Unavailable(f"{ref.name} shard {shard} is replaying: retry the delete")
            keys = set(self.memstore.delete_series(selectors))
            for matchers in selectors:  # and any the store holds that memory does not
                keys.update(
                    r.part_key for r in self._columns.list_part_keys(ref, shard, matchers=matchers)
                )
            flusher.flush_all()
            self._columns.delete_series(ref, shard, keys)
            if keys:
                log.info("%s shard %d: deleted %d series", ref.name, shard, len(keys))
            return len(keys)

    def series_samples(self) -> dict[str, np.ndarray]:
        """Every series' timestamps, from the ColumnStore and memory, as a query would see them
        (nothing de-duplicated: a duplicate would show). For exactness checks and debugging."""
        ref, mem = self.dataset.ref, self.memstore
        return {
            mem.part_key(sid): read_merged(mem, self._columns, ref, self.shard, sid)[0]
            for sid in range(mem.num_series)
        }

    def stats(self) -> dict[str, Any]:
        s = self.memstore.stats
        return {
            "messages": self.messages,
            "bad_records": dict(self.bad_records),
            "offsets_lost": self.offsets_lost,
            "replayed_from": self.replayed_from,
            "replayed_offsets": self.replayed_offsets,
            "open_samples_loaded": self.open_samples_loaded,
            "memstore": s,
            "memory_samples": self.memstore.memory_samples(),
            "lag": self.lag,
            "next_offset": self.next_offset,
            "read_ts_ms": self.read_ts_ms,
            "current_ms": self.current_ms,
            "recovery_s": self.recovery_s,
            "flush": self.flusher.totals() if self.flusher is not None else None,
            "degraded": self.degraded,
            "paused": self.paused,
            "pauses": self.pauses,
            "unflushed_samples": self.memstore.unflushed_samples(),
            "downsample": None if self.downsampler is None else self.downsampler.stats(),
        }

    @property
    def lag(self) -> int | None:
        """Offsets in the partition not yet read (None until the first offsets are known)."""
        if self.end_offset is None or self.next_offset is None:
            return None
        return max(0, self.end_offset - self.next_offset)


class _FlushThread(CheckedWorker):
    """A shard's flusher on its own thread: `flush_due()` whenever a group is due (every group
    at once while `paused()`: consumption waits for the store), retries after store errors by
    the flusher's backoff. A failure the flusher raises (`StaleEpochError`, a bug) ends the
    thread and is re-raised on the ingesting thread by `check()`."""

    MIN_WAIT_S = 0.02  # under memory pressure a group is always due: do not spin

    def __init__(self, flusher: Flusher, paused: Callable[[], bool], name: str) -> None:
        super().__init__(name)
        self._flusher = flusher
        self._paused = paused
        self._wake = threading.Event()
        # Work that must not overlap a flush (`submit`), run between rounds.
        self._tasks: list[tuple[Callable[[Flusher], Any], Future[Any]]] = []
        self._tasks_lock = threading.Lock()
        self.start()

    def _loop(self) -> None:
        flusher = self._flusher
        while not self.stopping:
            self._run_tasks()
            if self._paused():
                flusher.flush_now()
            else:
                flusher.flush_due()
            wait = max(self.MIN_WAIT_S, min(0.5, flusher.seconds_until_due()))
            self._wake.wait(wait)
            self._wake.clear()

    def _done(self) -> None:
        """Tasks still waiting fail (their callers retry): no flush thread will run them."""
        with self._tasks_lock:
            tasks, self._tasks = self._tasks, []
        for _, fut in tasks:
            fut.set_exception(Unavailable("the shard stopped ingesting: retry"))

    def submit(self, task: Callable[[Flusher], Any]) -> Future[Any]:
        """Run `task(flusher)` on this thread between flushes; its result or error in the
        future."""
        fut: Future[Any] = Future()
        with self._tasks_lock:
            if self.stopping or self.failure is not None:
                fut.set_exception(Unavailable("the shard stopped ingesting: retry"))
                return fut
            self._tasks.append((task, fut))
        self._wake.set()
        return fut

    def _run_tasks(self) -> None:
        with self._tasks_lock:
            tasks, self._tasks = self._tasks, []
        for task, fut in tasks:
            try:
                fut.set_result(task(self._flusher))
            except Exception as e:  # the caller's to handle; flushing goes on
                fut.set_exception(e)

    def wake(self) -> None:
        self._wake.set()

    def _interrupt(self) -> None:
        """`stop()` ends the loop after the flush in progress, if any (the final flush is the
        caller's): wake it from its wait."""
        self._wake.set()
