"""histogram_quantile over classic histograms: one series per bucket, upper bound in `le`.

Prometheus's BucketQuantile, vectorised over histograms and steps: series are grouped by their
labels without `le`; each histogram's buckets are laid out in upper-bound order in a padded
(histogram, bucket, step) array, NaN where a bucket has no value at a step; and the algorithm
walks the bucket axis (a loop per bucket position, never per series or step): buckets sharing
an upper bound are added up, counts are made monotonic (differences below a relative 1e-12 are
treated as float noise and flattened, decreases are flattened), and the rank is interpolated
linearly inside the bucket that reaches it, from 0 for the first bucket if its bound is
positive. A histogram with no +Inf bucket, fewer than two buckets or no observations at a step
gives NaN there (a value, as in Prometheus); q < 0 gives -Inf, q > 1 gives +Inf. A histogram
has a result at every step where any of its buckets has a value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from query.aggregate import distinct

F64 = npt.NDArray[np.float64]

__all__ = ["histogram_quantile", "parse_bound"]

# Prometheus's smallDeltaTolerance: relative differences between consecutive bucket counts below
# this are floating point noise.
_SMALL_DELTA = 1e-12
_MIN_NORMAL = 2.2250738585072014e-308


def parse_bound(text: str) -> float | None:
    """An `le` value as Go's strconv.ParseFloat reads it (None if it does not): decimal or
    hexadecimal (with a `p` exponent) floats, `Inf`/`Infinity`/`NaN` in any case; no spaces
    and no underscores (Python's float() accepts both)."""
    if not text or text != text.strip() or "_" in text:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    body = text.lstrip("+-").lower()
    if body.startswith("0x") and "p" in body:
        try:
            return float.fromhex(text)
        except ValueError:
            return None
    return None


def _almost_equal(a: F64, b: F64) -> npt.NDArray[np.bool_]:
    """Prometheus's almost.Equal(a, b, 1e-12), elementwise (neither is NaN here)."""
    with np.errstate(invalid="ignore", over="ignore"):
        abs_sum = np.abs(a) + np.abs(b)
        diff = np.abs(a - b)
        tiny = (a == 0) | (b == 0) | (abs_sum < _MIN_NORMAL)
        rel = diff / np.minimum(abs_sum, np.finfo(np.float64).max) < _SMALL_DELTA
        return (a == b) | np.where(tiny, diff < _SMALL_DELTA * _MIN_NORMAL, rel)


def histogram_quantile(
    labels: Sequence[Mapping[str, str]], values: F64, present: npt.NDArray[np.bool_], q: F64
) -> tuple[list[dict[str, str]], F64, npt.NDArray[np.bool_]]:
    """The q-quantile (q per step) of each histogram: output labels (without `le` and the
    metric name; the caller merges or rejects sets made equal), values per step and where
    there is one."""
    n_steps = values.shape[1]
    bounds = [parse_bound(lab.get("le", "")) for lab in labels]
    rows = [i for i, b in enumerate(bounds) if b is not None]  # others are ignored
    if not rows:
        return [], np.empty((0, n_steps)), np.zeros((0, n_steps), bool)
    keys = [{k: v for k, v in labels[i].items() if k != "le"} for i in rows]
    hists, hist_of = distinct(keys)
    # One bucket per (histogram, bound); rows sharing one are added up where present.
    ub = np.array([bounds[i] for i in rows], dtype=np.float64)
    bucket_index: dict[tuple[int, float], int] = {}
    bucket_of = np.array(
        [
            bucket_index.setdefault((int(h), float(b)), len(bucket_index))
            for h, b in zip(hist_of.tolist(), ub.tolist(), strict=True)
        ],
        dtype=np.int64,
    )
    n_buckets = len(bucket_index)
    sub = values[rows]
    has = present[rows]
    sums = np.zeros((n_buckets, n_steps))
    np.add.at(sums, bucket_of, np.where(has, sub, 0.0))
    seen = np.zeros((n_buckets, n_steps), bool)
    np.logical_or.at(seen, bucket_of, has)
    counts = np.where(seen, sums, np.nan)
    bucket_hist = np.empty(n_buckets, np.int64)
    bucket_ub = np.empty(n_buckets)
    for (h, b), i in bucket_index.items():
        bucket_hist[i], bucket_ub[i] = h, b
    # Pad into (histogram, position, step), positions in upper-bound order.
    order = np.lexsort((bucket_ub, bucket_hist))
    per_hist = np.bincount(bucket_hist, minlength=len(hists))
    first = np.cumsum(per_hist) - per_hist
    pos = np.arange(n_buckets) - first[bucket_hist[order]]
    width = int(per_hist.max())
    c = np.full((len(hists), width, n_steps), np.nan)
    c[bucket_hist[order], pos] = counts[order]
    u = np.full((len(hists), width), np.nan)
    u[bucket_hist[order], pos] = bucket_ub[order]
    hist_has = np.zeros((len(hists), n_steps), bool)
    np.logical_or.at(hist_has, bucket_hist, seen)
    out = _bucket_quantile(c, u, q)
    out_labels = [{k: v for k, v in h.items() if k != "__name__"} for h in hists]
    return out_labels, out, hist_has


def _bucket_quantile(c: F64, u: F64, q: F64) -> F64:
    """BucketQuantile for counts `c` (hist, position, step; NaN: bucket absent at that step)
    and upper bounds `u` (hist, position), positions in ascending bound order."""
    n_hist, width, n_steps = c.shape
    shape = (n_hist, n_steps)
    # Pass 1: monotonic counts, the number of buckets, the last bucket and the one before it.
    prev = np.full(shape, np.nan)
    n = np.zeros(shape, np.int64)
    last_ub = np.full(shape, np.nan)
    with np.errstate(invalid="ignore"):
        for j in range(width):
            cur = c[:, j, :]
            here = ~np.isnan(cur)
            later = here & (n > 0)
            keep_prev = later & ((cur < prev) | _almost_equal(prev, np.where(here, cur, 0.0)))
            c[:, j, :] = np.where(keep_prev, prev, cur)
            prev = np.where(here & ~keep_prev, cur, prev)
            last_ub = np.where(here, u[:, j, None], last_ub)
            n += here
    observations = prev  # the last bucket's count once made monotonic
    valid = (n >= 2) & (last_ub == math.inf) & (observations != 0)
    rank = q[None, :] * observations
    # Pass 2: the first bucket (of all but the last) whose count reaches the rank.
    result = np.full(shape, np.nan)
    found = np.zeros(shape, bool)
    ordinal = np.zeros(shape, np.int64)
    prev_ub = np.zeros(shape)
    prev_count = np.zeros(shape)
    penultimate_ub = np.full(shape, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        for j in range(width):
            cur = c[:, j, :]
            ub = np.broadcast_to(u[:, j, None], shape)
            here = ~np.isnan(cur)
            is_last = here & (ordinal == n - 1)
            penultimate_ub = np.where(is_last, prev_ub, penultimate_ub)
            hit = here & ~is_last & ~found & (cur >= rank)
            start = np.where(ordinal > 0, prev_ub, 0.0)
            below = np.where(ordinal > 0, prev_count, 0.0)
            inside = start + (ub - start) * ((rank - below) / (cur - below))
            at_bound = (ordinal == 0) & (ub <= 0)
            result = np.where(hit, np.where(at_bound, ub, inside), result)
            found |= hit
            prev_ub = np.where(here, ub, prev_ub)
            prev_count = np.where(here, cur, prev_count)
            ordinal += here
    result = np.where(found, result, penultimate_ub)
    result = np.where(valid, result, np.nan)
    # q outside [0, 1] (or NaN) decides before anything else, for any histogram present.
    any_bucket = n > 0
    qq = np.broadcast_to(q[None, :], shape)
    result = np.where(any_bucket & np.isnan(qq), np.nan, result)
    result = np.where(any_bucket & (qq < 0), -math.inf, result)
    return np.where(any_bucket & (qq > 1), math.inf, result)
