"""Starting a Ray node on a busy machine, again when Ray gives up on it.

Ray waits a fixed 30 s for a new node's raylet to register with the GCS, then raises "The
current node timed out during startup" and leaves that attempt's processes running (it hands
the half-started node back to nobody). On a loaded machine a healthy start can take longer, so
`started` kills that attempt's processes and starts the node again, a few times, as a service
manager would restart the command: `filopy up`, `filopy head`, `filopy node join` and the test
clusters all start their nodes through it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger("filopy.ray")

T = TypeVar("T")
START_ATTEMPTS = 3
TIMED_OUT = "timed out during startup"  # Ray's message (ray/_private/node.py)


def started(start: Callable[[], T], what: str, attempts: int = START_ATTEMPTS) -> T:
    """`start()`'s result; if Ray timed out starting the node, the attempt's processes are
    killed and `start` is called again, `attempts` times in all (the last time's error goes
    through, its processes killed too). Other errors go through at once."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except Exception as e:
            if TIMED_OUT not in str(e):
                raise
            killed = _kill_half_started(e)
            if attempt == attempts:
                raise
            log.warning(
                "%s: Ray timed out starting the node (attempt %d of %d); %s, starting it again",
                what,
                attempt,
                attempts,
                "its processes killed" if killed else "its processes not killed",
            )
    raise AssertionError("unreachable")


def _kill_half_started(exc: BaseException) -> bool:
    """Kill the processes of the node whose constructor raised `exc`: the innermost `__init__`
    frame of the traceback whose `self` can kill its processes (Ray's `Node`). A raylet that
    registers late then dies at once instead of joining beside the next attempt's. Whether it
    was killed."""
    node = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        candidate = frame.f_locals.get("self")
        if frame.f_code.co_name == "__init__" and hasattr(candidate, "kill_all_processes"):
            node = candidate
        tb = tb.tb_next
    if node is None:
        return False
    try:
        node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
    except Exception:
        log.exception("killing the processes of a node Ray gave up on")
        return False
    return True
