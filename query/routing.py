"""Which shards a query must visit: shard keys with spread, from a selector's label matchers.

A series lives on `ingestion_shard(shard key hash, partition key hash, spread)`, one of the
`2**spread` shards of `query_shards(shard key hash, spread)`. So when a selector pins every
non-metric shard key column and the metric name (by `=` or by an alternation of literal values,
expanded to each combination), only those shards can hold its series; otherwise every shard can.
Pure: no Ray, no I/O.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from core.dataset import Dataset
from core.hashing import check_spread, query_shards, shard_key_hash
from store.api import LabelMatcher, MatchOp

PROMETHEUS_METRIC = "__name__"
# Beyond this many shard key combinations, visiting every shard is cheaper than hashing them all.
MAX_SHARD_KEY_COMBINATIONS = 256
_REGEX_SPECIALS = re.compile(r"[.^$*+?{}\[\]\\|()]")


@dataclass(frozen=True, slots=True)
class ShardKeyRoute:
    """One fully known shard key and the shards its series are spread over."""

    shard_key: Mapping[str, str]  # the non-metric shard key columns and the metric column
    hash: int
    spread: int
    shards: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SelectorRoute:
    """The shards one selector visits, and why."""

    shard_keys: tuple[ShardKeyRoute, ...]  # empty: the shard key is not pinned, all shards
    shards: tuple[int, ...]
    reason: str

    @property
    def all_shards(self) -> bool:
        return not self.shard_keys


def literal_values(m: LabelMatcher) -> list[str] | None:
    """The values a matcher allows if it names them exactly: `=` or `=~"a|b|c"` of literals."""
    if m.op is MatchOp.EQ:
        return [m.value]
    if m.op is MatchOp.RE:
        parts = m.value.split("|")
        if not any(_REGEX_SPECIALS.search(p) for p in parts):
            return sorted(set(parts))
    return None


def _pinned(matchers: Sequence[LabelMatcher], label: str) -> list[str] | None:
    """The values `label` is pinned to by the matchers (intersected), or None if not pinned."""
    values: set[str] | None = None
    for m in matchers:
        if m.label != label:
            continue
        vals = literal_values(m)
        if vals is None:
            continue
        values = set(vals) if values is None else values & set(vals)
    return None if values is None else sorted(values)


def route_selector(
    dataset: Dataset, matchers: Sequence[LabelMatcher], spread: int | None = None
) -> SelectorRoute:
    """The shards a selector with these matchers must visit. `spread` overrides the dataset's
    (default and exact-match overrides) for this query; it must be valid for the shard count."""
    if spread is not None:
        check_spread(spread, dataset.num_shards)
    every = tuple(range(dataset.num_shards))
    metric_names = _pinned(matchers, PROMETHEUS_METRIC) or _pinned(matchers, dataset.metric_column)
    if metric_names is None:
        return SelectorRoute((), every, "the metric name is not given exactly")
    columns = dataset.non_metric_shard_columns
    choices: list[list[str]] = []
    for col in columns:
        vals = _pinned(matchers, col)
        if vals is None:
            return SelectorRoute((), every, f"shard key column {col!r} has no exact matcher")
        choices.append(vals)
    combos = len(metric_names)
    for c in choices:
        combos *= len(c)
    if combos == 0:
        return SelectorRoute((), (), "the matchers exclude every shard key")
    if combos > MAX_SHARD_KEY_COMBINATIONS:
        return SelectorRoute(
            (), every, f"{combos} shard key combinations (> {MAX_SHARD_KEY_COMBINATIONS})"
        )
    keys: list[ShardKeyRoute] = []
    for metric in metric_names:
        for values in itertools.product(*choices):
            key = dict(zip(columns, values, strict=True))
            key[dataset.metric_column] = metric
            s = dataset.spread_for(key) if spread is None else spread
            h = shard_key_hash(key, dataset)
            keys.append(ShardKeyRoute(key, h, s, tuple(query_shards(h, s, dataset.num_shards))))
    shards = tuple(sorted({s for k in keys for s in k.shards}))
    return SelectorRoute(tuple(keys), shards, f"{len(keys)} shard key(s)")


def route(
    dataset: Dataset, selectors: Iterable[Sequence[LabelMatcher]], spread: int | None = None
) -> tuple[list[SelectorRoute], tuple[int, ...]]:
    """Each selector's route and the union of their shards."""
    routes = [route_selector(dataset, m, spread) for m in selectors]
    return routes, tuple(sorted({s for r in routes for s in r.shards}))
