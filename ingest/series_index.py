"""The series index of a shard's memstore: which series exist, and which match a query.

Kept apart from the memstore's samples (`ingest.memstore`) because it is a separate concern with
its own data: series ids are handed out here, 0, 1, 2... in creation order, and the memstore
keeps its per-series sample state in arrays and lists indexed by them. The index holds

* each series' label set (canonical: no empty values; names and values interned, one copy of
  each string per shard) and its part key (`encode_part_key`), with part key -> id;
* a cache of the raw label sets seen in batches -> id, so a repeated series costs one lookup;
* an inverted index label -> value -> ids, which answers PromQL's label matchers.

Not thread-safe: the memstore calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from filopy.store.api import LabelMatcher, MatchOp, encode_part_key
from ingest.batch import Labels

__all__ = ["SeriesIndex"]

_FEW_CANDIDATES = 64  # below this, matchers filter the candidates' labels directly


class SeriesIndex:
    """Label sets of a shard's series by id, looked up by labels, part key or matchers."""

    def __init__(self) -> None:
        self._labels: list[Labels] = []  # per id
        self._part_keys: list[str] = []  # per id
        self._by_key: dict[str, int] = {}
        self._by_raw: dict[tuple[tuple[str, str], ...], int] = {}  # raw labels -> id
        self._strings: dict[str, str] = {}  # one copy of each label name and value
        self._postings: dict[str, dict[str, set[int]]] = {}

    def __len__(self) -> int:
        return len(self._labels)

    def labels(self, series_id: int) -> Labels:
        """The series' canonical label set (the index's own dict: do not modify)."""
        return self._labels[series_id]

    def part_key(self, series_id: int) -> str:
        return self._part_keys[series_id]

    def id_of_part_key(self, part_key: str) -> int | None:
        return self._by_key.get(part_key)

    def add(self, labels: Labels, part_key: str) -> int:
        """Index a new series (canonical `labels`, its `part_key` not indexed yet); its id."""
        sid = len(self._labels)
        intern = self._intern
        labels = {intern(k): intern(v) for k, v in labels.items()}
        self._labels.append(labels)
        self._part_keys.append(part_key)
        self._by_key[part_key] = sid
        for k, v in labels.items():
            self._postings.setdefault(k, {}).setdefault(v, set()).add(sid)
        return sid

    def resolve(self, series: Sequence[Labels]) -> npt.NDArray[np.int64]:
        """Ids of a batch's label sets, adding new series (with the next ids, in batch order);
        -1 for label sets that cannot be a series (not str -> str).

        Label sets that differ only by empty values are one series."""
        out = np.empty(len(series), np.int64)
        cache = self._by_raw
        for i, labels in enumerate(series):
            try:
                key = tuple(sorted(labels.items()))
                sid = cache.get(key)
            except (TypeError, AttributeError):
                out[i] = -1
                continue
            if sid is None:
                try:
                    part_key = encode_part_key(labels)
                except (ValueError, TypeError):
                    out[i] = -1
                    continue
                sid = self._by_key.get(part_key)
                if sid is None:
                    sid = self.add({k: v for k, v in labels.items() if v != ""}, part_key)
                intern = self._intern
                cache[tuple((intern(k), intern(v)) for k, v in key)] = sid
            out[i] = sid
        return out

    def _intern(self, text: str) -> str:
        return self._strings.setdefault(text, text)

    def find(self, matchers: Sequence[LabelMatcher]) -> list[int]:
        """Ids of the series satisfying every matcher (Prometheus semantics), ascending.

        Each matcher is answered from the inverted index, testing each distinct *value* of its
        label once rather than each series; `=` matchers (most selective) go first, and once the
        candidates are few, the remaining matchers filter them directly."""
        ordered = sorted(matchers, key=lambda m: (m.op is not MatchOp.EQ, m.value == ""))
        cands: set[int] | None = None
        for m in ordered:
            if cands is not None and len(cands) <= _FEW_CANDIDATES:
                labels = self._labels
                cands = {s for s in cands if m.matches(labels[s])}
            else:
                hit = self._matching(m)
                cands = hit if cands is None else cands & hit
            if not cands:
                return []
        if cands is None:
            return list(range(len(self._labels)))
        return sorted(cands)

    def _matching(self, m: LabelMatcher) -> set[int]:
        values = self._postings.get(m.label, {})
        if m.op is MatchOp.EQ and m.value != "":
            return set(values.get(m.value, ()))
        hit: set[int] = set()
        for v, ids in values.items():
            if m.matches({m.label: v}):
                hit |= ids
        if m.matches({}):  # a missing label counts as "": add the series without the label
            having: set[int] = set().union(*values.values()) if values else set()
            hit |= set(range(len(self._labels))) - having
        return hit
