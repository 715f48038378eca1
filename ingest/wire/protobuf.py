"""The protobuf walker of remote write's fast paths (1.0 and 2.0), as compiled loops.

Remote write bodies are protobuf: a request of series, each series its labels (1.0: label
messages; 2.0: packed refs into the request's symbol table), float samples (`value` fixed64,
`timestamp` varint; 2.0 also `start_timestamp`) and, in 2.0, metadata and an old sender's
`created_timestamp`. `walk_v1` and `walk_v2` read every series of a body in one pass of plain
loops, compiled (`core.jit`, without the GIL), over the same varint, length and sample
readers, and say where each series' label bytes are (1.0) or its label refs (2.0), and its
samples. It takes only what senders write, in the order they write
it; anything else (histograms, exemplars, fields out of order, unknown fields, a truncated or
overlong varint) makes it answer "not this shape", and the full upb parse decides. It never
accepts a body the full parse refuses: what it reads is read as upb reads it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from core.jit import kernel

# Field tags (field number << 3 | wire type) of the messages walked.
LEN_1, LEN_2, LEN_5 = 0x0A, 0x12, 0x2A  # length-delimited fields 1, 2, 5
FIXED64_1 = 0x09  # Sample.value
VARINT_1, VARINT_2, VARINT_3, VARINT_4, VARINT_6 = 0x08, 0x10, 0x18, 0x20, 0x30


@kernel
def varint(buf: npt.NDArray[np.uint8], pos: int, end: int) -> tuple[np.uint64, int]:
    """The varint at `buf[pos]` and the position after it; position -1 if it runs past `end`,
    or is longer than 10 bytes or over 64 bits (as upb refuses it)."""
    value = np.uint64(0)
    shift = 0
    while pos < end:
        b = buf[pos]
        pos += 1
        if shift == 63 and b > 1:
            return value, -1
        value |= np.uint64(b & 0x7F) << np.uint64(shift)
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            return value, -1
    return value, -1


@kernel
def length(buf: npt.NDArray[np.uint8], pos: int, end: int) -> tuple[np.uint64, int]:
    """A length-delimited field's length (a varint of at most 5 bytes, as upb takes it) at
    `buf[pos]` and the position after it; position -1 if it is not one or runs past `end`."""
    if pos < end and buf[pos] < 0x80:  # the usual: under 128 bytes
        n = np.uint64(buf[pos])
        if n > np.uint64(end - pos - 1):
            return n, -1
        return n, pos + 1
    n, after = varint(buf, pos, min(end, pos + 5))
    if after < 0 or n > np.uint64(end - after):
        return n, -1
    return n, after


@kernel
def _fixed64(buf: npt.NDArray[np.uint8], pos: int) -> np.uint64:
    """The 8 bytes at `buf[pos]`, little-endian."""
    v = np.uint64(0)
    for k in range(8):
        v |= np.uint64(buf[pos + k]) << np.uint64(8 * k)
    return v


@kernel
def field_bounds(
    buf: npt.NDArray[np.uint8], tag: int
) -> tuple[bool, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Where each field's bytes start and end, if `buf` is only length-delimited fields `tag`
    (remote write 1.0's series); False if it holds anything else or is cut short."""
    n = buf.shape[0]
    cap = 64
    starts = np.empty(cap, np.int64)
    ends = np.empty(cap, np.int64)
    k = 0
    pos = 0
    while pos < n:
        if buf[pos] != tag:
            return False, starts[:0], ends[:0]
        size, pos = length(buf, pos + 1, n)
        if pos < 0:
            return False, starts[:0], ends[:0]
        if k == cap:
            cap *= 2
            grown = np.empty(cap, np.int64)
            grown[:k] = starts[:k]
            starts = grown
            grown = np.empty(cap, np.int64)
            grown[:k] = ends[:k]
            ends = grown
        starts[k] = pos
        pos += np.int64(size)
        ends[k] = pos
        k += 1
    return True, starts[:k], ends[:k]


def series_index(
    counts: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.intp] | None]:
    """Each sample's series, numbered among the series with samples (a walker's `counts`
    per series), and which series those are (None: all of them, in order). Series without
    samples are left out, as the full parses' `to_batch` do."""
    n = len(counts)
    if (counts == 1).all():  # one sample a series: the steady state
        return np.arange(n, dtype=np.int32), None
    kept = np.flatnonzero(counts)
    series_idx = np.repeat(np.arange(len(kept), dtype=np.int32), counts[kept])
    return series_idx, (kept if len(kept) < n else None)


@kernel
def _grow(values: npt.NDArray[np.uint64], k: int) -> npt.NDArray[np.uint64]:
    """`values` with room for twice as many, its first `k` kept."""
    grown = np.empty(2 * values.shape[0] + 16, values.dtype)
    grown[:k] = values[:k]
    return grown


