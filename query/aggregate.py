"""Aggregation: mergeable per-group partial states; topk/bottomk, quantile and count_values.

sum, min, max, count, avg, group, stddev and stdvar are computed as a `Partial` (per group and
step: a running value, the number of contributing series and, for stddev/stdvar, the sum of
squared deviations), so nodes can aggregate their own series and the caller merges the
partials, matching groups by label set; only step results cross the network. topk/bottomk,
quantile and count_values need every series of a group at once and run at the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
LabelKey = tuple[tuple[str, str], ...]

PUSHABLE_OPS = frozenset({"sum", "min", "max", "count", "avg", "group", "stddev", "stdvar"})
_SPREAD_OPS = frozenset({"stddev", "stdvar"})


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
    groups, ids, _ = distinct_keyed(label_sets)
    return groups, ids


def distinct_keyed(
    label_sets: Sequence[Mapping[str, str]],
) -> tuple[list[dict[str, str]], I64, list[LabelKey]]:
    """`distinct`, and the groups' `label_key`s, so a caller that orders the groups next need
    not compute them again (a label set's key is most of the cost here)."""
    index: dict[LabelKey, int] = {}
    groups: list[dict[str, str]] = []
    keys: list[LabelKey] = []
    ids: list[int] = []
    for lab in label_sets:
        key = tuple(sorted(lab.items()))
        i = index.get(key)
        if i is None:
            i = index[key] = len(groups)
            groups.append(dict(lab))
            keys.append(key)
        ids.append(i)
    return groups, np.array(ids, np.int64), keys


def group_ids(
    labels: Sequence[Mapping[str, str]], grouping: Sequence[str], without: bool
) -> tuple[list[dict[str, str]], I64]:
    """Distinct group label sets and, per input row, the index of its group."""
    if without:
        return distinct([group_labels(lab, grouping, without) for lab in labels])
    # `by`: a row's group is the tuple of the named labels' values (None where absent), and a
    # dict is made only per group, not per row.
    names = tuple(dict.fromkeys(grouping))
    index: dict[tuple[str | None, ...], int] = {}
    groups: list[dict[str, str]] = []
    ids: list[int] = []
    for lab in labels:
        key = tuple(map(lab.get, names))
        i = index.get(key)
        if i is None:
            i = index[key] = len(groups)
            groups.append({k: v for k, v in zip(names, key, strict=True) if v is not None})
        ids.append(i)
    return groups, np.array(ids, np.int64)


@dataclass(frozen=True, eq=False)
class Partial:
    """Mergeable state of one pushable aggregation, per output group and step.

    `values` holds per-group sums (sum, avg, stddev, stdvar; 0 where nothing contributed),
    minima or maxima (min, max; NaN where nothing contributed) or zeros (count, group);
    `counts` the number of input series with a value at that step; `m2` (stddev, stdvar only)
    the sum of squared deviations from the group's mean, merged with Chan et al.'s formula.
    """

    op: str
    times: I64
    labels: list[dict[str, str]]
    values: F64
    counts: I64
    m2: F64 | None = None
    # The groups' `label_key`s where the maker had them (`merge`), for ordering the result.
    keys: list[LabelKey] | None = None

    def __post_init__(self) -> None:
        if self.op not in PUSHABLE_OPS:
            raise ValueError(f"no partial state for aggregation {self.op!r}")
        shape = (len(self.labels), len(self.times))
        if self.values.shape != shape or self.counts.shape != shape:
            raise ValueError(f"partial arrays must have shape {shape}")
        if (self.m2 is not None) != (self.op in _SPREAD_OPS) or (
            self.m2 is not None and self.m2.shape != shape
        ):
            raise ValueError(f"{self.op} partials need m2 of shape {shape} exactly when spread")

    def rows(self, keep: I64) -> Partial:
        """The partial restricted to some of its groups."""
        m2 = None if self.m2 is None else self.m2[keep]
        labels = [self.labels[i] for i in keep]
        keys = None if self.keys is None else [self.keys[i] for i in keep]
        return Partial(self.op, self.times, labels, self.values[keep], self.counts[keep], m2, keys)


def _combine(
    op: str,
    ids: I64,
    n_groups: int,
    n_steps: int,
    values: F64,
    counts: I64,
    m2: F64 | None = None,
) -> tuple[F64, I64, F64 | None]:
    """Fold rows (values already in partial form) into their groups."""
    out_counts = np.zeros((n_groups, n_steps), np.int64)
    np.add.at(out_counts, ids, counts)
    if op in ("min", "max"):
        out = np.full((n_groups, n_steps), np.nan)
        (np.fmin if op == "min" else np.fmax).at(out, ids, values)  # fmin/fmax skip NaN
    else:
        out = np.zeros((n_groups, n_steps))
        np.add.at(out, ids, values)
    if m2 is None:
        return out, out_counts, None
    # Chan et al.: M2 = sum of the rows' M2 + n_row * (mean_row - mean_group)^2.
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        mean = out / out_counts
        row_mean = values / counts
        spread = np.where(counts > 0, m2 + counts * (row_mean - mean[ids]) ** 2, 0.0)
    out_m2 = np.zeros((n_groups, n_steps))
    np.add.at(out_m2, ids, spread)
    return out, out_counts, out_m2


def partial_of(
    op: str,
    times: I64,
    labels: Sequence[Mapping[str, str]],
    values: F64,
    present: npt.NDArray[np.bool_],
    grouping: Sequence[str],
    without: bool,
) -> Partial:
    """The partial state of aggregating the rows of an instant-vector matrix (`present`: where
    a row has a value, which may be NaN: a NaN value makes sum and avg NaN, and min/max NaN
    only if every value is NaN, as in Prometheus)."""
    groups, ids = group_ids(labels, grouping, without)
    if op in ("min", "max"):
        row_values = np.where(present, values, np.nan)
    elif op in ("count", "group"):
        row_values = np.zeros_like(values)
    else:
        row_values = np.where(present, values, 0.0)
    m2 = np.zeros_like(values) if op in _SPREAD_OPS else None
    out, counts, out_m2 = _combine(
        op, ids, len(groups), len(times), row_values, present.astype(np.int64), m2
    )
    return Partial(op, times, groups, out, counts, out_m2)


def merge(parts: Sequence[Partial]) -> Partial:
    """Combine partials of the same aggregation, matching groups by label set."""
    if not parts:
        raise ValueError("merge needs at least one partial")
    first = parts[0]
    for p in parts[1:]:
        if p.op != first.op or not np.array_equal(p.times, first.times):
            raise ValueError("can only merge partials of the same aggregation and steps")
    labels = [lab for p in parts for lab in p.labels]
    groups, ids, keys = distinct_keyed(labels)
    values = np.concatenate([p.values for p in parts])
    counts = np.concatenate([p.counts for p in parts])
    m2 = None
    if first.op in _SPREAD_OPS:
        m2 = np.concatenate([p.m2 for p in parts if p.m2 is not None])
    out, out_counts, out_m2 = _combine(
        first.op, ids, len(groups), len(first.times), values, counts, m2
    )
    return Partial(first.op, first.times, groups, out, out_counts, out_m2, keys)


def finish_values(p: Partial) -> F64:
    """The aggregate's value per group and step (NaN where no series contributed)."""
    has = p.counts > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        match p.op:
            case "count":
                return np.where(has, p.counts.astype(np.float64), np.nan)
            case "group":
                return np.where(has, 1.0, np.nan)
            case "avg":
                return np.where(has, p.values / np.maximum(p.counts, 1), np.nan)
            case "stdvar" | "stddev":
                assert p.m2 is not None
                var = p.m2 / np.maximum(p.counts, 1)
                return np.where(has, np.sqrt(var) if p.op == "stddev" else var, np.nan)
            case _:
                return np.where(has, p.values, np.nan)


def select_k(
    labels: Sequence[Mapping[str, str]],
    values: F64,
    present: npt.NDArray[np.bool_],
    k: I64,
    grouping: Sequence[str],
    without: bool,
    bottom: bool,
) -> npt.NDArray[np.bool_]:
    """topk/bottomk: per group and step, which cells are among the k largest (smallest) values
    (NaN values rank after every number, as in Prometheus). `k` is per step; k < 1 keeps
    nothing.

    Where equal values straddle the cut (some of them kept, some not), which ones Prometheus
    keeps follows from its heap: those steps are decided by `_heap_select`, which replays
    Prometheus' algorithm over the group's series in label order (the order a selector's series
    reach the aggregation there).
    """
    keep = np.zeros(values.shape, bool)
    if len(labels) == 0:
        return keep
    _, ids = group_ids(labels, grouping, without)
    by_labels = sorted(range(len(labels)), key=lambda i: label_key(labels[i]))
    order_rows = np.array(by_labels, dtype=np.int64)
    for g in np.unique(ids):
        rows = order_rows[ids[order_rows] == g]  # in label order, for stable tie-breaking
        sub, has = values[rows], present[rows]
        nan = np.isnan(sub)
        rank_key = np.where(nan, np.inf, sub if bottom else -sub)
        category = np.where(has, nan.astype(np.int64), 2)  # numbers, then NaN, then nothing
        index = np.broadcast_to(np.arange(len(rows))[:, None], sub.shape)
        order = np.lexsort((index, rank_key, category), axis=0)
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(len(rows))[:, None], axis=0)
        group_keep = (rank < k[None, :]) & has
        # Steps where the last kept value equals the first dropped one (NaN equal to NaN).
        n_present = has.sum(axis=0)
        cut = (k >= 1) & (k < n_present)
        if cut.any():
            at = np.clip(k, 1, max(1, len(rows) - 1))[None, :]
            last = np.take_along_axis(sub, np.take_along_axis(order, at - 1, axis=0), 0)[0]
            first_out = np.take_along_axis(sub, np.take_along_axis(order, at, axis=0), 0)[0]
            tie = cut & ((last == first_out) | (np.isnan(last) & np.isnan(first_out)))
            for step in np.flatnonzero(tie).tolist():
                live = np.flatnonzero(has[:, step])
                kept = _heap_select(sub[live, step].tolist(), int(k[step]), bottom)
                group_keep[:, step] = False
                group_keep[live[kept], step] = True
        keep[rows] = group_keep
    return keep


