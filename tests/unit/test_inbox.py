"""OrderedInbox releases batches in the order the Sequencer stamped them, whatever arrives first."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from coordinator.inbox import OrderedInbox, Sequencer


def test_out_of_order_batches_are_released_in_order() -> None:
    seq = Sequencer(incarnation=1.0)
    batches = [seq.stamp("s", (i,)) for i in range(5)]
    inbox = OrderedInbox()
    assert inbox.push(batches[1]) == []
    assert inbox.push(batches[2]) == []
    assert inbox.waiting == 2
    assert inbox.push(batches[0]) == [0, 1, 2]
    assert inbox.push(batches[0]) == []  # a duplicate
    assert inbox.push(batches[4]) == []
    assert inbox.push(batches[3]) == [3, 4]


def test_a_new_stream_resets_and_the_old_one_is_dropped() -> None:
    old, new = Sequencer(incarnation=1.0), Sequencer(incarnation=2.0)
    inbox = OrderedInbox()
    old_batches = [old.stamp("s", (f"old{i}",)) for i in range(3)]
    assert inbox.push(old_batches[0]) == ["old0"]
    assert inbox.push(old_batches[2]) == []  # waits for old1...
    assert inbox.push(new.stamp("s", ("new0",))) == ["new0"]  # ...but the singleton restarted
    assert inbox.push(old_batches[1]) == []  # the dead singleton's late batch is dropped
    # Re-registering (a re-subscription) starts another stream from 1 too.
    new.register("s")
    assert inbox.push(new.stamp("s", ("again0",))) == ["again0"]


@given(n=st.integers(1, 30), seed=st.integers(0, 10_000))
def test_any_arrival_order_gives_the_sent_order(n: int, seed: int) -> None:
    seq = Sequencer(incarnation=5.0)
    batches = [seq.stamp("r", (i, i + 0.5)) for i in range(n)]
    random.Random(seed).shuffle(batches)
    inbox = OrderedInbox()
    out = [m for b in batches for m in inbox.push(b)]
    assert out == [x for i in range(n) for x in (i, i + 0.5)]
    assert inbox.waiting == 0
