"""PingFailureDetector: silent nodes fail after the timeout; our own stalls blame no one."""

from __future__ import annotations

import pytest

from coordinator.failure_detector import PingFailureDetector
from tests.unit.support import Clock


def test_silent_node_fails_after_timeout_and_answering_node_does_not() -> None:
    clock = Clock()
    fd = PingFailureDetector(timeout_s=3.0, tick_interval_s=0.5, clock=clock)
    fd.watch("a")
    fd.watch("b")
    for _ in range(6):  # 3.0 s of regular ticks; only "a" answers
        clock.now += 0.5
        fd.tick()
        fd.heard_from("a")
    assert fd.failed() == []  # exactly at the timeout is not past it
    clock.now += 0.5
    fd.tick()
    fd.heard_from("a")
    assert fd.failed() == ["b"]
    assert fd.silent_for("b") == pytest.approx(3.5)


def test_a_stall_of_the_detector_itself_is_not_blamed_on_nodes() -> None:
    clock = Clock()
    fd = PingFailureDetector(timeout_s=3.0, tick_interval_s=0.5, clock=clock)
    fd.watch("a")
    clock.now += 0.5
    fd.tick()
    fd.heard_from("a")
    clock.now += 10.0  # the singleton's loop was blocked for 10 s
    fd.tick()
    assert fd.failed() == []
    # Silence after the stall still counts.
    for _ in range(8):
        clock.now += 0.5
        fd.tick()
    assert fd.failed() == ["a"]


def test_ordinary_jitter_is_not_forgiven() -> None:
    clock = Clock()
    fd = PingFailureDetector(timeout_s=3.0, tick_interval_s=1.0, clock=clock)
    fd.watch("a")
    for _ in range(2):
        clock.now += 1.9  # late, but within one interval: jitter, not a stall
        fd.tick()
    assert fd.failed() == ["a"]


def test_unwatched_and_new_nodes() -> None:
    clock = Clock()
    fd = PingFailureDetector(timeout_s=1.0, tick_interval_s=0.25, clock=clock)
    fd.heard_from("ghost")  # ignored: not watched
    assert fd.watched == ()
    fd.watch("a")
    clock.now += 2
    fd.watch("a")  # re-watching does not reset an existing deadline
    fd.watch("b")
    assert fd.failed() == ["a"]
    assert fd.failed(among=["b"]) == []
    fd.unwatch("a")
    assert fd.failed() == []


@pytest.mark.parametrize(("timeout", "tick"), [(0, 1), (1, 0), (1, 1), (1, 2)])
def test_bad_timings_are_rejected(timeout: float, tick: float) -> None:
    with pytest.raises(ValueError):
        PingFailureDetector(timeout_s=timeout, tick_interval_s=tick)
