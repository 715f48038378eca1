"""Python's cyclic garbage collector kept off the query path of long-lived processes.

Why: a full collection visits every object the collector tracks, which is memory-latency bound,
and a node holding a memstore tracks many (most of them its modules' functions and types and
its chunks). Python runs one whenever a quarter more objects have survived since the last,
which queries reading the ColumnStore cause often: each query that meets one waits for it, and
those waits were the p99 of queries that decode chunks (measured in docs/query.md).

The policy: objects that have survived a collection and lived `freeze_every_s` are frozen
(`gc.freeze`): automatic collections scan only the younger ones, a small fraction.
A cycle among frozen objects that later becomes garbage is not collected until the next sweep:
every `sweep_every_s` everything is unfrozen and collected once (one full collection, at a
known rate), then frozen again, and at once when a caller lets go of much (`sweep_soon`: a
node whose shard stopped). Reference counting frees everything else as before.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.worker import Worker

log = logging.getLogger("filopy.heap")

FREEZE_EVERY_S = 60.0
SWEEP_EVERY_S = 3600.0


@dataclass
class LongLivedHeap:
    """Decides when to freeze and when to sweep; `tick` does what is due. `collector` is the
    `gc` module (tests pass a fake), `clock` a monotonic clock."""

    freeze_every_s: float = FREEZE_EVERY_S
    sweep_every_s: float = SWEEP_EVERY_S
    collector: Any = gc
    clock: Callable[[], float] = time.monotonic
    frozen: int = 0  # objects frozen at the last freeze or sweep
    swept: int = 0  # garbage found by sweeps so far
    _next_freeze: float = field(init=False)
    _next_sweep: float = field(init=False)

    def __post_init__(self) -> None:
        now = self.clock()
        self._next_freeze = now  # the first tick freezes what startup made
        self._next_sweep = now + self.sweep_every_s

    def tick(self) -> str | None:
        """Freeze or sweep if one is due: "sweep", "freeze" or None."""
        now = self.clock()
        if now >= self._next_sweep:
            self.collector.unfreeze()
            self.swept += self.collector.collect()
            self._freeze(now)
            self._next_sweep = now + self.sweep_every_s
            return "sweep"
        if now >= self._next_freeze:
            self.collector.collect()  # only the unfrozen: what lived since the last freeze
            self._freeze(now)
            return "freeze"
        return None

    def sweep_soon(self, delay_s: float = 5.0) -> None:
        """Sweep within `delay_s` (time for the caller's last references to go): the caller just
        let go of much that lived long (a stopped shard's ingester and memstore), which a
        reference cycle would otherwise keep until the hourly sweep."""
        self._next_sweep = min(self._next_sweep, self.clock() + delay_s)

    def _freeze(self, now: float) -> None:
        self.collector.freeze()
        self.frozen = self.collector.get_freeze_count()
        self._next_freeze = now + self.freeze_every_s

    def start(self, name: str = "heap") -> Worker:
        """Tick on a daemon thread for the rest of the process (servers never stop the worker)."""

        def run() -> None:
            while True:
                try:
                    self.tick()
                except Exception:  # never let the policy take the process down
                    log.exception("heap policy: a tick failed")
                if worker.wait(min(self.freeze_every_s, 1.0)):
                    return

        worker = Worker(name, run)
        worker.start()
        return worker


_started: LongLivedHeap | None = None
_lock = threading.Lock()


def keep_long_lived_frozen() -> LongLivedHeap:
    """Start the policy in this process (once; later calls return the running one). For
    server processes (node coordinators, REST servers, gateways), not for libraries."""
    global _started
    with _lock:
        if _started is None:
            _started = LongLivedHeap()
            _started.start()
        return _started


__all__ = ["FREEZE_EVERY_S", "SWEEP_EVERY_S", "LongLivedHeap", "keep_long_lived_frozen"]