def instant_k_order(
    labels: Sequence[Mapping[str, str]],
    values: F64,
    present: npt.NDArray[np.bool_],
    k: int,
    grouping: Sequence[str],
    without: bool,
    bottom: bool,
) -> list[int]:
    """The rows an instant topk/bottomk keeps (`values`, `present`: its input at the one step),
    in the order Prometheus answers them: group by group, in the order the groups first
    appear among the input series (in label order), each group's sorted by value (topk:
    descending, bottomk: ascending, NaN last). Where a group has equal values, their order (and
    which are kept) is that of Prometheus' heap sorted by Go's insertion sort (its sort for up to
    12 elements; larger heaps with ties keep the heap's order among equals)."""
    if k < 1:
        return []
    _, ids = group_ids(labels, grouping, without)
    rows = sorted(np.flatnonzero(present).tolist(), key=lambda i: label_key(labels[i]))
    groups: dict[int, list[int]] = {}  # insertion order: first appearance
    for r in rows:
        groups.setdefault(int(ids[r]), []).append(r)
    out: list[int] = []
    for members in groups.values():
        vals = values[members]
        nan = np.isnan(vals)
        if len(np.unique(vals[~nan])) == int((~nan).sum()) and nan.sum() <= 1:
            # No equal values: the order is the values'. Stable sort, NaN last.
            key = np.where(nan, np.inf, vals if bottom else -vals)
            ranked = np.lexsort((key, nan))[:k]
            out.extend(members[i] for i in ranked.tolist())
            continue
        heap = _heap_select(vals.tolist(), k, bottom)
        heap_vals = [float(vals[i]) for i in heap]
        _go_insertion_sort_reversed(heap, heap_vals, bottom)
        out.extend(members[i] for i in heap)
    return out