@kernel
def _samples(
    buf: npt.NDArray[np.uint8],
    p: int,
    end: int,
    with_start: bool,
    stamps: npt.NDArray[np.uint64],
    bits: npt.NDArray[np.uint64],
    k: int,
) -> tuple[int, int, npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """The sample fields (tag 2) of one series from `buf[p]` on: each `value` (fixed64) then
    `timestamp` (varint), both optional, and in 2.0 (`with_start`) a `start_timestamp`; their
    timestamps and value bits stored from `stamps[k]`, `bits[k]` (grown when full). The
    position after them (-1 if one is not of this shape) and the new count."""
    while p < end and buf[p] == LEN_2:
        size, q = length(buf, p + 1, end)
        if q < 0:
            return -1, k, stamps, bits
        inner_end = q + np.int64(size)
        value = np.uint64(0)
        stamp = np.uint64(0)
        if q < inner_end and buf[q] == FIXED64_1:
            if inner_end - q < 9:
                return -1, k, stamps, bits
            value = _fixed64(buf, q + 1)
            q += 9
        if q < inner_end and buf[q] == VARINT_2:
            stamp, q = varint(buf, q + 1, inner_end)
            if q < 0:
                return -1, k, stamps, bits
        if with_start and q < inner_end and buf[q] == VARINT_3:
            _, q = varint(buf, q + 1, inner_end)
            if q < 0:
                return -1, k, stamps, bits
        if q != inner_end:
            return -1, k, stamps, bits
        if k == stamps.shape[0]:
            stamps = _grow(stamps, k)
            bits = _grow(bits, k)
        stamps[k] = stamp
        bits[k] = value
        k += 1
        p = inner_end
    return p, k, stamps, bits


@kernel
def walk_v1(
    buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
) -> tuple[
    bool,
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint64],
]:
    """Remote write 1.0's series `buf[starts[i]:ends[i]]`, if each is label fields then sample
    fields (`_samples`) and nothing else: (True, each series' label end (its labels are
    `buf[start:label end]`), samples per series, every sample's timestamp and value bits in
    series order). False (the full parse decides) for anything else."""
    n = starts.shape[0]
    label_end = np.empty(n, np.int64)
    counts = np.zeros(n, np.int64)
    stamps = np.empty(n + 16, np.uint64)
    bits = np.empty(n + 16, np.uint64)
    k = 0
    for i in range(n):
        p = starts[i]
        end = ends[i]
        while p < end and buf[p] == LEN_1:  # labels: hopped over here, parsed by upb
            if p + 1 < end and buf[p + 1] < 0x80:  # the usual: a label under 128 bytes
                p += 2 + np.int64(buf[p + 1])
                continue
            size, q = length(buf, p + 1, end)
            if q < 0:
                return False, label_end, counts, stamps[:0], bits[:0]
            p = q + np.int64(size)
        if p > end:
            return False, label_end, counts, stamps[:0], bits[:0]
        label_end[i] = p
        before = k
        p, k, stamps, bits = _samples(buf, p, end, False, stamps, bits, k)
        if p != end:
            return False, label_end, counts, stamps[:0], bits[:0]
        counts[i] = k - before
    return True, label_end, counts, stamps[:k], bits[:k]


@kernel
def walk_v2(
    buf: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    n_symbols: int,
) -> tuple[
    bool,
    npt.NDArray[np.int64],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
]:
    """Remote write 2.0's series `buf[starts[i]:ends[i]]`, if each is one packed field of label
    refs (an even count, each under `n_symbols`), sample fields (`_samples`), metadata (type,
    help ref, unit ref; the refs under `n_symbols`) and a created_timestamp, each optional, in
    that order: (True, samples per series, every sample's timestamp and value bits in series
    order, the label refs of all series and how many each has). False (the full parse
    decides) for anything else."""
    n = starts.shape[0]
    counts = np.zeros(n, np.int64)
    n_refs = np.zeros(n, np.int64)
    stamps = np.empty(n + 16, np.uint64)
    bits = np.empty(n + 16, np.uint64)
    refs = np.empty(16 * n + 16, np.uint64)
    k = r = 0
    fail = (False, counts, stamps[:0], bits[:0], n_refs, n_refs)
    for i in range(n):
        p = starts[i]
        end = ends[i]
        if p < end and buf[p] == LEN_1:  # label refs
            size, q = length(buf, p + 1, end)
            if q < 0:
                return fail
            p = q + np.int64(size)
            while q < p:
                ref, q = varint(buf, q, p)
                if q < 0 or ref >= np.uint64(n_symbols):
                    return fail
                if r == refs.shape[0]:
                    refs = _grow(refs, r)
                refs[r] = ref
                r += 1
                n_refs[i] += 1
            if n_refs[i] % 2:
                return fail
        before = k
        p, k, stamps, bits = _samples(buf, p, end, True, stamps, bits, k)
        if p < 0:
            return fail
        counts[i] = k - before
        if p < end and buf[p] == LEN_5:  # metadata
            size, q = length(buf, p + 1, end)
            if q < 0:
                return fail
            p = q + np.int64(size)
            if q < p and buf[q] == VARINT_1:
                _, q = varint(buf, q + 1, p)
                if q < 0:
                    return fail
            for tag in (VARINT_3, VARINT_4):  # help and unit refs
                if q < p and buf[q] == tag:
                    ref, q = varint(buf, q + 1, p)
                    if q < 0 or ref >= np.uint64(n_symbols):
                        return fail
            if q != p:
                return fail
        if p < end and buf[p] == VARINT_6:  # created_timestamp
            _, p = varint(buf, p + 1, end)
            if p < 0:
                return fail
        if p != end:
            return fail
    return True, counts, stamps[:k], bits[:k], refs[:r].view(np.int64), n_refs
