"""Aggregation: mergeable per-group partial states, and topk/bottomk.

sum, min, max, count and avg are computed as a `Partial` (per group and step: a running value
and the number of contributing series), so nodes can aggregate their own series and the caller
merges the partials, matching groups by label set; only step results cross the network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
LabelKey = tuple[tuple[str, str], ...]

PUSHABLE_OPS = frozenset({"sum", "min", "max", "count", "avg"})


def label_key(labels: Mapping[str, str]) -> LabelKey:
    """A hashable identity of a label set that also orders label sets like Prometheus does."""
    return tuple(sorted(labels.items()))


def group_labels(
    labels: Mapping[str, str], grouping: Sequence[str], without: bool
) -> dict[str, str]:
    """The output labels of a series' group: `by` keeps the named labels, `without` drops them
    and the metric name."""
    if without:
        drop = {*grouping, "__name__"}
        return {k: v for k, v in labels.items() if k not in drop}
    return {k: labels[k] for k in grouping if k in labels}


def distinct(label_sets: Sequence[Mapping[str, str]]) -> tuple[list[dict[str, str]], I64]:
    """The distinct label sets (in first-seen order) and, per input, the index of its set."""
    index: dict[LabelKey, int] = {}
    groups: list[dict[str, str]] = []
    ids = np.empty(len(label_sets), np.int64)
    for i, lab in enumerate(label_sets):
        ids[i] = index.setdefault(label_key(lab), len(groups))
        if ids[i] == len(groups):
            groups.append(dict(lab))
    return groups, ids


def group_ids(
    labels: Sequence[Mapping[str, str]], grouping: Sequence[str], without: bool
) -> tuple[list[dict[str, str]], I64]:
    """Distinct group label sets and, per input row, the index of its group."""
    return distinct([group_labels(lab, grouping, without) for lab in labels])


@dataclass(frozen=True, eq=False)
class Partial:
    """Mergeable state of one sum/min/max/count/avg aggregation, per output group and step.

    `values` holds per-group sums (sum, avg; 0 where nothing contributed), minima or maxima
    (min, max; NaN where nothing contributed) or zeros (count); `counts` the number of input
    series with a value at that step.
    """

    op: str
    times: I64
    labels: list[dict[str, str]]
    values: F64
    counts: I64

    def __post_init__(self) -> None:
        if self.op not in PUSHABLE_OPS:
            raise ValueError(f"no partial state for aggregation {self.op!r}")
        shape = (len(self.labels), len(self.times))
        if self.values.shape != shape or self.counts.shape != shape:
            raise ValueError(f"partial arrays must have shape {shape}")


def _combine(
    op: str, ids: I64, n_groups: int, n_steps: int, values: F64, counts: I64
) -> tuple[F64, I64]:
    """Fold rows (values already in partial form) into their groups."""
    out_counts = np.zeros((n_groups, n_steps), np.int64)
    np.add.at(out_counts, ids, counts)
    if op in ("min", "max"):
        out = np.full((n_groups, n_steps), np.nan)
        (np.fmin if op == "min" else np.fmax).at(out, ids, values)  # fmin/fmax skip NaN
    else:
        out = np.zeros((n_groups, n_steps))
        np.add.at(out, ids, values)
    return out, out_counts


def partial_of(
    op: str,
    times: I64,
    labels: Sequence[Mapping[str, str]],
    values: F64,
    grouping: Sequence[str],
    without: bool,
) -> Partial:
    """The partial state of aggregating the rows of an instant-vector matrix."""
    groups, ids = group_ids(labels, grouping, without)
    present = ~np.isnan(values)
    if op in ("min", "max"):
        row_values = values
    elif op == "count":
        row_values = np.zeros_like(values)
    else:
        row_values = np.where(present, values, 0.0)
    out, counts = _combine(op, ids, len(groups), len(times), row_values, present.astype(np.int64))
    return Partial(op, times, groups, out, counts)


def merge(parts: Sequence[Partial]) -> Partial:
    """Combine partials of the same aggregation, matching groups by label set."""
    if not parts:
        raise ValueError("merge needs at least one partial")
    first = parts[0]
    for p in parts[1:]:
        if p.op != first.op or not np.array_equal(p.times, first.times):
            raise ValueError("can only merge partials of the same aggregation and steps")
    labels = [lab for p in parts for lab in p.labels]
    groups, ids = distinct(labels)
    values = np.concatenate([p.values for p in parts])
    counts = np.concatenate([p.counts for p in parts])
    out, out_counts = _combine(first.op, ids, len(groups), len(first.times), values, counts)
    return Partial(first.op, first.times, groups, out, out_counts)


def finish_values(p: Partial) -> F64:
    """The aggregate's value per group and step (NaN where no series contributed)."""
    has = p.counts > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        match p.op:
            case "count":
                return np.where(has, p.counts.astype(np.float64), np.nan)
            case "avg":
                return np.where(has, p.values / np.maximum(p.counts, 1), np.nan)
            case _:
                return np.where(has, p.values, np.nan)


def select_k(
    labels: Sequence[Mapping[str, str]],
    values: F64,
    k: I64,
    grouping: Sequence[str],
    without: bool,
    bottom: bool,
) -> F64:
    """topk/bottomk: per group and step keep the k largest (smallest) values, NaN elsewhere.

    Ties are broken by label set, so results are deterministic (Prometheus leaves them to its
    heap order). `k` is per step; k < 1 keeps nothing.
    """
    out = np.full_like(values, np.nan)
    if len(labels) == 0:
        return out
    _, ids = group_ids(labels, grouping, without)
    by_labels = sorted(range(len(labels)), key=lambda i: label_key(labels[i]))
    order_rows = np.array(by_labels, dtype=np.int64)
    for g in np.unique(ids):
        rows = order_rows[ids[order_rows] == g]  # in label order, for stable tie-breaking
        sub = values[rows]
        rank_key = np.where(np.isnan(sub), np.inf, sub if bottom else -sub)
        order = np.argsort(rank_key, axis=0, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(len(rows))[:, None], axis=0)
        keep = (rank < k[None, :]) & ~np.isnan(sub)
        out[rows] = np.where(keep, sub, np.nan)
    return out
