"""`ByteTable` finds a byte range only as an entry of exactly its bytes.

Generated texts (empty, short, long, over the row width and over 8 KiB, repeated, differing in
one byte) in buffers with random bytes around them, found after they were added, in other
buffers too; with hashes that collide on purpose (every word weighing nothing, or four hashes in
all): every hit is the entry of the same bytes, and every text added is found.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest import byte_table
from ingest.byte_table import ByteTable, hash_texts, padded

_short = st.binary(min_size=0, max_size=40)
_texts = st.one_of(
    _short,
    _short.map(lambda b: b * 20),  # up to 800 bytes: rows and the gathered words
    st.sampled_from([b"a" * 9000, b"a" * 8999 + b"b", b"\x0a\x03abc", b"\x0a\x03abd"]),
)


def _layout(texts: list[bytes], gaps: list[bytes]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """`texts` in one buffer, each after its gap; their starts and lengths."""
    parts, starts, at = [], [], 0
    for text, gap in zip(texts, gaps, strict=True):
        parts += [gap, text]
        at += len(gap)
        starts.append(at)
        at += len(text)
    lengths = np.array([len(t) for t in texts], np.int64)
    return b"".join(parts), np.array(starts, np.int64), lengths


@pytest.fixture(params=["hashed", "zero_mix", "four_hashes"])
def collisions(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Hashes as they are, or colliding: every text of a length alike, or four hashes in all."""
    if request.param == "zero_mix":
        monkeypatch.setattr(byte_table, "_MIX", np.zeros_like(byte_table._MIX))
    elif request.param == "four_hashes":
        original = byte_table.hash_texts

        def few(*args: object, **kw: object) -> byte_table.Texts:
            texts = original(*args, **kw)  # type: ignore[arg-type]
            return texts._replace(hashes=texts.hashes & np.uint64(3))

        monkeypatch.setattr(byte_table, "hash_texts", few)
    yield request.param


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(_texts, min_size=1, max_size=30),
    st.lists(_texts, min_size=1, max_size=30),
    st.data(),
)
def test_found_entries_are_the_same_bytes(
    collisions: str, first: list[bytes], second: list[bytes], data: st.DataObject
) -> None:
    table = ByteTable([object, np.int64])
    entry_of: dict[bytes, int] = {}
    for texts in (first, second, first + second):
        gaps = [data.draw(st.binary(max_size=12)) for _ in texts]
        raw, starts, lengths = _layout(texts, gaps)
        found = table.find(padded(raw), raw, starts, lengths)
        column = found.view.columns[0]
        for text, i in zip(texts, found.ids.tolist(), strict=True):
            if i >= 0:
                assert column[i] == text  # never another text's entry
                assert entry_of[text] == i or column[entry_of[text]] == text
            else:
                assert text not in entry_of  # every text added is found
        new = {t: k for k, (t, i) in enumerate(zip(texts, found.ids.tolist(), strict=True))}
        which = [k for t, k in new.items() if t not in entry_of]
        ids = table.add(found, np.array(which, np.intp), [[texts[k] for k in which], which])
        entry_of.update({texts[k]: i for k, i in zip(which, ids.tolist(), strict=True)})
    assert len(table) == len(entry_of)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(min_size=1, max_size=600), min_size=1, max_size=20), st.binary(max_size=9)
)
def test_rows_and_gathered_words_agree(texts: list[bytes], gap: bytes) -> None:
    """Short texts are copied as rows of a window, long ones gathered word by word: the same
    words (each text aligned on its end, zero padded in front) and the same hashes."""
    raw, starts, lengths = _layout(texts, [gap] * len(texts))
    buf = padded(raw)
    rows = hash_texts(buf, raw, starts, lengths)
    gathered = hash_texts(buf, raw, starts, lengths, row_words=0)
    assert rows.hashes.tolist() == gathered.hashes.tolist()
    every = np.arange(len(texts))
    words = rows.words_of(every)
    assert words.tolist() == gathered.words_of(every).tolist()
    at = 0
    for text in texts:
        n = -(-len(text) // 8)
        assert words[at : at + n].tobytes() == bytes(8 * n - len(text)) + text
        at += n


def test_a_table_grows_and_finds_every_text() -> None:
    """Thousands of texts added a batch at a time (slots rebuilt as it grows)."""
    table = ByteTable([np.int64])
    texts = [f"series-{i}-{'x' * (i % 50)}".encode() for i in range(5000)]
    for lo in range(0, 5000, 700):
        batch = texts[lo : lo + 700]
        raw, starts, lengths = _layout(batch, [b"\x12"] * len(batch))
        found = table.find(padded(raw), raw, starts, lengths)
        assert (found.ids < 0).all()
        table.add(found, np.arange(len(batch)), [range(lo, lo + len(batch))])
    raw, starts, lengths = _layout(texts, [b"\x00\xff"] * len(texts))
    found = table.find(padded(raw), raw, starts, lengths)
    assert found.view.columns[0][found.ids].tolist() == list(range(5000))
