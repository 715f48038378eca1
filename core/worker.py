"""A background loop on its own named daemon thread, with a stop flag: the start, stop and
join that each of FiloPy's background threads would otherwise write by hand.

Daemon threads, so a loop never keeps a process alive that is on its way out; named, because
thread dumps, profiles and logs name them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Worker:
    """Runs `target()` (or a subclass's `_run()`) on a daemon thread named `name`, from
    `start()` until it returns; `stop()` asks it to return and waits for it.

    The loop checks `stopping`, or sleeps in `wait()`, which a stop cuts short. A loop that
    blocks on something else (its own event, a socket) is woken by overriding `_interrupt()`.
    """

    def __init__(self, name: str, target: Callable[[], None] | None = None) -> None:
        self.name = name
        self._target = target
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """The loop: returns once `stopping` (or when it has nothing more to do)."""
        if self._target is not None:
            self._target()

    def stop(self, timeout: float | None = None) -> bool:
        """Ask the loop to return and wait up to `timeout` for it (None: as long as it takes;
        0: not at all); whether it has returned. Harmless before `start` and when repeated."""
        self._stop.set()
        self._interrupt()
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    def _interrupt(self) -> None:
        """Wake the loop from whatever it blocks on besides `wait()`; nothing by default."""

    def wait(self, timeout: float) -> bool:
        """Sleep `timeout` seconds, less if told to stop meanwhile; whether told to stop."""
        return self._stop.wait(timeout)

    @property
    def stopping(self) -> bool:
        """Told to stop (the loop should return)."""
        return self._stop.is_set()

    @property
    def running(self) -> bool:
        """Started and not returned yet."""
        return self._thread is not None and self._thread.is_alive()


class CheckedWorker(Worker):
    """A Worker whose loop (`_loop()`) fails into its owner's hands rather than the thread's
    excepthook: whatever it raises ends the thread, is kept in `failure`, and `check()`
    re-raises it on the owner's thread (a shard's flush and downsampling threads: the ingester
    stops on what stopped them). `_done()` runs after the loop, its failure already recorded."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.failure: BaseException | None = None

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as e:
            self.failure = e
        finally:
            self._done()

    def _loop(self) -> None:
        raise NotImplementedError

    def _done(self) -> None:
        """What must follow the loop however it ended; nothing by default."""

    def check(self) -> None:
        """Re-raise what ended the loop, if anything did."""
        if self.failure is not None:
            raise self.failure


__all__ = ["CheckedWorker", "Worker"]
