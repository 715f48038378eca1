"""`ByteTable` finds a byte range only as an entry of exactly its bytes.

Generated texts (empty, short, long, over the row width and over 8 KiB, repeated, differing in
one byte) in buffers with random bytes around them, found after they were added, in other
buffers too; with hashes that collide on purpose (every word weighing nothing, or four hashes in
all): every hit is the entry of the same bytes, and every text added is found. The compiled
kernels' hashes and words are those of the NumPy formulation they replaced (`_reference`).
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
        monkeypatch.setattr(byte_table, "_HASH_MASK", np.uint64(3))
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


def _reference(
    buf: np.ndarray, start: np.ndarray, length: np.ndarray
) -> tuple[list[int], list[list[int]]]:
    """The hashes and words of the NumPy formulation the kernels replaced: each text's words
    aligned on its end (the bytes before it in the first word zeroed), each times the constant
    of its place from the end, summed modulo 2**64, then the length mixed in."""
    hashes, words = [], []
    pad, mix = byte_table.PAD, byte_table._MIX
    at_byte = np.ndarray((len(buf) - 7,), np.dtype("<u8"), buf, strides=(1,))
    for a, n in zip(start.tolist(), length.tolist(), strict=True):
        size = max(n, 1)
        n_words = (size + 7) >> 3
        end = a + size + pad
        w = at_byte[end - 8 * np.arange(n_words, 0, -1)].copy()  # first word first
        w[0] &= np.uint64(((1 << 64) - 1) ^ ((1 << (8 * (8 * n_words - size))) - 1))
        place = np.minimum(np.arange(n_words - 1, -1, -1), len(mix) - 1)
        with np.errstate(over="ignore"):  # (modulo 2**64)
            h = np.add.reduce(w * mix[place], dtype=np.uint64)
            h ^= np.uint64(size) * byte_table._LEN_MIX
            h ^= h >> np.uint64(31)
            h *= byte_table._FINAL_MIX
            h ^= h >> np.uint64(29)
        hashes.append(int(h))
        words.append(w.tolist())
    return hashes, words


@settings(max_examples=200)
@given(
    st.lists(st.one_of(st.binary(max_size=600), _texts), min_size=1, max_size=20),
    st.binary(max_size=9),
)
def test_kernel_hashes_and_words_are_the_reference(texts: list[bytes], gap: bytes) -> None:
    """The kernels' hashes and words (empty texts, over a row, over 8 KiB) are the reference's;
    the words are each text zero padded in front to whole words."""
    raw, starts, lengths = _layout(texts, [gap] * len(texts))
    buf = padded(raw)
    got = hash_texts(buf, raw, starts, lengths)
    hashes, words = _reference(buf, starts, lengths)
    assert got.hashes.tolist() == hashes
    every = np.arange(len(texts))
    assert got.words_of(every).tolist() == [w for ws in words for w in ws]
    table = ByteTable([np.int64])
    found = table.find(buf, raw, starts, lengths)
    assert found.texts.hashes.tolist() == hashes
    at = 0
    flat = got.words_of(every)
    for text in texts:
        n = -(-max(len(text), 1) // 8)
        if text:  # (an empty text's word is the byte after it)
            assert flat[at : at + n].tobytes() == bytes(8 * n - len(text)) + text
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
