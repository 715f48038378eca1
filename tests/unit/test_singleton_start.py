"""`start_cluster_actor`'s wait for Ray to free a stuck singleton's name, as the pure wait it
is built on; the real cluster's case (a singleton Ray does not create again is created anew on
the head) is tests/runtime/test_singleton_placement.py's."""

from __future__ import annotations

from core.backoff import poll_until
from core.errors import Unavailable, category_of


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_wait_ends_as_soon_as_the_name_is_free() -> None:
    clock, checks = _Clock(), []

    def free() -> bool:
        checks.append(clock.now)
        return len(checks) > 3

    assert poll_until(free, 60.0, 0.2, clock=clock, sleep=clock.sleep)
    assert len(checks) == 4 and clock.now < 1.0


def test_a_name_never_freed_ends_the_wait_at_its_deadline() -> None:
    clock = _Clock()
    assert not poll_until(lambda: False, 60.0, 0.2, clock=clock, sleep=clock.sleep)
    assert 60.0 <= clock.now < 60.5


def test_a_name_never_freed_is_unavailable_retry_later() -> None:
    from coordinator.cluster_actor import NAME_RELEASE_TIMEOUT_S, SingletonUnavailable

    assert category_of(SingletonUnavailable) is Unavailable
    assert NAME_RELEASE_TIMEOUT_S > 0
