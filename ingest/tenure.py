"""Each ingester's own record of holding a shard: when it claimed it, when it let go, and which
offsets it read in between.

The singleton's map says who *should* own a shard; this log says who actually ingested it, as
each node saw it. Comparing the nodes' logs is how a move is checked to never have two ingesting
owners (a new owner claims only after the old one released) and to read every offset exactly once
(the next owner starts right after the last offset the previous one read). Process-wide and
bounded: an ingester is gone after its shard moves, its tenure stays.

An ingester that lets go also notes how far it read in the store (`note_release`), so the next
owner, on any node, counts exactly the offsets it reads again (`offsets_read_before`, the
ownership history's "replayed"); an owner that was killed leaves no note.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace

from core.dataset import DatasetRef
from store import ColumnStore
from store.api import INT32_MAX

MAX_TENURES = 10_000  # per process; the oldest go first
# Release notes live in the ColumnStore's open-snapshot table, under a flush group no flush uses
# and at "offset" = the releasing epoch: no store has a place for them, and this way both
# backends keep their schema (as the seal mark does among the checkpoints).
RELEASE_GROUP = INT32_MAX
_RELEASE = struct.Struct("<q")  # the offset no owner up to the noting one read from

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tenure:
    """One ingester's hold on one shard. Times are wall-clock seconds (comparable across the
    nodes of one host, as in the tests; across hosts only as good as their clocks)."""

    dataset: str
    shard: int
    node: str
    epoch: int
    claimed_at: float  # the epoch claim returned
    first_offset: int | None = None  # the first offset it was to read (None: not yet known)
    released_at: float | None = None  # consumer closed after the last flush (None: still held)
    # The offset after the last one it read: final once released; while held, as far as it got
    # when the tenure was read (None: it had not started reading).
    next_offset: int | None = None
    # The partition's end offset when it started reading: it replayed up to there, and no owner
    # before it can have read past it (they had all let go, or been fenced, by its claim).
    end_offset: int | None = None

    @property
    def hold(self) -> tuple[int, int, float]:
        """Which hold this is: a running tenure and its finished record share it."""
        return (self.shard, self.epoch, self.claimed_at)

    def released(self, next_offset: int | None) -> Tenure:
        return replace(self, released_at=time.time(), next_offset=next_offset)


_lock = threading.Lock()
_tenures: deque[Tenure] = deque(maxlen=MAX_TENURES)


def record(tenure: Tenure) -> None:
    """Keep a finished tenure (running ones are reported by their ingesters)."""
    with _lock:
        _tenures.append(tenure)


def finished(dataset: str) -> list[Tenure]:
    """The finished tenures of `dataset` in this process, oldest first."""
    with _lock:
        return [t for t in _tenures if t.dataset == dataset]


def note_release(
    columns: ColumnStore, ref: DatasetRef, shard: int, epoch: int, read_to: int
) -> None:
    """Note in the store, for the shard's next owner, that no owner up to `epoch` read offsets
    from `read_to` on (an ingester letting go: its consumer closed, so it is final); drop the
    notes of the epochs before. Best effort: without a note, the next owner counts every offset
    the previous one may have read."""
    try:
        columns.write_open_snapshot(ref, shard, RELEASE_GROUP, epoch, epoch, _RELEASE.pack(read_to))
        columns.drop_open_snapshots(ref, shard, RELEASE_GROUP, epoch)
    # From a `finally`: nothing here may hide how the ingester ended.
    except Exception as e:
        log.warning("%s shard %d: could not note where it stopped: %s", ref.name, shard, e)


def noted_release(columns: ColumnStore, ref: DatasetRef, shard: int, epoch: int) -> int | None:
    """The offset noted by the owner of `epoch` when it let go (`note_release`); None if it
    did not (killed, or the store was out)."""
    note = columns.read_open_snapshot(ref, shard, RELEASE_GROUP, epoch)
    if note is None or len(note) != _RELEASE.size:
        return None
    return int(_RELEASE.unpack(note)[0])


def offsets_read_before(
    first: int,
    end_offset: int,
    checkpoints: Mapping[int, int],
    *,
    earlier_owner: bool,
    noted: int | None,
) -> int:
    """Of the offsets a new owner reads from `first`, how many an owner before it had read (the
    ownership history's "replayed"). `end_offset`: the partition's end at the new owner's claim;
    `checkpoints`: the flush groups' then; `noted`: the previous owner's release note
    (`noted_release`), if it left one.

    * The shard's first owner (`earlier_owner` false): 0.
    * The previous owner let go (a drain, a rebalance, a stop): exactly those below the offset
      after the last one it read (0 when its final flush checkpointed them all); had it not
      finished its own replay, below the end offset it started from, which an owner before it
      may have read (its note says which).
    * It left no note (its node was killed): every offset below the end offset at this claim
      (and below the highest checkpoint + 1), all a dead owner could have read. Exact when it
      had read to the end; what was produced after its last read counts too, since no one
      alive can tell how far it got.
    """
    if not earlier_owner:
        return 0
    if noted is not None:
        read_to = noted
    else:
        read_to = max(end_offset, max(checkpoints.values(), default=-1) + 1)
    return max(0, read_to - first)
