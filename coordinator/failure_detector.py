"""Ping-based failure detection for nodes that hang without dying.

Ray reports a dead actor at once when its process exits, but a node that hangs (a blocked event
loop, a stopped VM, a partition) answers nothing and Ray's own node health check takes ~15-30 s.
The singleton pings every node coordinator and asks this detector who has been silent too long.

A busy machine must not cause false moves: when the singleton itself was stalled (its check loop
ran late), every node looks late at once. So a late tick extends every node's deadline by the
stall, and only silence that happened while the detector was watching counts against a node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable


class PingFailureDetector:
    """Tracks the last answer from each node; `failed()` lists nodes silent past the timeout."""

    def __init__(
        self,
        timeout_s: float,
        tick_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout_s <= 0 or tick_interval_s <= 0:
            raise ValueError("timeout_s and tick_interval_s must be positive")
        if tick_interval_s >= timeout_s:
            raise ValueError(
                f"tick_interval_s ({tick_interval_s}) must be shorter than timeout_s ({timeout_s})"
            )
        self.timeout_s = timeout_s
        self.tick_interval_s = tick_interval_s
        self._clock = clock
        self._last_heard: dict[str, float] = {}
        self._last_tick = clock()

    @property
    def watched(self) -> tuple[str, ...]:
        return tuple(self._last_heard)

    def watch(self, node: str) -> None:
        """Start watching a node, as if it had just answered (a new node gets a full timeout)."""
        self._last_heard.setdefault(node, self._clock())

    def unwatch(self, node: str) -> None:
        self._last_heard.pop(node, None)

    def heard_from(self, node: str) -> None:
        if node in self._last_heard:
            self._last_heard[node] = self._clock()

    def tick(self) -> None:
        """Call once per check loop; forgives the part of a late tick that was our own stall."""
        now = self._clock()
        stall = (now - self._last_tick) - self.tick_interval_s
        # Up to one interval of lateness is ordinary scheduling jitter; beyond that we were stalled.
        if stall > self.tick_interval_s:
            for node in self._last_heard:
                self._last_heard[node] += stall
        self._last_tick = now

    def silent_for(self, node: str) -> float:
        return max(0.0, self._clock() - self._last_heard[node])

    def failed(self, among: Iterable[str] | None = None) -> list[str]:
        """Watched nodes silent for longer than the timeout, oldest silence first."""
        now = self._clock()
        nodes = self._last_heard if among is None else [n for n in among if n in self._last_heard]
        late = [n for n in nodes if now - self._last_heard[n] > self.timeout_s]
        return sorted(late, key=lambda n: self._last_heard[n])
