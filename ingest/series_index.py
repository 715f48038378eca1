"""The series index of a shard's memstore: which series exist, and which match a query.

Kept apart from the memstore's samples (`ingest.memstore`) because it is a separate concern with
its own data: series ids are handed out here, 0, 1, 2... in creation order, and the memstore
keeps its per-series sample state in arrays and lists indexed by them. The index holds

* each series' label set (canonical: no empty values, sorted by name; names and values
  interned, one copy of each string per shard) as a tuple `(names, value, value, ...)` whose
  tuple of label names is shared by every series with the same names, and its part key
  (`encode_part_key`), with part key -> id;
* a cache of the raw label sets seen in batches, by hash -> id (checked against the series'
  labels on a hit), so a repeated series costs one lookup;
* an inverted index label -> value -> ids: compact arrays of int32 ids, ascending (ids only
  grow), which answers PromQL's label matchers with NumPy set operations.

Its size is what a series costs in memory beyond its samples (`bench/bench_series_memory.py`,
figures in docs/memstore.md). Not thread-safe: the memstore calls it under its lock.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from ingest.batch import Labels
from store.api import LabelMatcher, MatchOp, encode_part_key

__all__ = ["SeriesIndex"]

_FEW_CANDIDATES = 64  # below this, matchers filter the candidates' labels directly
I64 = npt.NDArray[np.int64]


def _ids(posting: array) -> I64:
    """A posting list as int64 ids (ascending)."""
    return np.frombuffer(posting, dtype=np.int32).astype(np.int64)


class SeriesIndex:
    """Label sets of a shard's series by id, looked up by labels, part key or matchers."""

    def __init__(self) -> None:
        self._labels: list[tuple] = []  # type: ignore[type-arg]  # per id: (names, *values)
        self._names: dict[tuple[str, ...], tuple[str, ...]] = {}  # one copy of each name set
        self._part_keys: list[str] = []  # per id
        self._by_key: dict[str, int] = {}
        self._by_raw: dict[int, int] = {}  # hash of sorted raw label items -> id
        self._strings: dict[str, str] = {}  # one copy of each label name and value
        self._postings: dict[str, dict[str, array]] = {}  # label -> value -> int32 ids
        # Deleted series: their ids stay (ids index per-series arrays), unfindable by labels,
        # part key or matchers; samples with their labels afterwards make a new series.
        self._deleted: set[int] = set()

    def __len__(self) -> int:
        return len(self._labels)

    def labels(self, series_id: int) -> Labels:
        """The series' canonical label set (a new dict)."""
        names, *values = self._labels[series_id]
        return dict(zip(names, values, strict=True))

    def labels_many(self, series_ids: Iterable[int]) -> list[Labels]:
        """`labels` of many series (new dicts): one call for a query's series."""
        rows = map(self._labels.__getitem__, series_ids)
        return [dict(zip(r[0], r[1:], strict=True)) for r in rows]

    def part_key(self, series_id: int) -> str:
        return self._part_keys[series_id]

    def id_of_part_key(self, part_key: str) -> int | None:
        return self._by_key.get(part_key)

    def add(self, labels: Labels, part_key: str) -> int:
        """Index a new series (canonical `labels`, its `part_key` not indexed yet); its id."""
        sid = len(self._labels)
        if sid >= 2**31 - 1:
            raise ValueError("a shard holds at most 2**31 - 1 series")
        intern = self._intern
        values: list[str] = []
        labels = dict(sorted(labels.items()))  # sorted names: `resolve` checks hits cheaply
        for k, v in labels.items():
            k, v = intern(k), intern(v)
            values.append(v)
            by_value = self._postings.setdefault(k, {})
            posting = by_value.get(v)
            if posting is None:
                by_value[v] = array("i", (sid,))
            else:
                posting.append(sid)
        names = tuple(labels)
        names = self._names.setdefault(names, tuple(intern(k) for k in names))
        self._labels.append((names, *values))
        self._part_keys.append(part_key)
        self._by_key[part_key] = sid
        return sid

    def remove(self, series_ids: Iterable[int]) -> None:
        """Hide deleted series from every lookup (their ids are never reused)."""
        gone = set(series_ids) - self._deleted
        if not gone:
            return
        self._deleted |= gone
        for sid in gone:
            names, *values = self._labels[sid]
            for k, v in zip(names, values, strict=True):
                posting = self._postings[k][v]
                kept = array("i", (i for i in posting if i != sid))
                if kept:
                    self._postings[k][v] = kept
                else:
                    del self._postings[k][v]
            if self._by_key.get(self._part_keys[sid]) == sid:
                del self._by_key[self._part_keys[sid]]
        self._by_raw = {h: i for h, i in self._by_raw.items() if i not in gone}

    def _same(self, sid: int, labels: Labels) -> bool:
        """Whether raw `labels` (empty values allowed) are series `sid`'s."""
        canon = {k: v for k, v in labels.items() if v != ""}
        return canon == self.labels(sid)

    def resolve(self, series: Sequence[Labels]) -> npt.NDArray[np.int64]:
        """Ids of a batch's label sets, adding new series (with the next ids, in batch order);
        -1 for label sets that cannot be a series (not str -> str).

        Label sets that differ only by empty values are one series."""
        out = np.empty(len(series), np.int64)
        cache = self._by_raw
        for i, labels in enumerate(series):
            try:
                key = tuple(sorted(labels.items()))
                h = hash(key)
            except (TypeError, AttributeError):
                out[i] = -1
                continue
            sid = cache.get(h)
            if sid is not None:
                flat = self._labels[sid]  # a hash is no proof: check the labels
                if key == tuple(zip(flat[0], flat[1:], strict=True)) or self._same(sid, labels):
                    out[i] = sid
                    continue
            try:
                part_key = encode_part_key(labels)
            except (ValueError, TypeError):
                out[i] = -1
                continue
            sid = self._by_key.get(part_key)
            if sid is None:
                sid = self.add({k: v for k, v in labels.items() if v != ""}, part_key)
            cache[h] = sid  # a colliding hash just costs the other series this slow path
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
        cands: I64 | None = None
        for m in ordered:
            if cands is not None and len(cands) <= _FEW_CANDIDATES:
                keep = [m.matches(self.labels(s)) for s in cands.tolist()]
                cands = cands[np.array(keep, dtype=bool)]
            else:
                hit = self._matching(m)
                cands = hit if cands is None else np.intersect1d(cands, hit, assume_unique=True)
            if not len(cands):
                return []
        if cands is None:
            return [i for i in range(len(self._labels)) if i not in self._deleted]
        return cands.tolist()

    def _matching(self, m: LabelMatcher) -> I64:
        """Ascending ids of the series `m` matches."""
        values = self._postings.get(m.label, {})
        if m.op is MatchOp.EQ and m.value != "":
            posting = values.get(m.value)
            return _ids(posting) if posting is not None else np.empty(0, np.int64)
        # A series has one value per label: the postings of distinct values are disjoint.
        hits = [_ids(ids) for v, ids in values.items() if m.matches({m.label: v})]
        if m.matches({}):  # a missing label counts as "": add the series without the label
            having = np.zeros(len(self._labels), bool)
            having[list(self._deleted)] = True  # not "without the label": gone
            for ids in values.values():
                having[_ids(ids)] = True
            hits.append(np.flatnonzero(~having))
        if not hits:
            return np.empty(0, np.int64)
        return np.sort(np.concatenate(hits)) if len(hits) > 1 else hits[0]
