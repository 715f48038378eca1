"""The in-memory shape of ingested samples: columnar, so the hot path is NumPy, not Python.

A batch holds the samples of one Kafka message (or one gateway call): the distinct series it
touches, once each, and per sample an index into them plus the timestamp and value.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Labels = dict[str, str]


@dataclass(slots=True)
class SampleBatch:
    """Samples of many series. `series_idx[i]` says which of `series` sample i belongs to."""

    series: list[Labels]
    series_idx: npt.NDArray[np.int32]
    timestamps: npt.NDArray[np.int64]  # milliseconds since the epoch
    values: npt.NDArray[np.float64]
    bad_records: dict[str, int] = field(default_factory=dict)  # reason -> count, skipped

    def __post_init__(self) -> None:
        n = len(self.timestamps)
        if len(self.series_idx) != n or len(self.values) != n:
            raise ValueError("series_idx, timestamps and values must have the same length")

    def __len__(self) -> int:
        return len(self.timestamps)

    @classmethod
    def empty(cls) -> SampleBatch:
        return cls([], np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.float64))


@dataclass(slots=True)
class KeyedBatch(SampleBatch):
    """A batch whose decoder gives each series a cheap hashable key: equal keys mean equal
    labels, for the life of the process: an int from `new_series_key` per cached label dict
    (remote write's and line protocol's decoders), or the bytes of the series' labels as the
    binary format encodes them (ints and bytes never compare equal). The gateway and the
    memstore find known series by key, without building and hashing a tuple of the labels. A
    batch derived with other series must not keep the keys."""

    keys: list[Hashable] = field(default_factory=list)


@dataclass(slots=True)
class IntKeyedBatch(KeyedBatch):
    """A `KeyedBatch` whose keys are `new_series_key` ints, also as an int64 array: the gateway
    finds their series all at once in NumPy, not with a dict lookup per series."""

    key_array: npt.NDArray[np.int64] = field(default_factory=lambda: np.empty(0, np.int64))


new_series_key: Callable[[], int] = itertools.count(1).__next__  # atomic under the GIL
"""A `KeyedBatch` key never given before in this process, so decoders' keys never collide."""
