"""Flushing a shard's memstore to the ColumnStore, checkpointing, and recovering after a crash.

A shard's series are divided into `groups_per_shard` flush groups by partition key hash; the
groups flush in turn across the flush interval. Flushing group g:

1. seal: the *complete* chunks of g's series (full, or their time bucket over) are cut off their
   open buffers; what stays open is copied as the group's open-buffer snapshot
   (`ingest.open_buffers`). The group's watermark at that moment, `offset`, is the Kafka offset
   the flush will checkpoint;
2. write the chunks (one batched call), then the sealed series' part keys with their whole time
   range (one batched call): chunks first, so a stored part key's `end_time` never claims samples
   that are not in the ColumnStore;
3. write the snapshot under (g, offset, epoch), if the checkpoint advances and anything is open;
4. commit g's checkpoint = `offset`, fenced by the shard's ownership epoch (first, the
   downsampler records late samples the checkpoint may pass: `before_checkpoint`), then drop
   g's older snapshots. `StaleEpochError` propagates: the ingester must stop the shard. Any
   other error leaves the sealed flush pending and propagates; the next `flush_group(g)`
   retries the same chunks and snapshot before sealing anything new.

So the checkpoint rule is: g's checkpoint c means every sample of g from messages <= c is in a
chunk or in g's snapshot at c. Chunks stay large whatever the flush interval (a 15 s scrape makes
`max_chunk_samples`-sample chunks, not one per flush), and a crash replays at most one flush
interval of Kafka. A clean stop (`flush_all`) and memory pressure seal everything instead, so a
stopped shard's samples are all in chunks.

A store outage (`StoreUnavailable`, `StoreTimeout`) is not an ingestion error: `flush_due` keeps
it, counts the failure, and retries with exponential backoff (`retry_initial_s` doubling up to
`retry_max_s`) while the memstore keeps taking samples; `store_error` says what is wrong meanwhile.
The first retry that gets through flushes every group at once (a catch-up round), so everything
that piled up in memory is written and checkpointed without anyone's help.

Recovery (`recover_shard`): read checkpoints and part keys, index the part keys in a fresh
memstore, load each group's snapshot at its checkpoint into the open buffers (dropping samples at
or before the series' stored `end_time`), replay Kafka from the lowest checkpoint + 1, skip group
g's samples at or below g's checkpoint, and skip a series' samples at or before its last known
sample (stored `end_time` or snapshot). Both skips are exact: every sample of a message at or
below a committed (or part-key-covered) seal point has a timestamp at or before the series' last
sample at that seal, so the replayed accepted samples are exactly those the crashed node accepted
after its last complete flush.

No duplicates: a ChunkRecord is identified by (part key, start_time), and writing it again
replaces it. After a crash, a series' open buffer starts where the crashed node's did (the
snapshot's first open sample, or the first accepted sample after the stored `end_time`), and
chunk cuts depend only on the samples from there (time buckets, then every `max_chunk_samples`);
a chunk sealed early (bucket over, a clean stop) is the buffer's whole rest, so the replay's chunk
from the same start holds it all or more. The memstore holds flushes while `recovering` (until the
replay passed the partition's end offset seen at recovery start), so the first flush after a crash
covers everything the crashed node may have written: every chunk the crash left behind is
rewritten under the same id with the same or more samples, and no new chunk overlaps an old one.
See docs/memstore.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from core.backoff import Backoff
from core.dataset import DatasetRef
from ingest.memstore import ShardMemstore
from ingest.open_buffers import decode_open_buffers, encode_open_buffers
from ingest.seal import SealedGroup
from store.api import (
    ColumnStore,
    MetaStore,
    StaleEpochError,
    StoreUnavailable,
)

DEFAULT_FLUSH_INTERVAL_S = 60.0
DEFAULT_RETRY_INITIAL_S = 0.5
DEFAULT_RETRY_MAX_S = 30.0

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FlushResult:
    """One flush of one group. `checkpoint` is the offset committed (None: nothing new)."""

    group: int
    checkpoint: int | None = None
    series: int = 0
    chunks: int = 0
    samples: int = 0
    duration_s: float = 0.0
    held: bool = False  # not flushed: the shard is still replaying after a restart


@dataclass(slots=True)
class GroupFlushStats:
    """Per flush group, for metrics: the last committed checkpoint and flush costs."""

    checkpoint: int | None = None
    flushes: int = 0
    failures: int = 0
    samples: int = 0
    chunks: int = 0
    last_duration_s: float = 0.0
    total_duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """Where to replay from: read from `start_offset` (None: the earliest retained offset)
    through `replay_until` (-1: nothing to replay)."""

    checkpoints: dict[int, int]
    start_offset: int | None
    replay_until: int
    series_loaded: int
    open_samples_loaded: int = 0  # from the groups' open-buffer snapshots


def replay_start(checkpoints: Mapping[int, int], groups_per_shard: int) -> int | None:
    """First offset to replay: the lowest checkpoint + 1 once every group has one (after a
    change of groups_per_shard, the lowest of all, old groups included); None otherwise, since a
    group without a checkpoint may have unflushed samples at any offset."""
    if not checkpoints or not set(range(groups_per_shard)) <= set(checkpoints):
        return None
    return min(checkpoints.values()) + 1


def recover_shard(
    memstore: ShardMemstore,
    meta_store: MetaStore,
    column_store: ColumnStore,
    ref: DatasetRef,
    shard: int,
    end_offset: int,
) -> RecoveryPlan:
    """Prepare a fresh memstore for replay; call after `claim_epoch`, before ingesting.

    `end_offset` is the partition's end (next) offset now. Loads every stored part key (the index
    and the skip rule need them; samples stay in the ColumnStore) and the checkpoints.

    Flushes are held until the replay passed the seal mark (no chunk in the store holds a sample
    of a later message), or the end offset for a shard flushed only by a FiloPy from before the
    mark; never for a shard with nothing stored. So a new owner that starts with a backlog
    larger than its memory bound flushes as it replays instead of waiting for its end."""
    checkpoints = meta_store.read_checkpoints(ref, shard)
    mark = meta_store.read_seal_mark(ref, shard)
    loaded = memstore.load_part_keys(column_store.list_part_keys(ref, shard))
    open_samples = 0
    for group, offset in sorted(checkpoints.items()):
        # none: nothing was open at that checkpoint (or it predates snapshots: all in chunks)
        blob = column_store.read_open_snapshot(ref, shard, group, offset)
        if blob:
            open_samples += memstore.load_open_buffers(decode_open_buffers(blob))
    start = replay_start(checkpoints, memstore.groups_per_shard)
    until = end_offset - 1
    if mark is not None:
        until = min(until, mark)
    elif not checkpoints and not loaded:
        until = -1  # nothing was ever flushed: no chunk a flush could contradict
    if start is not None and start > until:
        until = -1
    memstore.set_checkpoints(checkpoints, until)
    return RecoveryPlan(checkpoints, start, until, loaded, open_samples)


class Flusher:
    """Flushes a shard's memstore, group by group, and commits checkpoints under `epoch`.

    Call `flush_due()` regularly (say every second, between messages, or from a thread: the
    memstore serialises on its lock); `seconds_until_due()` says when it next has work. It flushes
    one group every `flush_interval_s / groups_per_shard`, in turn, and also ahead of time while
    the memstore reports memory pressure. `flush_all()` flushes every group, e.g. before a clean
    stop so the next start replays nothing. `flush_due()` never raises for a store outage: see
    `store_error` and the module docstring.
    """

    def __init__(
        self,
        memstore: ShardMemstore,
        column_store: ColumnStore,
        meta_store: MetaStore,
        ref: DatasetRef,
        shard: int,
        epoch: int,
        *,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        checkpoints: Mapping[int, int] | None = None,
        check_epoch: bool = True,
        clock: Callable[[], float] = time.monotonic,
        retry_initial_s: float = DEFAULT_RETRY_INITIAL_S,
        retry_max_s: float = DEFAULT_RETRY_MAX_S,
        before_checkpoint: Callable[[], None] | None = None,
    ) -> None:
        if memstore.chunk_span_ms > column_store.max_chunk_span_ms:
            raise ValueError(
                f"memstore chunk_span_ms={memstore.chunk_span_ms} exceeds the store's "
                f"max_chunk_span_ms={column_store.max_chunk_span_ms}"
            )
        if flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be positive, got {flush_interval_s}")
        if not 0 < retry_initial_s <= retry_max_s:
            raise ValueError(f"need 0 < retry_initial_s <= retry_max_s, got {retry_initial_s}")
        self.memstore = memstore
        self.column_store = column_store
        self.meta_store = meta_store
        self.ref = ref
        self.shard = shard
        self.epoch = epoch
        self.flush_interval_s = flush_interval_s
        self.check_epoch = check_epoch
        self._clock = clock
        # Run before each checkpoint commit: the downsampler records late samples the
        # checkpoint may pass (`Downsampler.keep_late`).
        self._before_checkpoint = before_checkpoint
        groups = memstore.groups_per_shard
        self.group_stats = {g: GroupFlushStats() for g in range(groups)}
        for g, off in (checkpoints or {}).items():
            if g in self.group_stats:
                self.group_stats[g].checkpoint = off
        self._pending: dict[int, SealedGroup] = {}
        # Per group: the store may hold snapshots of it (those of the checkpoints it started
        # from, or one written since), so the next flush has some to drop: an idle group's
        # flushes then cost no delete (no Cassandra tombstone per flush).
        self._may_hold_snapshots = {g: g in (checkpoints or {}) for g in range(groups)}
        self._seal_mark = -1  # the seal mark this flusher raised (`MetaStore.raise_seal_mark`)
        self._next_group = 0
        self._next_due: float | None = None
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        # While the store is out: the last error, since when, and when the next retry is due.
        self.store_error: str | None = None
        self.failing_since: float | None = None
        self._retry = Backoff(retry_initial_s, retry_max_s)
        self.outages = 0  # store outages ridden out (each ended by a successful catch-up)

    def flush_group(self, group: int, *, everything: bool = False) -> FlushResult:
        """Seal (complete chunks; all open samples if `everything` or under memory pressure),
        write chunks then part keys, then the open-buffer snapshot, then commit the group's
        checkpoint.

        Raises StaleEpochError if the shard has a newer owner (nothing is written when that is
        seen before the writes); store errors leave the flush pending for the next call."""
        mem = self.memstore
        if not 0 <= group < mem.groups_per_shard:
            raise ValueError(f"no flush group {group} (groups_per_shard={mem.groups_per_shard})")
        if mem.recovering:
            return FlushResult(group, held=True)
        started = time.perf_counter()
        stats = self.group_stats[group]
        sealed = self._pending.get(group)
        if sealed is None:
            complete_only = not (everything or mem.pressure)
            sealed = self._pending[group] = mem.seal_group(group, complete_only=complete_only)
        advance = sealed.offset >= 0 and (
            stats.checkpoint is None or sealed.offset > stats.checkpoint
        )
        # Without a new checkpoint the last snapshot stays valid: what was sealed since is
        # dropped from it at recovery by the part keys' end times.
        snapshot = advance and sealed.open.samples > 0
        try:
            if sealed.chunks and sealed.offset > self._seal_mark:
                # fenced: also the epoch check
                self._seal_mark = self.meta_store.raise_seal_mark(
                    self.ref, self.shard, sealed.offset, self.epoch
                )
            elif self.check_epoch and (sealed.chunks or snapshot):
                self._check_epoch()
            if sealed.chunks:
                self.column_store.write_chunks(self.ref, self.shard, sealed.chunks)
                self.column_store.write_part_keys(self.ref, self.shard, sealed.part_keys)
            if snapshot:
                if sealed.open_blob is None:
                    sealed.open_blob = encode_open_buffers(sealed.open)
                self.column_store.write_open_snapshot(
                    self.ref, self.shard, group, sealed.offset, self.epoch, sealed.open_blob
                )
            mem.mark_flushed(sealed)
            del self._pending[group]
            committed = None
            if advance:
                if self._before_checkpoint is not None:
                    self._before_checkpoint()
                committed = self.meta_store.commit_checkpoint(
                    self.ref, self.shard, group, sealed.offset, self.epoch
                )
                stats.checkpoint = committed
            self._forget_old_snapshots(group, snapshot, sealed.open.samples == 0)
        except BaseException:
            stats.failures += 1
            raise
        took = time.perf_counter() - started
        stats.flushes += 1
        stats.samples += sealed.samples
        stats.chunks += len(sealed.chunks)
        stats.last_duration_s = took
        stats.total_duration_s += took
        return FlushResult(
            group, committed, len(sealed.part_keys), len(sealed.chunks), sealed.samples, took
        )

    def flush_all(self) -> list[FlushResult]:
        """Seal and flush everything in memory, every group (held results while recovering):
        before a clean stop, so the next owner replays nothing and the store holds every sample
        in chunks."""
        return [self.flush_group(g, everything=True) for g in range(self.memstore.groups_per_shard)]

    def _forget_old_snapshots(self, group: int, wrote: bool, nothing_open: bool) -> None:
        """After a flush: drop the group's snapshots below its checkpoint (superseded by the one
        just written), or all of them once nothing is open (every sample of the checkpoint's
        snapshot is in chunks now, e.g. after a clean stop). Only if the store may hold any.
        Best effort: one left behind by an outage is never read, and a later drop covers it."""
        checkpoint = self.group_stats[group].checkpoint
        if checkpoint is None or not (wrote or nothing_open):
            return  # the checkpoint's snapshot (if any) still holds open samples
        if self._may_hold_snapshots[group]:
            below = checkpoint if wrote else checkpoint + 1
            try:
                self.column_store.drop_open_snapshots(self.ref, self.shard, group, below)
            except StoreUnavailable as e:
                log.info(
                    "%s shard %d: old snapshots of group %d stay for now: %s",
                    self.ref.name,
                    self.shard,
                    group,
                    e,
                )
                return
        self._may_hold_snapshots[group] = wrote

    def flush_due(self, now: float | None = None) -> list[FlushResult]:
        """Flush the groups whose turn has come (at most one round), and the next ones early
        while the memstore is under memory pressure. Nothing while recovering."""
        now = self._clock() if now is None else now
        groups = self.memstore.groups_per_shard
        slot = self.flush_interval_s / groups
        if self._next_due is None:
            self._next_due = now + slot
        if self.store_error is not None:
            return self.flush_now(now)
        done: list[FlushResult] = []
        for _ in range(groups):
            due = now >= self._next_due
            if not due and not self.memstore.pressure:
                break
            try:
                result = self.flush_group(self._next_group)
            except StoreUnavailable as e:
                self._failed(e, now)
                break
            if result.held:
                break
            done.append(result)
            self._next_group = (self._next_group + 1) % groups
            # behind by more than an interval (a stall): do not try to make up every slot
            base = max(self._next_due, now - self.flush_interval_s) if due else now
            self._next_due = base + slot
        return done

    def flush_now(self, now: float | None = None) -> list[FlushResult]:
        """Every group at once, starting with the next in turn (after a store error: the one
        that failed), unless a retry is not due yet. This is the catch-up after an outage: what
        piled up in memory is written and checkpointed in one round. A store error stops the
        round and backs off further; it is kept in `store_error`, not raised."""
        now = self._clock() if now is None else now
        if self.store_error is not None and not self._retry.ready(now):
            return []
        groups = self.memstore.groups_per_shard
        # A group whose flush failed first rewrites its pending seal; it gets a second turn at
        # the end of the round for what it took in since.
        order = [(self._next_group + i) % groups for i in range(groups)]
        if order[0] in self._pending:
            order.append(order[0])
        done: list[FlushResult] = []
        for group in order:
            try:
                result = self.flush_group(group)
            except StoreUnavailable as e:
                self._next_group = group
                self._failed(e, now)
                return done
            if result.held:
                return done
            done.append(result)
        self._next_group = (order[0] + 1) % groups
        if self.store_error is None:
            return done
        log.warning(
            "%s shard %d: the store is back after %.1f s; flushed and checkpointed every group",
            self.ref.name,
            self.shard,
            now - (self.failing_since or now),
        )
        self.store_error = self.failing_since = None
        self._retry.reset()
        self._next_due = now + self.flush_interval_s / groups
        self.outages += 1
        return done

    def _failed(self, error: StoreUnavailable, now: float) -> None:
        """A flush hit a store outage: keep it pending, retry after the backoff."""
        if self.store_error is None:
            self.failing_since = now
        delay = self._retry.fail(now)
        self.store_error = f"{type(error).__name__}: {error}"
        log.warning(
            "%s shard %d: flush of group %d failed (store unavailable for %.1f s); retrying in "
            "%.1f s, ingesting into memory meanwhile: %s",
            self.ref.name,
            self.shard,
            self._next_group,
            now - (self.failing_since or now),
            delay,
            self.store_error,
        )

    def seconds_until_due(self, now: float | None = None) -> float:
        now = self._clock() if now is None else now
        if self.store_error is not None:
            return max(0.0, self._retry.retry_at - now)
        if self._next_due is None or self.memstore.pressure:
            return 0.0
        return max(0.0, self._next_due - now)

    def totals(self) -> GroupFlushStats:
        """The shard's flush costs summed over its groups (checkpoint: the lowest committed)."""
        stats = list(self.group_stats.values())
        done = [s.checkpoint for s in stats if s.checkpoint is not None]
        return GroupFlushStats(
            checkpoint=min(done) if len(done) == len(stats) else None,
            flushes=sum(s.flushes for s in stats),
            failures=sum(s.failures for s in stats),
            samples=sum(s.samples for s in stats),
            chunks=sum(s.chunks for s in stats),
            last_duration_s=max((s.last_duration_s for s in stats), default=0.0),
            total_duration_s=sum(s.total_duration_s for s in stats),
        )

    @property
    def checkpoints(self) -> dict[int, int]:
        """Committed checkpoints known to this flusher."""
        return {g: s.checkpoint for g, s in self.group_stats.items() if s.checkpoint is not None}

    def _check_epoch(self) -> None:
        """Fail before writing if another node has claimed the shard: narrows (cannot close)
        the window in which a deposed owner's chunk writes race the new owner's."""
        current = self.meta_store.current_epoch(self.ref, self.shard).epoch
        if current != self.epoch:
            raise StaleEpochError(self.ref.name, self.shard, self.epoch, current)
