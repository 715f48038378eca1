"""The one backoff every retry uses (core/backoff.py): how the delay grows, where it stops,
when a scheduled retry is due, and what a success undoes."""

from __future__ import annotations

import pytest

from core.backoff import Backoff


def test_the_delay_doubles_from_the_first_up_to_the_cap() -> None:
    b = Backoff(0.05, 2.0)
    assert [b.next() for _ in range(8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_a_cap_that_is_not_a_power_of_two_of_the_first_delay_is_reached_exactly() -> None:
    b = Backoff(30.0, 600.0)
    assert [b.next() for _ in range(7)] == [30.0, 60.0, 120.0, 240.0, 480.0, 600.0, 600.0]


def test_a_cap_below_the_first_delay_keeps_the_first_delay() -> None:
    b = Backoff(5.0, 1.0)
    assert b.max_s == 5.0
    assert [b.next() for _ in range(3)] == [5.0, 5.0, 5.0]


def test_reset_starts_over_from_the_first_delay() -> None:
    b = Backoff(0.5, 10.0)
    assert [b.next() for _ in range(3)] == [0.5, 1.0, 2.0]
    b.reset()
    assert [b.next() for _ in range(2)] == [0.5, 1.0]


def test_a_scheduled_retry_is_due_after_the_delay_of_its_failure() -> None:
    b = Backoff(1.0, 4.0)
    assert b.ready(0.0)  # nothing failed yet
    assert b.fail(100.0) == 1.0 and b.retry_at == 101.0
    assert not b.ready(100.5)
    assert b.ready(101.0)
    assert b.fail(101.0) == 2.0 and b.retry_at == 103.0
    assert b.fail(103.0) == 4.0 and b.fail(107.0) == 4.0 and b.retry_at == 111.0
    assert not b.ready(110.0)


def test_reset_makes_a_scheduled_retry_due_at_once_and_the_next_failure_short() -> None:
    b = Backoff(1.0, 8.0)
    b.fail(0.0)
    b.fail(1.0)
    assert not b.ready(2.0)
    b.reset()
    assert b.ready(2.0)
    assert b.fail(2.0) == 1.0 and b.retry_at == 3.0


def test_blocking_and_scheduled_failures_share_one_growing_delay() -> None:
    b = Backoff(1.0, 100.0)
    assert b.next() == 1.0
    assert b.fail(10.0) == 2.0 and b.retry_at == 12.0
    assert b.next() == 4.0


@pytest.mark.parametrize("initial", [0.0, -1.0])
def test_a_first_delay_must_be_positive(initial: float) -> None:
    with pytest.raises(ValueError, match="initial_s > 0"):
        Backoff(initial, 10.0)
