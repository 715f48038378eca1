"""Byte strings found in bulk: many byte ranges of one buffer (a request's series) looked up at
once, among the byte strings met before, each to an entry id.

The gateway's decoders see the same series request after request, as the same bytes: line
protocol's series key texts, remote write's label sections. A dict costs a slice, a hash and a
lookup per series in Python; `ByteTable.find` does a whole request's in one compiled kernel
(`core.jit`, without the GIL): each text's 8-byte words times a constant of their place,
summed, give its hash; an open-addressing table of hashes (`Slots`, also the gateway's table of
series keys) gives a candidate entry; the candidate's stored words are compared with the text's,
so a hash is only a hint: a collision costs speed, never exactness. Texts the slots cannot hold
(their hash taken by another text, a probe too long, over 8 KiB, empty) are found in a dict by
their bytes. Entries carry the caller's columns (labels, keys...).

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

from core.jit import kernel, warms

ROW_WORDS = 64  # zero words in front of a table's stored words
PAD = (
    8 * ROW_WORDS
)  # zero bytes `padded` puts in front of a buffer: a text's first word may start before it
_MAX_WORDS = 1024  # longer texts (8 KiB) get no slot: found through the dict
_MAX_PROBES = 32  # a text whose slot is further than this from its hash's goes to the dict
_ALL = (1 << 64) - 1
# Hashes: each 8-byte word (aligned on the text's end, the first zero padded in front) times
# the constant of its place counted from the end, summed, the length mixed in. (Read at each
# call, as `_HASH_MASK`: tests make hashes collide on purpose.)
_MIX = np.random.default_rng(0x5EED).integers(0, 1 << 63, _MAX_WORDS, dtype=np.uint64)
_MIX = _MIX * np.uint64(2) + np.uint64(1)
_HASH_MASK = np.uint64(_ALL)
_LEN_MIX, _FINAL_MIX = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)
_ALL_U64 = np.uint64(_ALL)


def padded(raw: bytes) -> npt.NDArray[np.uint8]:
    """`raw` as `find` reads it: `PAD` zero bytes in front (a text's first word may start before
    the buffer) and 8 behind (an 8-byte read at any offset stays inside)."""
    return np.frombuffer(b"".join((bytes(PAD), raw, bytes(8))), np.uint8)


_U64 = np.dtype("<u8")


def words_at(buf: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint64]:
    """`buf`'s 8-byte little-endian words at every byte offset (a view: item i is bytes i to
    i + 7, an unaligned load or store; none if `buf` is shorter than 8 bytes): how the kernels
    read and write a buffer a word at a time."""
    return np.ndarray((max(len(buf) - 7, 0),), _U64, buf, strides=(1,))


@kernel
def _word(at_byte: npt.NDArray[np.uint64], at: int) -> np.uint64:
    return at_byte[at]


@kernel
def _head(n_words: int, size: int) -> np.uint64:
    """The bits of a text's first word that are its bytes (the rest is what precedes it)."""
    return _ALL_U64 << np.uint64(8 * (8 * n_words - size))


@kernel
def _hash(
    at_byte: npt.NDArray[np.uint64], end: int, size: int, mix: npt.NDArray[np.uint64]
) -> np.uint64:
    """The hash of the `size` (>= 1) bytes before `end` (`at_byte`: `words_at(buf)`)."""
    n_words = (size + 7) >> 3
    last = mix.shape[0] - 1
    h = np.uint64(0)
    for j in range(n_words):  # j: the word's place counted from the end
        w = _word(at_byte, end - 8 * (j + 1))
        if j == n_words - 1:
            w &= _head(n_words, size)
        h += w * mix[min(j, last)]
    h ^= np.uint64(size) * _LEN_MIX
    h ^= h >> np.uint64(31)
    h *= _FINAL_MIX
    h ^= h >> np.uint64(29)
    return h


@kernel
def _hashes(
    at_byte: npt.NDArray[np.uint64],
    start: npt.NDArray[np.int64],
    length: npt.NDArray[np.int64],
    mix: npt.NDArray[np.uint64],
    hash_mask: np.uint64,
) -> npt.NDArray[np.uint64]:
    hashes = np.empty(start.shape[0], np.uint64)
    for i in range(start.shape[0]):
        size = max(length[i], 1)
        hashes[i] = _hash(at_byte, start[i] + size + PAD, size, mix) & hash_mask
    return hashes