def _go_insertion_sort_reversed(items: list[int], vals: list[float], bottom: bool) -> None:
    """Go's sort.Sort(sort.Reverse(heap)) of a topk (bottomk) heap, in place: insertion sort
    (Go's for up to 12 elements; larger ones get the same stable order here) where element j
    moves before j-1 when j-1 is NaN or smaller (larger for bottomk)."""
    for i in range(1, len(items)):
        j = i
        while j > 0:
            left, right = vals[j - 1], vals[j]
            if not (left != left or (left > right if bottom else left < right)):
                break
            items[j - 1], items[j] = items[j], items[j - 1]
            vals[j - 1], vals[j] = vals[j], vals[j - 1]
            j -= 1


def _heap_select(values: list[float], k: int, bottom: bool) -> list[int]:
    """Which of `values` (one group's at one step, in input order) Prometheus' topk (bottomk)
    keeps: a heap of at most k samples whose root is the smallest (largest) kept, NaN counting
    as smaller than anything (larger for bottomk); a sample replaces the root when strictly
    better, or a number replaces a NaN root. Go's container/heap push and fix, replayed."""
    heap: list[tuple[float, int]] = []

    def less(a: int, b: int) -> bool:  # vectorByValueHeap / vectorByReverseValueHeap
        va, vb = heap[a][0], heap[b][0]
        if va != va:
            return True
        return va > vb if bottom else va < vb

    def up(j: int) -> None:
        while j > 0:
            parent = (j - 1) // 2
            if not less(j, parent):
                break
            heap[parent], heap[j] = heap[j], heap[parent]
            j = parent

    def down(i0: int) -> bool:
        i, n = i0, len(heap)
        while True:
            j = 2 * i + 1
            if j >= n:
                break
            if j + 1 < n and less(j + 1, j):
                j += 1
            if not less(j, i):
                break
            heap[i], heap[j] = heap[j], heap[i]
            i = j
        return i > i0

    for i, v in enumerate(values):
        if len(heap) < k:
            heap.append((v, i))
            up(len(heap) - 1)
            continue
        root = heap[0][0]
        better = root > v if bottom else root < v
        if better or (root != root and v == v):
            heap[0] = (v, i)
            if k > 1 and not down(0):
                up(0)
    return [i for _, i in heap]


