"""The one wait of the test suite: poll a condition until it holds or a generous deadline passes.

A loaded two-core machine is slow, never wrong: a test waits for what it needs to see, not for a
fixed time, and its deadline is long enough that only a real failure reaches it. At the deadline
the AssertionError names what was awaited and the last thing the check returned or raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

DEADLINE_S = 120.0
SLOWEST_S = 0.25  # the longest pause between two checks of a wait


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout_s: float = DEADLINE_S,
    *,
    interval_s: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `check` until it returns something truthy, and return that. The first pause is
    `interval_s`, each next one half again as long, up to `SLOWEST_S`: a check may be a REST
    call or a metrics scrape that costs the cluster CPU, so a wait of seconds asks a few times a
    second while a short one still ends soon after its condition. Exceptions of the `retry_on`
    types count as "not yet" (a service still starting)."""
    deadline = time.monotonic() + timeout_s
    pause = interval_s
    last: Any = None
    while True:
        try:
            last = check()
        except retry_on as e:
            last = e
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s (last: {last!r})")
        time.sleep(pause)
        pause = max(interval_s, min(pause * 1.5, SLOWEST_S))


def eventually(get: Callable[[], Any], want: Any, timeout_s: float = DEADLINE_S) -> None:
    """Poll `get()` until it equals `want`, then assert it (pytest shows the difference)."""
    got: list[Any] = [None]

    def equal() -> bool:
        got[0] = get()
        return bool(got[0] == want)

    try:
        wait_for(f"{want!r}", equal, timeout_s, interval_s=0.5)
    except AssertionError:
        assert got[0] == want
