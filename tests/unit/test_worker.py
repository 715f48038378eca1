"""The background-thread base (core/worker.py): a named daemon thread that runs its loop from
`start` until `stop`, which cuts its waits short and waits for it as long as asked."""

from __future__ import annotations

import threading
import time

from core.worker import Worker


def test_the_loop_runs_on_a_named_daemon_thread_until_stopped() -> None:
    seen: list[threading.Thread] = []
    rounds = threading.Semaphore(0)

    def loop() -> None:
        seen.append(threading.current_thread())
        while not worker.wait(0.01):
            rounds.release()

    worker = Worker("test-loop", loop)
    assert not worker.running and not worker.stopping
    worker.start()
    assert rounds.acquire(timeout=5) and rounds.acquire(timeout=5)  # it goes round
    assert worker.running
    assert seen[0].name == "test-loop" and seen[0].daemon
    assert worker.stop(timeout=5)
    assert worker.stopping and not worker.running


def test_stop_cuts_a_long_wait_short() -> None:
    told: list[bool] = []
    worker = Worker("sleeper", lambda: told.append(worker.wait(3600)))
    worker.start()
    began = time.monotonic()
    assert worker.stop(timeout=5)
    assert time.monotonic() - began < 5
    assert told == [True]  # the wait said it was told to stop


def test_a_subclass_loop_blocked_elsewhere_is_woken_by_its_interrupt() -> None:
    class Blocked(Worker):
        def __init__(self) -> None:
            super().__init__("blocked")
            self.wake = threading.Event()

        def _run(self) -> None:
            while not self.stopping:
                self.wake.wait()
                self.wake.clear()

        def _interrupt(self) -> None:
            self.wake.set()

    worker = Blocked()
    worker.start()
    assert worker.stop(timeout=5)


def test_stop_with_no_timeout_waits_for_the_loop_and_zero_does_not_wait() -> None:
    release = threading.Event()
    worker = Worker("slow-exit", lambda: release.wait(5))  # ignores the stop until released
    worker.start()
    assert not worker.stop(timeout=0)  # told, still running
    assert worker.running
    release.set()
    assert worker.stop()  # waits as long as it takes
    assert not worker.running


def test_stop_before_start_and_twice_is_harmless() -> None:
    worker = Worker("never-started")
    assert worker.stop(timeout=0) and worker.stopping and not worker.running
    assert worker.stop()


def test_a_loop_that_returns_by_itself_is_no_longer_running() -> None:
    done = threading.Event()
    worker = Worker("one-shot", done.set)
    worker.start()
    assert done.wait(5)
    assert worker.stop(timeout=5)
    assert not worker.running
