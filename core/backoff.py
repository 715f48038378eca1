"""Exponential backoff: the delay before the next attempt, doubling after each failure up to a
cap, back to the first after a success.

Our own small class rather than tenacity or stamina: those run a blocking call in their retry
loop, while most of FiloPy's retries are scheduled instead (the flusher must not block the
ingesting thread, a query caller routes around a node until a given time, a node coordinator
retries from its event loop), the blocking ones must stop waiting the moment they are told to
stop, and every site logs the delay it is about to wait. Handing out the delay and leaving the
waiting to the caller serves them all.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable


class Backoff:
    """Delays of `initial_s`, doubling after each failure up to `max_s` (never below
    `initial_s`: a cap under the first delay keeps the first delay).

    A blocking retry loop waits `next()` after each failure; a scheduled one calls `fail(now)`
    and tries again once `ready(now)` (at `retry_at`). `reset()` after a success. Pure: no
    clock of its own, the caller says what time it is."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        if initial_s <= 0:
            raise ValueError(f"need initial_s > 0, got {initial_s}")
        self.initial_s = initial_s
        self.max_s = max(max_s, initial_s)
        self._delay = initial_s
        self.retry_at = -math.inf  # when the next attempt is due, after `fail`

    def next(self) -> float:
        """The delay to wait after this failure; the next one doubles (up to the cap)."""
        delay = self._delay
        self._delay = min(delay * 2, self.max_s)
        return delay

    def fail(self, now: float) -> float:
        """A failure at `now`: the next attempt is due at `retry_at`, after the returned delay."""
        delay = self.next()
        self.retry_at = now + delay
        return delay

    def ready(self, now: float) -> bool:
        """Whether the next attempt is due (always, before any failure or after a reset)."""
        return now >= self.retry_at

    def reset(self) -> None:
        """A success: the next failure waits `initial_s` again, and nothing waits now."""
        self._delay = self.initial_s
        self.retry_at = -math.inf


def poll_until(
    check: Callable[[], bool],
    timeout_s: float,
    interval_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Call `check` every `interval_s` until it is true (True) or `timeout_s` has passed
    (False): a wait for a condition with a deadline, never a fixed sleep."""
    deadline = clock() + timeout_s
    while clock() < deadline:
        if check():
            return True
        sleep(interval_s)
    return False


__all__ = ["Backoff", "poll_until"]