@kernel
def _find(
    at_byte: npt.NDArray[np.uint64],
    start: npt.NDArray[np.int64],
    length: npt.NDArray[np.int64],
    mix: npt.NDArray[np.uint64],
    hash_mask: np.uint64,
    slot_ids: npt.NDArray[np.int64],
    slot_hashes: npt.NDArray[np.uint64],
    shift: np.uint64,
    words: npt.NDArray[np.uint64],
    word_end: npt.NDArray[np.int64],
    stored_length: npt.NDArray[np.int64],
    count: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
    """Each text's entry (-1: none) among the first `count` and its hash: the slot of its
    hash gives a candidate, whose length and stored words must be the text's. (In passes over
    all texts, each of independent loads: the cache misses of many texts overlap.)"""
    n = start.shape[0]
    ids = np.full(n, -1, np.int64)
    hashes = np.empty(n, np.uint64)
    for i in range(n):
        size = max(length[i], 1)  # (an empty text is hashed as if one byte long)
        hashes[i] = _hash(at_byte, start[i] + size + PAD, size, mix) & hash_mask
    mask = slot_ids.shape[0] - 1
    first = np.empty(n, np.int64)
    for i in range(n):
        first[i] = np.int64(hashes[i] >> shift)
    firsts = np.empty(n, np.int64)
    for i in range(n):
        firsts[i] = slot_ids[first[i]]
    for i in range(n):
        h = hashes[i]
        probe = first[i]
        sid = firsts[i]
        for _ in range(_MAX_PROBES):
            if sid < 0:
                break
            if slot_hashes[probe] == h:
                ids[i] = sid
                break
            probe = (probe + 1) & mask
            sid = slot_ids[probe]
    for i in range(n):
        candidate = ids[i]
        if candidate < 0:
            continue
        ids[i] = -1
        real = length[i]
        if candidate >= count or stored_length[candidate] != real:
            continue
        size = max(real, 1)
        end = start[i] + size + PAD
        n_words = (size + 7) >> 3
        stored_end = word_end[candidate]
        if stored_end - n_words < 0:
            continue
        same = True
        for j in range(n_words):
            w = _word(at_byte, end - 8 * (j + 1))
            s = words[stored_end - 1 - j]
            if j == n_words - 1:
                head = _head(n_words, size)
                w &= head
                s &= head
            if w != s:
                same = False
                break
        if same:
            ids[i] = candidate
    return ids, hashes


@kernel
def _words_of(
    at_byte: npt.NDArray[np.uint64],
    start: npt.NDArray[np.int64],
    length: npt.NDArray[np.int64],
    which: npt.NDArray[np.intp],
) -> npt.NDArray[np.uint64]:
    total = 0
    for k in range(which.shape[0]):
        total += (max(length[which[k]], 1) + 7) >> 3
    out = np.empty(total, np.uint64)
    at = 0
    for k in range(which.shape[0]):
        i = which[k]
        size = max(length[i], 1)
        n_words = (size + 7) >> 3
        end = start[i] + size + PAD
        for c in range(n_words):  # first word first
            w = _word(at_byte, end - 8 * (n_words - c))
            if c == 0:
                w &= _head(n_words, size)
            out[at + c] = w
        at += n_words
    return out


@kernel
def _probe(
    hashes: npt.NDArray[np.uint64],
    slot_ids: npt.NDArray[np.int64],
    slot_hashes: npt.NDArray[np.uint64],
    shift: np.uint64,
) -> npt.NDArray[np.int64]:
    """Each hash's id in `Slots` (-1: none)."""
    ids = np.full(hashes.shape[0], -1, np.int64)
    mask = slot_ids.shape[0] - 1
    for i in range(hashes.shape[0]):
        h = hashes[i]
        probe = np.int64(h >> shift)
        for _ in range(_MAX_PROBES):
            sid = slot_ids[probe]
            if sid < 0:
                break
            if slot_hashes[probe] == h:
                ids[i] = sid
                break
            probe = (probe + 1) & mask
    return ids


class Texts(NamedTuple):
    """Byte ranges `raw[start:start+length]` (`buf`: `padded(raw)`) and their hashes."""

    raw: bytes
    buf: npt.NDArray[np.uint8]
    start: npt.NDArray[np.int64]
    length: npt.NDArray[np.int64]
    hashes: npt.NDArray[np.uint64]

    @property
    def n_words(self) -> npt.NDArray[np.int64]:
        """Each text's 8-byte words (one for an empty text)."""
        return (np.maximum(self.length, 1) + 7) >> 3

    def words_of(self, which: npt.NDArray[np.intp]) -> npt.NDArray[np.uint64]:
        """The words of texts `which`, one after the other (each text aligned on its end, the
        bytes before it in its first word zeroed)."""
        which = which.astype(np.intp, copy=False)
        return _words_of(words_at(self.buf), self.start, self.length, which)


def hash_texts(
    buf: npt.NDArray[np.uint8],
    raw: bytes,
    start: npt.NDArray[np.int64],
    length: npt.NDArray[np.int64],
) -> Texts:
    """The texts `raw[start:start+length]` (`buf`: `padded(raw)`) and their hashes. Empty texts
    are hashed as if one byte long (they are found through the dict only)."""
    return Texts(raw, buf, start, length, _hashes(words_at(buf), start, length, _MIX, _HASH_MASK))


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
        start = np.ascontiguousarray(start, np.int64)  # (the types the kernel is compiled for)
        length = np.ascontiguousarray(length, np.int64)
        view = self.view
        slots = view.slots
        ids, hashes = _find(
            words_at(buf), start, length, _MIX, _HASH_MASK, slots.ids, slots.hashes, slots.shift,
            view.words, view.word_end, view.length, view.count,
        )  # fmt: skip
        hit = ids >= 0
        if not hit.all():
            missed = np.flatnonzero(~hit)
            get, count = view.overflow.get, view.count
            for i, a, n in zip(
                missed.tolist(), start[missed].tolist(), length[missed].tolist(), strict=True
            ):
                entry = get(raw[a : a + n])
                if entry is not None and entry < count:
                    ids[i] = entry
        return Found(ids, view, Texts(raw, buf, start, length, hashes))

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
        ids = _probe(hashes, self.ids, self.hashes, self.shift)
        return ids, ids >= 0

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


@warms
def _warm() -> None:
    """`find`, `add` and `Slots.find` with the argument types of the gateway's decoders."""
    table = ByteTable([np.int64])
    raw = b"abc"
    start, length = np.zeros(1, np.int64), np.full(1, 3, np.int64)
    found = table.find(padded(raw), raw, start, length)
    table.add(found, np.zeros(1, np.intp), [[1]])
    table.find(padded(raw), raw, start, length)
    table.view.slots.find(np.zeros(1, np.uint64))
