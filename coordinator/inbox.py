"""In-order delivery over Ray, whose async actors may run calls out of submission order.

The singleton stamps every batch it sends one receiver with the receiver's *stream* (the
singleton's incarnation and the registration number of that subscription) and a sequence number
within the stream. The receiver's `OrderedInbox` releases batches strictly in sequence order,
holding early ones back. A newer stream (a restarted singleton, or a re-subscription) resets the
sequence; anything from an older stream is dropped, since its sender is gone or superseded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Stream = tuple[float, int]  # (singleton incarnation, registration number)


@dataclass(frozen=True, slots=True)
class Delivery:
    stream: Stream
    seq: int  # 1, 2, 3, ... within the stream
    messages: tuple[Any, ...]


class OrderedInbox:
    def __init__(self) -> None:
        self._stream: Stream | None = None
        self._next = 1
        self._early: dict[int, Delivery] = {}

    def push(self, delivery: Delivery) -> list[Any]:
        """The messages now ready, in order (possibly none, possibly several batches' worth)."""
        if self._stream is None or delivery.stream > self._stream:
            self._stream, self._next, self._early = delivery.stream, 1, {}
        elif delivery.stream < self._stream or delivery.seq < self._next:
            return []  # from a superseded stream, or a duplicate
        self._early[delivery.seq] = delivery
        ready: list[Any] = []
        while self._next in self._early:
            ready.extend(self._early.pop(self._next).messages)
            self._next += 1
        return ready

    @property
    def waiting(self) -> int:
        """Batches held back until the ones before them arrive."""
        return len(self._early)


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

    def stamp(self, receiver: str, messages: tuple[Any, ...]) -> Delivery:
        if receiver not in self._streams:
            self.register(receiver)
        entry = self._streams[receiver]
        entry[1] += 1
        return Delivery(entry[0], entry[1], messages)
