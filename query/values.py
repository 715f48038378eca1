"""The values PromQL evaluation reads and produces, and the rules that keep them well-formed.

Kept apart from the evaluator so that everything that handles query results (the binary
operators, the pushdown merge, the node executor, the REST formatter) shares one definition of a
step matrix without importing the evaluator:

* `SeriesData` is one series' raw samples, read from a `SeriesSource` (`MemorySource` holds them
  in memory);
* `StepMatrix` is an instant vector at each evaluation step: `present` says where a series has a
  value, and `values` holds it (NaN where there is none). NaN is a value, as in Prometheus
  (`0/0`, `asin(2)`, a stored NaN sample): a present cell may hold NaN, and only `present` says
  whether a sample is there. `Scalar` and `String` are the other result types;
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

from query import aggregate as agg_mod
from query.aggregate import LabelKey, label_key
from query.promql import QueryError
from store.api import LabelMatcher

__all__ = [
    "F64",
    "I64",
    "Mask",
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
Mask = npt.NDArray[np.bool_]

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
    """An instant vector at each evaluation step: series i has a value at `times[j]` where
    `present[i, j]`, and that value is `values[i, j]` (which may be NaN: NaN is a value).

    `present` defaults to "where `values` is not NaN", for results that cannot hold NaN values;
    absent cells always hold NaN in `values`, so NaN-skipping reductions (`fmax`) see only
    present cells."""

    times: I64
    labels: list[dict[str, str]]
    values: F64
    present: Mask = None  # type: ignore[assignment]  # set by __post_init__
    # Made by `finalize` (label order, no empty rows): finalizing it again changes nothing.
    finalized: bool = False

    def __post_init__(self) -> None:
        shape = (len(self.labels), len(self.times))
        if self.values.shape != shape:
            raise ValueError(f"values shape {self.values.shape} != {shape}")
        if self.present is None:
            object.__setattr__(self, "present", ~np.isnan(self.values))
        else:
            if self.present.shape != shape:
                raise ValueError(f"present shape {self.present.shape} != {shape}")
            object.__setattr__(self, "values", np.where(self.present, self.values, np.nan))

    @classmethod
    def empty(cls, times: I64) -> StepMatrix:
        return cls(times, [], np.empty((0, len(times))))

    def __len__(self) -> int:
        return len(self.labels)

    def with_values(self, values: F64, labels: list[dict[str, str]] | None = None) -> StepMatrix:
        """The same cells present, holding new values (e.g. a function of the old ones)."""
        return StepMatrix(
            self.times, self.labels if labels is None else labels, values, self.present
        )


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
        """Every series matching all `matchers`, with its samples in [start_ms, end_ms].

        A source may also offer `select_batch` (same arguments, a `query.functions.SampleBatch`
        of the series with samples): the evaluator then reads that columnar batch instead."""
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
    return dedupe_keyed(m)[0]


def dedupe_keyed(m: StepMatrix) -> tuple[StepMatrix, list[LabelKey]]:
    """`dedupe`, and the rows' `label_key`s (for `finalize`: computed once)."""
    groups, ids, keys = agg_mod.distinct_keyed(m.labels)
    if len(groups) == len(m.labels):
        return m, keys
    count = np.zeros((len(groups), len(m.times)), np.int64)
    np.add.at(count, ids, m.present)
    clash = np.argwhere(count > 1)
    if len(clash):
        raise execution_error(
            "vector cannot contain metrics with the same labelset: "
            + fmt_labels(groups[int(clash[0][0])])
        )
    merged = np.full((len(groups), len(m.times)), np.nan)
    rows, cols = np.nonzero(m.present)  # at most one present cell per merged cell
    merged[ids[rows], cols] = m.values[rows, cols]
    return StepMatrix(m.times, groups, merged, count > 0), keys


def drop_name(m: StepMatrix) -> StepMatrix:
    """The matrix without `__name__`, rows made equal by it merged (`dedupe`)."""
    names = {lab.get("__name__") for lab in m.labels}
    if names == {None} or not names:
        return m
    labels = []
    for lab in m.labels:
        lab = dict(lab)  # a C-level copy and a pop: several times a comprehension's speed
        lab.pop("__name__", None)
        labels.append(lab)
    out = m.with_values(m.values, labels)
    # Rows have distinct label sets, so with one name among them none become equal.
    return out if len(names) == 1 else dedupe(out)


def finalize(
    m: StepMatrix, order_by_value: str | None = None, keys: Sequence[LabelKey] | None = None
) -> StepMatrix:
    """Drop series without any value; order by label set (or by value, for instant sort, NaN
    values last; or keep the rows' order, `"rows"`, for instant topk/bottomk). `keys`: the
    rows' `label_key`s, when the caller has them."""
    if m.finalized and order_by_value is None:
        return m
    keep = np.flatnonzero(m.present.any(axis=1)).tolist()
    if order_by_value is None:
        if keys is None:
            keys = [label_key(lab) for lab in m.labels]
        keep.sort(key=keys.__getitem__)
    elif order_by_value == "rows":
        pass
    else:
        sign = -1.0 if order_by_value == "desc" else 1.0
        first = m.values[:, 0] if len(m.times) else np.zeros(len(m.labels))

        def by_value(i: int) -> tuple[bool, float, LabelKey]:
            v = float(first[i])
            return (v != v, 0.0 if v != v else sign * v, label_key(m.labels[i]))

        keep.sort(key=by_value)
    rows = np.array(keep, dtype=np.int64)
    n = len(m.times)
    return StepMatrix(
        m.times,
        [m.labels[i] for i in keep],
        m.values[rows].reshape(-1, n),
        m.present[rows].reshape(-1, n),
        finalized=order_by_value is None,
    )
