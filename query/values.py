"""The values PromQL evaluation reads and produces, and the rules that keep them well-formed.

Kept apart from the evaluator so that everything that handles query results (the binary
operators, the pushdown merge, the node executor, the REST formatter) shares one definition of a
step matrix without importing the evaluator:

* `SeriesData` is one series' raw samples, read from a `SeriesSource` (`MemorySource` holds them
  in memory);
* `StepMatrix` is an instant vector at each evaluation step, NaN where a series has no value
  (NaN means "no value" in every step matrix); `Scalar` and `String` are the other result types;
* `dedupe`, `drop_name` and `finalize` are the normalisations every vector result goes through:
  label sets made equal (e.g. by dropping `__name__`) are merged into one series and are an
  "execution" error if they have values at the same step (Prometheus's per-step check); results
  drop series without any value and are ordered by label set (instant topk/bottomk by value).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from filopy.store.api import LabelMatcher
from query import aggregate as agg_mod
from query.aggregate import label_key
from query.promql import QueryError

__all__ = [
    "F64",
    "I64",
    "MemorySource",
    "RangeVector",
    "Scalar",
    "SeriesData",
    "SeriesSource",
    "StepMatrix",
    "String",
    "Value",
    "dedupe",
    "drop_name",
    "execution_error",
    "finalize",
    "fmt_labels",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

# ---------------------------------------------------------------------------------- data types


@dataclass(frozen=True, eq=False)
class SeriesData:
    """Raw samples of one series (labels include `__name__`); `ts` ascending, in ms."""

    labels: dict[str, str]
    ts: I64
    vals: F64

    def __post_init__(self) -> None:
        object.__setattr__(self, "ts", np.asarray(self.ts, dtype=np.int64))
        object.__setattr__(self, "vals", np.asarray(self.vals, dtype=np.float64))
        if self.ts.shape != self.vals.shape or self.ts.ndim != 1:
            raise ValueError("ts and vals must be 1-D arrays of equal length")


@dataclass(frozen=True, eq=False)
class StepMatrix:
    """An instant vector at each evaluation step: `values[i, j]` is series i at `times[j]`,
    NaN where the series has no value at that step."""

    times: I64
    labels: list[dict[str, str]]
    values: F64

    def __post_init__(self) -> None:
        if self.values.shape != (len(self.labels), len(self.times)):
            raise ValueError(
                f"values shape {self.values.shape} != ({len(self.labels)}, {len(self.times)})"
            )

    @classmethod
    def empty(cls, times: I64) -> StepMatrix:
        return cls(times, [], np.empty((0, len(times))))

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True, eq=False)
class Scalar:
    """A scalar per step; always present (a NaN value is a value)."""

    times: I64
    values: F64


@dataclass(frozen=True, eq=False)
class String:
    times: I64
    value: str


@dataclass(frozen=True, eq=False)
class RangeVector:
    """Raw samples per series: the answer of an instant query of a range vector (`x[5m]`, or a
    subquery), series i's samples `ts[i]`, `vals[i]` (ascending)."""

    time: int
    labels: list[dict[str, str]]
    ts: list[I64]
    vals: list[F64]


Value = StepMatrix | Scalar | String | RangeVector


class SeriesSource(Protocol):
    def select(
        self, matchers: Sequence[LabelMatcher], start_ms: int, end_ms: int
    ) -> Iterable[SeriesData]:
        """Every series matching all `matchers`, with its samples in [start_ms, end_ms]."""
        ...


class MemorySource:
    """A `SeriesSource` over series held in memory."""

    def __init__(self, series: Iterable[SeriesData]) -> None:
        self._series = list(series)

    def select(
        self, matchers: Sequence[LabelMatcher], start_ms: int, end_ms: int
    ) -> list[SeriesData]:
        out = []
        for s in self._series:
            if all(m.matches(s.labels) for m in matchers):
                a = int(np.searchsorted(s.ts, start_ms, side="left"))
                b = int(np.searchsorted(s.ts, end_ms, side="right"))
                out.append(SeriesData(s.labels, s.ts[a:b], s.vals[a:b]))
        return out


# ----------------------------------------------------------------------------- matrix helpers


def fmt_labels(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items())) + "}"


def execution_error(message: str) -> QueryError:
    return QueryError("execution", message)


def dedupe(m: StepMatrix) -> StepMatrix:
    """Merge rows with equal label sets; an error if two have a value at the same step."""
    groups, ids = agg_mod.distinct(m.labels)
    if len(groups) == len(m.labels):
        return m
    present = np.zeros((len(groups), len(m.times)), np.int64)
    np.add.at(present, ids, ~np.isnan(m.values))
    clash = np.argwhere(present > 1)
    if len(clash):
        raise execution_error(
            "vector cannot contain metrics with the same labelset: "
            + fmt_labels(groups[int(clash[0][0])])
        )
    merged = np.full((len(groups), len(m.times)), np.nan)
    np.fmax.at(merged, ids, m.values)  # at most one non-NaN per cell
    return StepMatrix(m.times, groups, merged)


def drop_name(m: StepMatrix) -> StepMatrix:
    if not any("__name__" in lab for lab in m.labels):
        return m
    labels = [{k: v for k, v in lab.items() if k != "__name__"} for lab in m.labels]
    return dedupe(StepMatrix(m.times, labels, m.values))


def finalize(m: StepMatrix, order_by_value: str | None = None) -> StepMatrix:
    """Drop series without any value; order by label set (or by value, for instant topk)."""
    keep = [i for i in range(len(m.labels)) if not np.isnan(m.values[i]).all()]
    if order_by_value is None:
        keep.sort(key=lambda i: label_key(m.labels[i]))
    else:
        sign = -1.0 if order_by_value == "desc" else 1.0
        keep.sort(key=lambda i: (sign * float(np.nanmax(m.values[i])), label_key(m.labels[i])))
    rows = np.array(keep, dtype=np.int64)
    return StepMatrix(
        m.times, [m.labels[i] for i in keep], m.values[rows].reshape(-1, len(m.times))
    )
