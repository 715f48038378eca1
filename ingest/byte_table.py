"""Byte strings found in bulk: many byte ranges of one buffer (a request's series) looked up at
once, with NumPy, among the byte strings met before, each to an entry id.

The gateway's decoders see the same series request after request, as the same bytes: line
protocol's series key texts, remote write's label sections. A dict costs a slice, a hash and a
lookup per series in Python; `ByteTable.find` does a whole request's at once: each text's
8-byte words times a constant of their place, summed (a matrix product), give its hash; an
open-addressing table of hashes (`Slots`, also the gateway's table of series keys) gives a
candidate entry; the candidate's stored words are compared with the text's, so a hash is only a
hint: a collision costs speed, never exactness. Texts the slots cannot hold (their hash taken by
another text, a probe too long, over 8 KiB, empty) are found in a dict by their bytes. Entries
carry the caller's columns (labels, keys...).

Decoders run on several threads: `find` takes no lock. Entries are only appended past a view's
count and slots only filled (or all replaced), so a reader holding an older view reads entries it
knows, and anything else it reads is checked against them.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

ROW_WORDS = 64  # texts up to 512 bytes: rows of a window (all as wide as the longest)
PAD = 8 * ROW_WORDS  # zero bytes `padded` puts in front of a buffer: a row may start before it
_MAX_WORDS = 1024  # longer texts (8 KiB) get no slot: found through the dict
_MAX_PROBES = 32  # a text whose slot is further than this from its hash's goes to the dict
_WORD = np.dtype("<u8")
_ALL = (1 << 64) - 1
# Hashes: each 8-byte word (aligned on the text's end, the first zero padded in front) times
# the constant of its place counted from the end, summed, the length mixed in.
_MIX = np.random.default_rng(0x5EED).integers(0, 1 << 63, _MAX_WORDS, dtype=np.uint64)
_MIX = _MIX * np.uint64(2) + np.uint64(1)
_LEN_MIX, _FINAL_MIX = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)
# _HEAD_MASKS[k]: a word without its k low bytes (the padding before a text's first byte)
_HEAD_MASKS = np.array([_ALL ^ ((1 << (8 * k)) - 1) for k in range(8)], np.uint64)
_COLUMNS = np.arange(ROW_WORDS)
_row_masks: dict[int, npt.NDArray[np.uint64]] = {}  # row width -> `_masks(width)`


def padded(raw: bytes) -> npt.NDArray[np.uint8]:
    """`raw` as `find` reads it: `PAD` zero bytes in front (a window's row may start before
    the buffer) and 8 behind (an 8-byte read at any offset stays inside)."""
    return np.frombuffer(b"".join((bytes(PAD), raw, bytes(8))), np.uint8)


def _masks(cols: int) -> npt.NDArray[np.uint64]:
    """Row g: the words of a `cols`-word row to keep when its first g bytes are not the text's
    (the text right-aligned in the row)."""
    masks = _row_masks.get(cols)
    if masks is None:
        g = np.arange(8 * cols)[:, None]
        word = _COLUMNS[:cols]
        masks = np.where(word > g // 8, np.uint64(_ALL), np.uint64(0))
        head = word == g // 8
        masks[head] = _HEAD_MASKS[(g % 8)[:, 0]]
        masks = _row_masks.setdefault(cols, masks)
    return masks


class Texts(NamedTuple):
    """Byte ranges `raw[start:start+length]` as the table hashes them: texts up to
    `ROW_WORDS` words as `rows` (each right-aligned in a row as wide as the longest, the bytes
    before it masked out), longer ones as `words` (each text's, one after the other)."""

    raw: bytes
    start: npt.NDArray[np.int64]
    length: npt.NDArray[np.int64]
    n_words: npt.NDArray[np.int64]  # (one for an empty text)
    hashes: npt.NDArray[np.uint64]
    rows: npt.NDArray[np.uint64] | None
    masks: npt.NDArray[np.uint64] | None  # per row: the words kept (`_masks`)
    words: npt.NDArray[np.uint64] | None
    first: npt.NDArray[np.int64] | None  # per text: its first word in `words`

    def words_of(self, which: npt.NDArray[np.intp]) -> npt.NDArray[np.uint64]:
        """The words of texts `which`, one after the other."""
        n_words = self.n_words[which]
        if self.rows is not None:
            rows = self.rows[which]
            cols = rows.shape[1]
            return rows[_COLUMNS[:cols] >= (cols - n_words)[:, None]]
        assert self.words is not None and self.first is not None
        first = self.first[which]
        total = int(n_words.sum())
        at = np.cumsum(n_words) - n_words
        return self.words[np.repeat(first - at, n_words) + np.arange(total)]


def hash_texts(
    buf: npt.NDArray[np.uint8],
    raw: bytes,
    start: npt.NDArray[np.int64],
    length: npt.NDArray[np.int64],
    row_words: int = ROW_WORDS,
) -> Texts:
    """The texts `raw[start:start+length]` (`buf`: `padded(raw)`), their words and hashes.
    Texts up to `row_words` words long are copied as rows of a strided window (a copy per
    row, no index per word), longer ones gathered word by word: the same words and hashes.
    Empty texts are hashed as if one byte long (they are found through the dict only)."""
    real_length, length = length, np.maximum(length, 1)
    n_words = (length + 7) >> 3
    end = start + length + PAD  # in `buf`
    cols = int(n_words.max())
    rows = masks = words = first = None
    if cols <= row_words:
        w8 = 8 * cols
        window = as_strided(buf, shape=(len(buf) - w8 + 1, w8), strides=(1, 1))
        rows = window[end - w8].view(_WORD)  # row i: the w8 bytes before text i's end
        masks = _masks(cols).take(w8 - length, axis=0)
        rows &= masks
        h = np.einsum("ij,j->i", rows, _MIX[cols - 1 :: -1])  # (the place from the end)
    else:
        first = np.cumsum(n_words) - n_words
        total = int(first[-1] + n_words[-1])
        at_byte = np.ndarray((len(buf) - 7,), _WORD, buf, strides=(1,))  # unaligned
        from_end = np.repeat(first + n_words - 1, n_words) - np.arange(total)
        words = at_byte[np.repeat(end, n_words) - 8 * (from_end + 1)]
        words[first] &= _HEAD_MASKS[8 * n_words - length]
        h = np.add.reduceat(words * _MIX[np.minimum(from_end, _MAX_WORDS - 1)], first)
    h ^= length.astype(np.uint64) * _LEN_MIX
    h ^= h >> np.uint64(31)
    h *= _FINAL_MIX
    h ^= h >> np.uint64(29)
    return Texts(raw, start, real_length, n_words, h, rows, masks, words, first)


class TableView(NamedTuple):
    """A state of a `ByteTable` (see the module's docstring on threads)."""

    slots: Slots  # the entries by their texts' hashes (those with a slot)
    words: npt.NDArray[np.uint64]  # ROW_WORDS zero words, then every entry's words
    n_words: int  # words used
    word_end: npt.NDArray[np.int64]  # per entry: past its last word
    length: npt.NDArray[np.int64]  # per entry: its text's length in bytes
    columns: tuple[npt.NDArray[Any], ...]  # per entry: the caller's values
    count: int
    n_bytes: int
    overflow: dict[bytes, int]  # texts without a slot -> their entry (filled in place)


class Found(NamedTuple):
    """`find`'s answer: each text's entry in `view` (-1: not there), and the texts as hashed
    (for `add`)."""

    ids: npt.NDArray[np.int64]
    view: TableView
    texts: Texts


def _empty_view(dtypes: Sequence[npt.DTypeLike], capacity: int = 64) -> TableView:
    return TableView(
        slots=new_slots(2 * capacity),
        words=np.zeros(ROW_WORDS + capacity * 8, np.uint64),
        n_words=ROW_WORDS,
        word_end=np.full(capacity, ROW_WORDS, np.int64),
        length=np.zeros(capacity, np.int64),
        columns=tuple(np.zeros(capacity, d) for d in dtypes),
        count=0,
        n_bytes=0,
        overflow={},
    )


def _grown(a: npt.NDArray[Any], size: int) -> npt.NDArray[Any]:
    """`a` if it holds `size` items, else a copy with room for twice as many."""
    if len(a) >= size:
        return a
    out = np.zeros(max(2 * len(a), size), a.dtype)
    out[: len(a)] = a
    return out


class ByteTable:
    """Byte strings -> entry ids (0, 1, ...), and per entry the values of columns of the
    given dtypes. Unbounded: the caller clears it."""

    __slots__ = ("dtypes", "lock", "view")

    def __init__(self, dtypes: Sequence[npt.DTypeLike]) -> None:
        self.dtypes = tuple(dtypes)
        self.lock = threading.Lock()
        self.clear()

    def clear(self) -> None:
        with self.lock:
            self.view = _empty_view(self.dtypes)

    def __len__(self) -> int:
        return self.view.count

    @property
    def n_bytes(self) -> int:
        """The entries' texts' bytes."""
        return self.view.n_bytes

    @property
    def overflow(self) -> dict[bytes, int]:
        """The texts without a slot, found by their bytes, and their entries."""
        return self.view.overflow

    def find(
        self,
        buf: npt.NDArray[np.uint8],
        raw: bytes,
        start: npt.NDArray[np.int64],
        length: npt.NDArray[np.int64],
    ) -> Found:
        """The entry of each text `raw[start:start+length]` (`buf`: `padded(raw)`), -1 for
        those not met yet; texts not in a slot are looked up in the dict one by one."""
        view = self.view
        texts = hash_texts(buf, raw, start, length)
        ids, match = view.slots.find(texts.hashes)  # candidates, then compared word for word
        hit = match & (ids >= 0) & (ids < view.count)
        ids[~hit] = 0  # (a valid index: entry 0's stored words, or the zero words)
        hit &= view.length[ids] == length
        hit &= _same_words(view, ids, texts)
        ids[~hit] = -1
        if not hit.all():
            missed = np.flatnonzero(~hit)
            get, count = view.overflow.get, view.count
            for i, a, n in zip(
                missed.tolist(), start[missed].tolist(), length[missed].tolist(), strict=True
            ):
                entry = get(raw[a : a + n])
                if entry is not None and entry < count:
                    ids[i] = entry
        return Found(ids, view, texts)

    def add(
        self, found: Found, which: npt.NDArray[np.intp], values: Sequence[Sequence[Any]]
    ) -> npt.NDArray[np.int64]:
        """Add the texts `which` of a `find` (distinct ones, not found), with their values of
        each column; their entry ids. A text whose hash has a slot already (another text, or
        the same one added by another thread) or that is too long gets none: the dict has it."""
        texts = found.texts
        m = len(which)
        with self.lock:
            view = self.view
            c = view.count
            size = c + m
            slots = view.slots
            if 2 * size > len(slots.ids):
                slots = slots.resized(size)
            n_words = texts.n_words[which]
            length = texts.length[which]
            w = view.n_words
            n_w = w + int(n_words.sum())
            all_words = _grown(view.words, n_w)
            all_words[w:n_w] = texts.words_of(which)
            word_end, all_length = (_grown(a, size) for a in (view.word_end, view.length))
            word_end[c:size] = w + np.cumsum(n_words)
            all_length[c:size] = length
            columns = []
            for column, dtype, vals in zip(view.columns, self.dtypes, values, strict=True):
                grown = _grown(column, size)
                grown[c:size] = np.fromiter(vals, dtype, m)
                columns.append(grown)
            ids = np.arange(c, size)
            slotted = (length > 0) & (n_words <= _MAX_WORDS)
            placed = np.zeros(m, bool)
            placed[slotted] = slots.place(texts.hashes[which][slotted], ids[slotted])
            raw, start = texts.raw, texts.start[which]
            for k in np.flatnonzero(~placed).tolist():
                a = int(start[k])
                view.overflow[raw[a : a + int(length[k])]] = c + k
            self.view = view._replace(
                slots=slots,
                words=all_words,
                n_words=n_w,
                word_end=word_end,
                length=all_length,
                columns=tuple(columns),
                count=size,
                n_bytes=view.n_bytes + int(length.sum()),
            )
        return ids


def _same_words(view: TableView, ids: npt.NDArray[np.int64], texts: Texts) -> npt.NDArray[np.bool_]:
    """Whether each text's words are those stored for entry `ids` (of the same length)."""
    word_end = view.word_end[ids]
    if texts.rows is not None:
        assert texts.masks is not None
        rows = texts.rows
        cols = rows.shape[1]
        window = as_strided(view.words, shape=(len(view.words) - cols + 1, cols), strides=(8, 8))
        stored = window[np.maximum(word_end - cols, 0)]  # entries' words fill their rows' ends
        stored &= texts.masks
        differ = stored != rows
        if not differ.any():
            return np.ones(len(ids), bool)
        return ~differ.any(axis=1)
    assert texts.words is not None and texts.first is not None
    words, first, n_words = texts.words, texts.first, texts.n_words
    stored = view.words.take(
        np.repeat(word_end - n_words - first, n_words) + np.arange(len(words)), mode="clip"
    )
    return ~np.logical_or.reduceat(stored != words, first)


class Slots(NamedTuple):
    """Open addressing of 64-bit hashes to ids (linear probing, at most one slot per hash):
    `ByteTable`'s candidates by text hash, the gateway's series by key. Slots are only filled
    (a slot's hash before its id) or all replaced (`resized`), so readers need no lock."""

    ids: npt.NDArray[np.int64]  # the id in each slot, -1 if none
    hashes: npt.NDArray[np.uint64]  # that id's hash
    shift: np.uint64  # a hash's first slot is its top bits: hash >> shift

    def find(
        self, hashes: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """Per hash, the id in its slot and whether there is one (else any id, or -1)."""
        slot_ids, slot_hashes, mask = self.ids, self.hashes, len(self.ids) - 1
        probe = (hashes >> self.shift).astype(np.int64)
        ids = slot_ids[probe]
        match = slot_hashes[probe] == hashes
        going = np.flatnonzero((ids >= 0) & ~match)  # another hash's slot: probe on
        for _ in range(_MAX_PROBES - 1):
            if not len(going):
                break
            probe[going] = (probe[going] + 1) & mask
            sid = slot_ids[probe[going]]
            now = slot_hashes[probe[going]] == hashes[going]
            ids[going] = sid
            match[going] = now
            going = going[(sid >= 0) & ~now]
        return ids, match & (ids >= 0)

    def place(
        self, hashes: npt.NDArray[np.uint64], ids: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]:
        """Put `ids` in free slots (at most half the slots should be taken); which were
        placed: not those whose hash has a slot already, or that probed too far."""
        slot_ids, slot_hashes = self.ids, self.hashes
        mask = len(slot_ids) - 1
        probe = (hashes >> self.shift).astype(np.int64)
        pending = np.arange(len(hashes))
        placed = np.zeros(len(hashes), bool)
        for _ in range(_MAX_PROBES):
            if not len(pending):
                break
            at = probe[pending]
            free = np.flatnonzero(slot_ids[at] < 0)
            win = free[np.unique(at[free], return_index=True)[1]]  # one id per free slot
            slot_hashes[at[win]] = hashes[pending[win]]
            slot_ids[at[win]] = ids[pending[win]]
            placed[pending[win]] = True
            # (after the winners: an id of the same hash as this round's winner stops here
            # too, as `find` stops at the first slot of a hash)
            taken = (slot_ids[at] >= 0) & (slot_hashes[at] == hashes[pending])
            go_on = ~taken
            go_on[win] = False
            pending = pending[go_on]
            probe[pending] = (probe[pending] + 1) & mask
        return placed

    def resized(self, size: int) -> Slots:
        """New slots for `size` ids (at most half of them used), these slots' ids placed."""
        bigger = new_slots(1 << (4 * size - 1).bit_length())
        was = np.flatnonzero(self.ids >= 0)
        bigger.place(self.hashes[was], self.ids[was])
        return bigger


def new_slots(n_slots: int) -> Slots:
    """Empty slots (`n_slots`: a power of two)."""
    return Slots(
        ids=np.full(n_slots, -1, np.int64),
        hashes=np.zeros(n_slots, np.uint64),
        shift=np.uint64(64 - n_slots.bit_length() + 1),
    )