def quantile(
    labels: Sequence[Mapping[str, str]],
    values: F64,
    present: npt.NDArray[np.bool_],
    q: F64,
    grouping: Sequence[str],
    without: bool,
) -> tuple[list[dict[str, str]], F64, npt.NDArray[np.bool_]]:
    """The q-quantile of each group per step (Prometheus's interpolation between the closest
    ranks; -Inf for q < 0, +Inf for q > 1, NaN for q NaN or an empty group).

    Every step's column is sorted by (group, presence, value) at once, so group g's values at a
    step are the first n[g] of its block of rows (NaN values before the numbers, as Go sorts)."""
    groups, ids = group_ids(labels, grouping, without)
    n_groups, n_steps = len(groups), values.shape[1]
    if n_groups == 0:
        return groups, np.empty((0, n_steps)), np.zeros((0, n_steps), bool)
    n = np.zeros((n_groups, n_steps))
    np.add.at(n, ids, present)
    size = np.bincount(ids, minlength=n_groups)
    block = (np.cumsum(size) - size)[:, None]
    number = ~np.isnan(values)
    gid = np.broadcast_to(ids[:, None], values.shape)
    order = np.lexsort((values, number, ~present, gid), axis=0)
    ranked = np.take_along_axis(values, order, axis=0)
    with np.errstate(invalid="ignore"):
        rank = q[None, :] * (n - 1)
        lower = np.maximum(0, np.floor(rank))
        upper = np.minimum(n - 1, lower + 1)
        weight = rank - np.floor(rank)
        ok = (n > 0) & ~np.isnan(rank) & (q[None, :] >= 0) & (q[None, :] <= 1)
        lo_at = np.take_along_axis(ranked, block + np.where(ok, lower, 0).astype(np.int64), 0)
        hi_at = np.take_along_axis(ranked, block + np.where(ok, upper, 0).astype(np.int64), 0)
        out = lo_at * (1 - weight) + hi_at * weight
    out = np.where(ok, out, np.nan)
    out = np.where((n > 0) & (q[None, :] < 0), -np.inf, out)
    out = np.where((n > 0) & (q[None, :] > 1), np.inf, out)
    return groups, out, n > 0


def format_value(v: float) -> str:
    """A float as Go's strconv.FormatFloat(v, 'f', -1, 64): shortest exact digits, no
    exponent (count_values' label values)."""
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return np.format_float_positional(v, trim="-")


def count_values(
    labels: Sequence[Mapping[str, str]],
    values: F64,
    present: npt.NDArray[np.bool_],
    label: str,
    grouping: Sequence[str],
    without: bool,
) -> tuple[list[dict[str, str]], F64]:
    """count_values: per step, the number of series of each group with each value, the value
    (formatted) set as label `label` before grouping (a `by` grouping always keeps it)."""
    n_steps = values.shape[1]
    rows, steps = np.nonzero(present)
    if len(rows) == 0:
        return [], np.empty((0, n_steps))
    by = [*grouping, label] if not without else list(grouping)
    base = [{k: v for k, v in lab.items() if k != label} for lab in labels]
    base_groups, base_ids = group_ids(base, by, without)
    keeps_label = label in by if not without else label not in {*grouping, "__name__"}
    # Distinct values by bit pattern: -0 and 0 are different label values.
    bits = values[rows, steps].view(np.int64)
    uniq, value_ids = np.unique(bits, return_inverse=True)
    texts = [format_value(float(b)) for b in uniq.view(np.float64)]
    pair = base_ids[rows] * len(uniq) + value_ids
    pairs, pair_ids = np.unique(pair, return_inverse=True)
    out_labels = []
    for p in pairs.tolist():
        g = dict(base_groups[p // len(uniq)])
        if keeps_label:
            g[label] = texts[p % len(uniq)]
        out_labels.append(g)
    groups, ids = distinct(out_labels)
    out = np.zeros((len(groups), n_steps))
    np.add.at(out, (ids[pair_ids], steps), 1.0)
    return groups, np.where(out > 0, out, np.nan)
