"""The long-lived heap policy (core/heap.py): when it freezes and sweeps, with a fake
collector and clock; and with Python's own collector, that frozen garbage waits for the sweep
and nothing else is lost."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from core.heap import LongLivedHeap
from tests.unit.support import Clock


class FakeCollector:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def collect(self) -> int:
        self.calls.append("collect")
        return 3

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")

    def get_freeze_count(self) -> int:
        return 42


def test_freezes_at_start_then_every_interval_and_sweeps_at_its_own() -> None:
    gc_, clock = FakeCollector(), Clock()
    heap = LongLivedHeap(freeze_every_s=60, sweep_every_s=600, collector=gc_, clock=clock)
    assert heap.tick() == "freeze" and gc_.calls == ["collect", "freeze"]
    assert heap.frozen == 42
    clock.now += 59
    assert heap.tick() is None
    clock.now += 1
    assert heap.tick() == "freeze"
    gc_.calls.clear()
    clock.now = 1000.0 + 600
    assert heap.tick() == "sweep" and gc_.calls == ["unfreeze", "collect", "freeze"]
    assert heap.swept == 3
    clock.now += 30  # the sweep froze too: the next freeze is an interval later
    assert heap.tick() is None
    clock.now += 30
    assert heap.tick() == "freeze"


def test_a_sweep_asked_for_comes_after_its_delay_and_the_hourly_one_stays() -> None:
    gc_, clock = FakeCollector(), Clock()
    heap = LongLivedHeap(freeze_every_s=60, sweep_every_s=3600, collector=gc_, clock=clock)
    heap.tick()
    clock.now += 10
    heap.sweep_soon(delay_s=5)
    clock.now += 4
    assert heap.tick() is None
    clock.now += 1
    assert heap.tick() == "sweep"
    clock.now += 60
    assert heap.tick() == "freeze"  # back to freezing; the next sweep an hour from this one
    clock.now += 3600 - 60 - 1
    assert heap.tick() == "freeze"
    clock.now += 1
    assert heap.tick() == "sweep"


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def real_gc() -> Iterator[None]:
    yield
    gc.unfreeze()  # leave the test process as it was


def test_frozen_cycles_are_freed_by_the_sweep_and_young_ones_as_usual(real_gc: None) -> None:
    clock = Clock()
    heap = LongLivedHeap(freeze_every_s=60, sweep_every_s=600, clock=clock)
    old = Node()
    old_ref = weakref.ref(old)
    assert heap.tick() == "freeze" and heap.frozen > 0
    del old  # garbage now, but frozen: collections pass it by
    gc.collect()
    assert old_ref() is not None
    young = Node()  # made after the freeze: collected as usual
    young_ref = weakref.ref(young)
    del young
    gc.collect()
    assert young_ref() is None
    clock.now += 600
    assert heap.tick() == "sweep"
    assert old_ref() is None and heap.swept >= 1
