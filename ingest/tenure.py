"""Each ingester's own record of holding a shard: when it claimed it, when it let go, and which
offsets it read in between.

The singleton's map says who *should* own a shard; this log says who actually ingested it, as
each node saw it. Comparing the nodes' logs is how a move is checked to never have two ingesting
owners (a new owner claims only after the old one released) and to read every offset exactly once
(the next owner starts right after the last offset the previous one read). Process-wide and
bounded: an ingester is gone after its shard moves, its tenure stays.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, replace

MAX_TENURES = 10_000  # per process; the oldest go first


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
