"""OrderedInbox releases batches in the order the Sequencer stamped them, whatever arrives first."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from coordinator.inbox import OrderedInbox, Sequencer
from tests.unit.support import Clock


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


# ----- resync: a lost batch never holds a receiver back for good -----------------------------


def test_a_resync_after_a_gap_supersedes_what_was_missed() -> None:
    seq = Sequencer(incarnation=1.0)
    b1, lost, b3 = (seq.stamp("s", (f"e{i}",)) for i in range(1, 4))
    resync = seq.stamp("s", ("snapshot",), resync=True)
    b5 = seq.stamp("s", ("e5",))
    inbox = OrderedInbox()
    assert inbox.push(b1) == ["e1"]
    assert inbox.push(b3) == []  # waits for the lost batch 2...
    assert inbox.push(b5) == []
    assert inbox.waiting == 2
    assert inbox.push(resync) == ["snapshot", "e5"]  # ...until the full state replaces it
    assert inbox.waiting == 0
    assert inbox.resyncs == 1
    assert inbox.push(lost) == []  # arriving late after all: superseded
    assert inbox.push(b3) == []
    assert inbox.push(seq.stamp("s", ("e6",))) == ["e6"]


def test_a_resync_reveals_a_lost_last_batch() -> None:
    seq = Sequencer(incarnation=1.0)
    inbox = OrderedInbox()
    assert inbox.push(seq.stamp("s", ("e1",))) == ["e1"]
    seq.stamp("s", ("e2",))  # lost, and nothing else follows it
    assert inbox.push(seq.stamp("s", ("snapshot",), resync=True)) == ["snapshot"]


def test_a_resync_without_a_gap_is_dropped() -> None:
    seq = Sequencer(incarnation=1.0)
    inbox = OrderedInbox()
    assert inbox.push(seq.stamp("s", ("e1",))) == ["e1"]
    assert inbox.push(seq.stamp("s", ("snapshot",), resync=True)) == []  # nothing was missed
    assert inbox.push(seq.stamp("s", ("e3",))) == ["e3"]
    assert inbox.resyncs == 0


def test_a_resync_that_arrives_before_a_late_batch_wins() -> None:
    """Ray may run a later call first: the resync releases, the late batch it covers is dropped,
    and what follows the resync still comes out in order."""
    seq = Sequencer(incarnation=1.0)
    late = seq.stamp("s", ("e1",))
    resync = seq.stamp("s", ("snapshot",), resync=True)
    after = seq.stamp("s", ("e3",))
    inbox = OrderedInbox()
    assert inbox.push(after) == []
    assert inbox.push(resync) == ["snapshot", "e3"]  # a new stream starting with a gap
    assert inbox.push(late) == []


def test_a_resync_opening_a_stream_is_released() -> None:
    """The first batch of a new stream (a restarted singleton) is never dropped as redundant:
    what the receiver holds came from the previous stream."""
    old, new = Sequencer(incarnation=1.0), Sequencer(incarnation=2.0)
    inbox = OrderedInbox()
    assert inbox.push(old.stamp("s", ("old",))) == ["old"]
    assert inbox.push(new.stamp("s", ("snapshot",), resync=True)) == ["snapshot"]


def test_a_forgotten_receiver_starts_a_new_stream() -> None:
    seq = Sequencer(incarnation=1.0)
    inbox = OrderedInbox()
    assert inbox.push(seq.stamp("s", ("a",))) == ["a"]
    seq.stamp("s", ("lost",))
    seq.forget("s")
    assert inbox.push(seq.stamp("s", ("b",))) == ["b"]


@given(
    n=st.integers(1, 40),
    resync_every=st.integers(2, 8),
    seed=st.integers(0, 100_000),
    loss=st.floats(0.0, 0.5),
)
def test_receivers_converge_on_the_senders_state_whatever_is_lost(
    n: int, resync_every: int, seed: int, loss: float
) -> None:
    """The sender keeps a dict and sends each change as an event and, every few changes, its
    whole state as a resync. Whatever batches are lost (but the last resync) and whatever order
    the rest arrive in, the receiver ends with the sender's state, and it never goes backwards:
    nothing released after a resync predates it."""
    rng = random.Random(seed)
    seq = Sequencer(incarnation=1.0)
    state: dict[int, int] = {}
    sent: list[tuple[bool, Any]] = []  # (lossless, delivery)
    for i in range(n):
        key = rng.randrange(5)
        state[key] = i
        sent.append((False, seq.stamp("r", (("set", key, i),))))
        if (i + 1) % resync_every == 0:
            sent.append((False, seq.stamp("r", (("all", dict(state)),), resync=True)))
    sent.append((True, seq.stamp("r", (("all", dict(state)),), resync=True)))  # the next one
    arriving = [d for keep, d in sent if keep or rng.random() >= loss]
    rng.shuffle(arriving)
    arriving.sort(key=lambda d: d.resync and d is sent[-1][1])  # the final resync comes last

    inbox = OrderedInbox()
    mirror: dict[int, int] = {}
    last_seen = -1
    for d in arriving:
        for kind, *args in inbox.push(d):
            if kind == "set":
                key, value = args
                assert value > last_seen
                mirror[key] = last_seen = value
            else:
                (mirror,) = args
                mirror = dict(mirror)
                last_seen = max(mirror.values(), default=-1)
    assert mirror == state
    assert inbox.waiting == 0


# ----- grace: a resync waits for batches that are only late ---------------------------------


def test_a_resync_overtaking_late_batches_waits_for_them_and_every_event_arrives() -> None:
    """A brand-new subscriber: its snapshot (1) and events (2, 3) are late, the periodic resync
    (4) arrives first. Within the grace, the late batches fill the gap: the subscriber sees
    everything in order and the resync, now redundant, is dropped."""
    seq, clock = Sequencer(incarnation=1.0), Clock(100.0)
    snapshot, down, up = (seq.stamp("s", (m,)) for m in ("snapshot", "down", "up"))
    resync = seq.stamp("s", ("resync",), resync=True)
    inbox = OrderedInbox(grace_s=2.0, clock=clock)
    assert inbox.push(resync) == []
    assert inbox.due() == 102.0
    clock.now = 101.0
    assert inbox.expire() == []
    assert inbox.push(down) == []
    assert inbox.push(snapshot) == ["snapshot", "down"]
    assert inbox.push(up) == ["up"]
    assert inbox.due() is None and inbox.resyncs == 0
    assert inbox.push(seq.stamp("s", ("next",))) == ["next"]


def test_past_the_grace_the_resync_replaces_what_never_came() -> None:
    seq, clock = Sequencer(incarnation=1.0), Clock(100.0)
    first = seq.stamp("s", ("e1",))
    seq.stamp("s", ("lost",))
    resync = seq.stamp("s", ("snapshot",), resync=True)
    after = seq.stamp("s", ("e4",))
    inbox = OrderedInbox(grace_s=2.0, clock=clock)
    assert inbox.push(first) == ["e1"]
    assert inbox.push(resync) == []
    assert inbox.push(after) == []  # behind the gap
    clock.now = 102.0
    assert inbox.expire() == ["snapshot", "e4"]
    assert inbox.resyncs == 1 and inbox.due() is None and inbox.waiting == 0


def test_a_later_resync_within_the_grace_replaces_the_held_one_without_postponing_it() -> None:
    seq, clock = Sequencer(incarnation=1.0), Clock(100.0)
    seq.stamp("s", ("lost",))
    r1 = seq.stamp("s", ("state1",), resync=True)
    r2 = seq.stamp("s", ("state2",), resync=True)
    inbox = OrderedInbox(grace_s=2.0, clock=clock)
    assert inbox.push(r1) == []
    clock.now = 101.5
    assert inbox.push(r2) == []
    assert inbox.due() == 102.0
    clock.now = 102.0
    assert inbox.expire() == ["state2"]
