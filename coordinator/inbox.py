"""In-order delivery over Ray, whose async actors may run calls out of submission order.

The singleton stamps every batch it sends one receiver with the receiver's *stream* (the
singleton's incarnation and the registration number of that subscription) and a sequence number
within the stream. The receiver's `OrderedInbox` releases batches strictly in sequence order,
holding early ones back. A newer stream (a restarted singleton, or a re-subscription) resets the
sequence; anything from an older stream is dropped, since its sender is gone or superseded.

A batch that never arrives would hold back everything after it forever. So the singleton
periodically sends every receiver a *resync* batch: the receiver's full state (a fresh snapshot
of each dataset it follows), which supersedes every batch stamped before it. An inbox with a gap
before a resync batch drops what it was waiting for and resumes from the resync; an inbox with no
gap has already released everything the resync says, so it drops the resync instead (receivers
see a repeated snapshot only when they may have missed something).

A gap is usually only lateness (the batches before the resync are still on their way), and a
resync that filled it at once would drop events that were about to arrive. So an inbox with a
`grace_s` holds a resync that found a gap for that long: if the gap fills meanwhile the receiver
gets every event and the resync is dropped; only past the grace does the resync supersede the
gap (`expire()`, which a receiver calls when `due()` says so, or the next `push`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Stream = tuple[float, int]  # (singleton incarnation, registration number)


@dataclass(frozen=True, slots=True)
class Delivery:
    stream: Stream
    seq: int  # 1, 2, 3, ... within the stream
    messages: tuple[Any, ...]
    resync: bool = False  # the receiver's full state: supersedes every batch before it


class OrderedInbox:
    def __init__(self, grace_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._stream: Stream | None = None
        self._next = 1
        self._early: dict[int, Delivery] = {}
        self._resyncs = 0
        self._grace_s, self._clock = grace_s, clock
        self._held: Delivery | None = None  # a resync that found a gap, within its grace
        self._held_until = 0.0

    def push(self, delivery: Delivery) -> list[Any]:
        """The messages now ready, in order (possibly none, possibly several batches' worth)."""
        if self._stream is None or delivery.stream > self._stream:
            self._stream, self._next, self._early, self._held = delivery.stream, 1, {}, None
        elif delivery.stream < self._stream or delivery.seq < self._next:
            return []  # from a superseded stream, a duplicate, or superseded by a resync
        ready: list[Any] = []
        if delivery.resync and delivery.seq > self._next:
            # A gap: batches before it are late or lost. Hold the full state for the grace;
            # past it, the resync replaces what is missing (`_supersede`).
            if self._held is None:
                self._held_until = self._clock() + self._grace_s
            if self._held is None or delivery.seq > self._held.seq:
                self._held = delivery
        elif delivery.resync and self._next == 1:
            ready.extend(self._supersede(delivery))  # a fresh stream starting with its state
        elif delivery.resync:
            self._next += 1  # nothing missed: the receiver already holds this state
        else:
            self._early[delivery.seq] = delivery
        ready.extend(self._release())
        ready.extend(self.expire())
        return ready

    def due(self) -> float | None:
        """When a held resync supersedes its gap (the clock's time), if one is held."""
        return None if self._held is None else self._held_until

    def expire(self) -> list[Any]:
        """Apply a held resync whose grace has run out; the messages now ready."""
        if self._held is None or self._clock() < self._held_until:
            return []
        return self._supersede(self._held) + self._release()

    def _supersede(self, resync: Delivery) -> list[Any]:
        """Take the full state, drop what it supersedes; a batch before it that arrives later
        is dropped as superseded."""
        self._early = {s: d for s, d in self._early.items() if s > resync.seq}
        self._held = None
        self._resyncs += 1
        self._next = resync.seq + 1
        return list(resync.messages)

    def _release(self) -> list[Any]:
        ready: list[Any] = []
        while True:
            if self._next in self._early:
                ready.extend(self._early.pop(self._next).messages)
                self._next += 1
            elif self._held is not None and self._held.seq == self._next:
                self._held = None  # the gap filled in time: nothing missed, state known
                self._next += 1
            elif self._held is not None and self._held.seq < self._next:
                self._held = None
            else:
                return ready

    @property
    def waiting(self) -> int:
        """Batches held back until the ones before them arrive (or a resync supersedes them)."""
        return len(self._early)

    @property
    def resyncs(self) -> int:
        """How many times a resync batch filled a gap (or started a stream) here."""
        return self._resyncs


class Sequencer:
    """The sending side: a stream and a sequence number per receiver."""

    def __init__(self, incarnation: float) -> None:
        self._incarnation = incarnation
        self._registrations = 0
        self._streams: dict[str, list[Any]] = {}  # receiver -> [stream, last seq]

    def register(self, receiver: str) -> None:
        """Start a new stream for `receiver` (it resets the receiver's inbox)."""
        self._registrations += 1
        self._streams[receiver] = [(self._incarnation, self._registrations), 0]

    def stamp(self, receiver: str, messages: tuple[Any, ...], *, resync: bool = False) -> Delivery:
        """The next batch for `receiver`; `resync` when `messages` are its full state."""
        if receiver not in self._streams:
            self.register(receiver)
        entry = self._streams[receiver]
        entry[1] += 1
        return Delivery(entry[0], entry[1], messages, resync)

    def position(self, receiver: str) -> tuple[Stream, int] | None:
        """The stream and sequence number of the last batch stamped for `receiver`."""
        entry = self._streams.get(receiver)
        return None if entry is None else (entry[0], entry[1])

    def forget(self, receiver: str) -> None:
        """Drop a receiver that is gone (its next batch, if any, starts a new stream)."""
        self._streams.pop(receiver, None)
