"""The series index against brute force: ids by labels (empty values ignored, hash hits always
checked), and matchers answered from the compact postings exactly as by testing every series."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.series_index import SeriesIndex
from store.api import LabelMatcher, encode_part_key

NAMES = ["a", "b", "c"]
VALUES = ["", "x", "y", "xy"]
label_sets = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES), min_size=1)
matchers = st.builds(
    LabelMatcher,
    st.sampled_from([*NAMES, "d"]),
    st.sampled_from(["=", "!=", "=~", "!~"]),
    st.sampled_from(["", "x", "y", "x.*", ".*", "y|xy"]),
)


def canonical(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if v != ""}


@settings(max_examples=150)
@given(st.lists(label_sets, max_size=30), st.lists(matchers, min_size=1, max_size=3))
def test_ids_and_matches_are_brute_forces(sets: list[dict[str, str]], ms: list) -> None:
    sets = [s for s in sets if canonical(s)]
    index = SeriesIndex()
    ids = index.resolve(sets).tolist()
    again = index.resolve([dict(reversed(list(s.items()))) for s in sets]).tolist()
    assert ids == again  # the same label sets, in any order, find the same series
    first: dict[tuple, int] = {}
    for s, sid in zip(sets, ids, strict=True):
        key = tuple(sorted(canonical(s).items()))
        assert first.setdefault(key, sid) == sid  # empty values make no other series
        assert index.labels(sid) == canonical(s)
    assert sorted(set(ids)) == list(range(len(first)))
    want = [sid for sid in range(len(index)) if all(m.matches(index.labels(sid)) for m in ms)]
    assert index.find(ms) == want


def test_a_hash_hit_is_checked_against_the_labels() -> None:
    """Two label sets whose hashes collide are still two series (the cache is by hash)."""
    index = SeriesIndex()
    (a,) = index.resolve([{"a": "x"}]).tolist()
    other = {"a": "y"}
    index._by_raw[hash(tuple(sorted(other.items())))] = a  # a collision, made by hand
    (b,) = index.resolve([other]).tolist()
    assert b != a and index.labels(b) == other
    assert index.part_key(b) == encode_part_key(other)
    assert index.resolve([{"a": "x"}, other]).tolist() == [a, b]
