"""The chunk codec's fast path: `encode_chunks` as compiled loops (numba), one chunk after another.

A flush encodes thousands of chunks, and the reference (`encoding.encode_chunk`) costs much the
same per chunk whatever its size: hundreds of NumPy calls on small arrays (bench/bench_codec.py).
Here each step of the reference runs as a plain loop over one chunk's samples, compiled, and
writes the same bytes; each function names the reference function it follows. zstd cannot run
in compiled code, so the two places where the reference tries it are finished in Python:

* values that fit decimals poorly (more than 4 bytes a sample) are also tried as XOR by the
  reference's `_put_xor` (zstd included), and the smaller kept;
* a chunk with an int stream the reference would try to zstd (byte-aligned, 24+ bytes; rare:
  bit-packed streams seldom land on whole bytes) is encoded by `encode_chunk` itself.

The kernels run without the GIL and keep their machine code on disk (`core.jit`); `core.jit.warm`
compiles or loads them at a node's start, so no flush waits for the compiler.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from core.jit import kernel, warms
from store.encoding import (
    _MAX_EXACT,
    _MAX_EXP,
    _MIN_ZSTD_INPUT,
    _PATCH_BITS,
    _POW10,
    _SMALL,
    MAX_SAMPLES,
    VERSION,
    _put_xor,
    decode_chunk,
    encode_chunk,
)

U8 = npt.NDArray[np.uint8]
U64 = npt.NDArray[np.uint64]
I8 = npt.NDArray[np.int8]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

_U0, _U1, _U7, _U0x7F, _U0x80 = (np.uint64(v) for v in (0, 1, 7, 0x7F, 0x80))
_NEG_ZERO = np.uint64(1 << 63)
_TRY_XOR, _REFERENCE = 1, 2  # what a chunk's flag asks Python to finish


# Every kernel writes into `buf` at `pos` and returns the position after what it wrote. uint64
# values are kept apart from int64 ones: numba turns a mixed expression into float64.


@kernel
def _uvarint(buf: U8, pos: int, v: np.uint64) -> int:
    """`encoding._uvarint` of a uint64."""
    while v >= _U0x80:
        buf[pos] = np.uint8((v & _U0x7F) | _U0x80)
        v >>= _U7
        pos += 1
    buf[pos] = np.uint8(v)
    return pos + 1


@kernel
def _svarint(buf: U8, pos: int, v: int) -> int:
    """`encoding._svarint` of an int64 (zigzag)."""
    return _uvarint(buf, pos, (np.uint64(v) << _U1) ^ np.uint64(v >> 63))


@kernel
def _bit_length(v: np.uint64) -> int:
    """Exact bit length of a uint64 (int.bit_length)."""
    b = 0
    while v:
        v >>= _U1
        b += 1
    return b


@kernel
def _frexp_length(v: np.uint64) -> int:
    """np.frexp(float(v))[1], the reference's bit-length estimate: exact below 2**53, one more
    where rounding to float64 reaches the next power of two."""
    return math.frexp(float(v))[1]


@kernel
def _gcd(a: np.uint64, b: np.uint64) -> np.uint64:
    while b:
        a, b = b, a % b
    return a


@kernel
def _bitpack(buf: U8, pos: int, u: U64, width: int) -> int:
    """`encoding._bitpack`: the low `width` bits of each value, concatenated little-endian."""
    if width == 0:
        return pos
    mask = ~_U0 if width == 64 else (_U1 << np.uint64(width)) - _U1
    acc = _U0
    used = 0  # bits of acc in use, always below 64
    for i in range(len(u)):
        v = u[i] & mask
        acc |= v << np.uint64(used)
        used += width
        if used >= 64:
            for j in range(8):
                buf[pos + j] = np.uint8((acc >> np.uint64(8 * j)) & np.uint64(0xFF))
            pos += 8
            used -= 64
            acc = v >> np.uint64(width - used) if used > 0 else _U0
    for j in range((used + 7) // 8):
        buf[pos + j] = np.uint8((acc >> np.uint64(8 * j)) & np.uint64(0xFF))
    return pos + (used + 7) // 8


@kernel
def _frame(v: I64) -> tuple[int, np.uint64, U64, int]:
    """`encoding._plan`'s frame of reference: base, gcd, u = (v - base) / gcd, u's bit length."""
    base = v.min()
    u = np.empty(len(v), np.uint64)
    g = _U0
    for i in range(len(v)):
        u[i] = np.uint64(v[i]) - np.uint64(base)  # wraps: the exact distance to the minimum
        if g != _U1:
            g = _gcd(u[i], g)
    if g > _U1:
        for i in range(len(v)):
            u[i] //= g
    return base, g, u, _bit_length(u.max())


@kernel
def _head(
    buf: U8, pos: int, n: int, width: int, base: int, g: np.uint64, patched: bool, flag: I8
) -> int:
    """An int stream's head, base and gcd (`encoding._write_plan`). Sets flag[0] where the
    reference would try zstd on the payload."""
    if width % 8 == 0 and (n * width + 7) // 8 >= _MIN_ZSTD_INPUT:
        flag[0] = 1
    head = width + (256 if g > _U1 else 0) + (512 if patched else 0)
    pos = _uvarint(buf, pos, np.uint64(head))
    pos = _svarint(buf, pos, base)
    if g > _U1:
        pos = _uvarint(buf, pos, g)
    return pos


@kernel
def _plain(buf: U8, pos: int, v: I64, flag: I8) -> int:
    """`encoding._write_plan(encoding._plan(v, patch=False))`: an int stream without patches."""
    if len(v) == 0:
        buf[pos] = 0  # head: width 0
        buf[pos + 1] = 0  # base 0
        return pos + 2
    base, g, u, top = _frame(v)
    pos = _head(buf, pos, len(v), top, base, g, False, flag)
    return _bitpack(buf, pos, u, top)


@kernel
def _patched(buf: U8, pos: int, v: I64, flag: I8) -> int:
    """`encoding._write_plan(encoding._plan(v))`: an int stream, values far wider than most
    written as patches."""
    n = len(v)
    if n < _SMALL:
        return _plain(buf, pos, v, flag)
    base, g, u, top = _frame(v)
    width = top
    if top > 0:
        # The width that minimises n * w + above(w) * (top - w + _PATCH_BITS) + 32 [above > 0],
        # above(w) the values estimated wider than w bits.
        hist = np.zeros(66, np.int64)
        for i in range(n):
            hist[_frexp_length(u[i])] += 1
        below = 0
        best = -1
        for w in range(top + 1):
            below += hist[w]
            above = n - below
            cost = n * w + above * (top - w + _PATCH_BITS) + (32 if above > 0 else 0)
            if best < 0 or cost < best:
                best, width = cost, w
    npatch = 0
    if width < top:
        for i in range(n):
            if u[i] >> np.uint64(width):
                npatch += 1
    pos = _head(buf, pos, n, width, base, g, npatch > 0, flag)
    if npatch:
        # Patched values keep their low bits in place and list their high bits.
        where = np.empty(npatch, np.int64)
        high = np.empty(npatch, np.int64)
        j = 0
        for i in range(n):
            h = u[i] >> np.uint64(width)
            if h:
                where[j] = i
                high[j] = np.int64(h)
                j += 1
        pos = _uvarint(buf, pos, np.uint64(npatch))
        pos = _svarint(buf, pos, where[0])
        pos = _plain(buf, pos, where[1:] - where[:-1], flag)
        pos = _plain(buf, pos, high, flag)
    return _bitpack(buf, pos, u, width)


@kernel
def _diffs(buf: U8, pos: int, v: I64, order: int, patch: bool, flag: I8) -> int:
    """`encoding._put_diffs`: seeds (the first value of each difference), then the int stream
    of the order-th differences (int64 arithmetic wraps)."""
    for _ in range(order):
        if len(v) == 0:
            break
        pos = _svarint(buf, pos, v[0])
        v = v[1:] - v[:-1]
    return _patched(buf, pos, v, flag) if patch else _plain(buf, pos, v, flag)


@kernel
def _best_diffs(buf: U8, pos: int, v: I64, lo: int, hi: int, flag: I8) -> int:
    """`encoding._put_best_diffs` over the orders lo..hi: `u8 order | seeds | int stream`."""
    n = len(v)
    if n < _SMALL:  # every candidate written, the first of the shortest kept
        tmp = np.empty(24 * n + 128, np.uint8)
        size = -1
        for o in range(lo, hi + 1):
            tmp[0] = o
            end = _diffs(tmp, 1, v, o, True, flag)
            if size < 0 or end < size:
                size = end
                buf[pos : pos + size] = tmp[:size]
        return pos + size
    # Each order's cost estimate on the common tail of all candidates (the last n - hi values).
    m = n - hi
    best_cost = -1
    best = lo
    d = v
    for o in range(hi + 1):
        if o > 0:
            d = d[1:] - d[:-1]
        if o < lo:
            continue
        tail = d[len(d) - m :]
        low = np.uint64(tail.min())
        hist = np.zeros(66, np.int64)
        top = 0
        for t in tail:
            length = _frexp_length(np.uint64(t) - low)
            hist[length] += 1
            top = max(top, length)
        cost_o = -1
        below = 0
        for w in range(top + 1):
            below += hist[w]
            above = m - below
            cost = m * w + above * (top - w + _PATCH_BITS) + (32 if above > 0 else 0)
            if cost_o < 0 or cost < cost_o:
                cost_o = cost
        if best_cost < 0 or cost_o < best_cost:
            best_cost, best = cost_o, o
    buf[pos] = best
    return _diffs(buf, pos + 1, v, best, True, flag)


@kernel
def _decimal(buf: U8, pos: int, x: F64, flag: I8) -> int:
    """`encoding._put_decimal`: the DECIMAL values section, with the exponent of
    `encoding._find_decimal` (the first with the fewest exceptions)."""
    n = len(x)
    bits = x.view(np.uint64)
    hopeless = 0
    for i in range(n):
        if not math.isfinite(x[i]) or bits[i] == _NEG_ZERO:
            hopeless += 1
    k = np.zeros(n, np.int64)
    exc = np.ones(n, np.bool_)
    kt = np.empty(n, np.int64)
    exct = np.empty(n, np.bool_)
    e_best = 0
    fewest = n + 1
    for e in range(_MAX_EXP + 1):
        p = _POW10[e]
        fits = False
        count = 0
        for i in range(n):
            scaled = x[i] * p
            kt[i] = 0
            exct[i] = True
            if math.isfinite(x[i]) and abs(scaled) < _MAX_EXACT:
                fits = True
                kt[i] = np.int64(np.rint(scaled))
                # k / 10**e is x bit for bit: equal, and not -0.0 (k = 0 gives +0.0)
                exct[i] = not (kt[i] / p == x[i] and bits[i] != _NEG_ZERO)
            count += exct[i]
        if not fits:
            break
        if count < fewest:
            fewest, e_best = count, e
            k[:] = kt
            exc[:] = exct
            if count == hopeless:
                break
    prev = 0  # an exception takes its predecessor's integer, keeping differences small
    nexc = 0
    for i in range(n):
        if exc[i]:
            k[i] = prev
            nexc += 1
        else:
            prev = k[i]
    buf[pos] = 0  # DECIMAL
    buf[pos + 1] = e_best
    pos = _best_diffs(buf, pos + 2, k, 0, 2, flag)
    pos = _uvarint(buf, pos, np.uint64(nexc))
    if nexc:
        where = np.empty(nexc, np.int64)
        j = 0
        for i in range(n):
            if exc[i]:
                where[j] = i
                j += 1
        pos = _diffs(buf, pos, where, 1, False, flag)
        for i in where:  # their raw bits, so NaN payloads survive
            for j in range(8):
                buf[pos + j] = np.uint8((bits[i] >> np.uint64(8 * j)) & np.uint64(0xFF))
            pos += 8
    return pos


@kernel
def _encode_all(ts: I64, x: F64, off: I64, out: U8) -> tuple[U8, I64, I64, I8]:
    """`encoding.encode_chunk` of each chunk off[c]:off[c + 1], into `out` (grown as needed).
    Returns (out, each chunk's end in out, where its values start, its flag)."""
    s = len(off) - 1
    ends = np.empty(s, np.int64)
    values_at = np.empty(s, np.int64)
    flags = np.zeros(s, np.int8)
    flag = np.zeros(1, np.int8)
    pos = 0
    for c in range(s):
        a, b = off[c], off[c + 1]
        n = b - a
        room = pos + 72 * n + 512  # the most a chunk of n samples can take, with margin
        if room > len(out):
            grown = np.empty(max(room, 2 * len(out)), np.uint8)
            grown[:pos] = out[:pos]
            out = grown
        flag[0] = 0
        out[pos] = VERSION
        pos = _uvarint(out, pos + 1, np.uint64(n))
        pos = _best_diffs(out, pos, ts[a:b], 1, 2, flag)
        values_at[c] = pos
        pos = _decimal(out, pos, x[a:b], flag)
        if flag[0]:
            flags[c] = _REFERENCE
        elif pos - values_at[c] > 4 * n:  # a poor decimal fit (e.g. full-precision floats)
            flags[c] = _TRY_XOR
        ends[c] = pos
    return out, ends, values_at, flags


def encode_chunks(
    timestamps: npt.ArrayLike, values: npt.ArrayLike, bounds: npt.ArrayLike
) -> list[bytes]:
    """Encode many chunks: chunk i is timestamps[bounds[i]:bounds[i + 1]] and the same slice of
    values (bounds[0] = 0, bounds[-1] = the number of samples). Each result equals
    `encode_chunk` of its chunk, byte for byte; ValueError as there, naming the chunk."""
    ts = np.asarray(timestamps)
    if ts.ndim != 1 or (ts.dtype.kind not in "iu" and len(ts)):
        raise ValueError(f"timestamps must be a 1-d integer array, got {ts.dtype} {ts.shape}")
    if ts.dtype.kind == "u" and len(ts) and int(ts.max()) > (1 << 63) - 1:
        raise ValueError("timestamps must fit int64")
    ts = np.ascontiguousarray(ts, dtype=np.int64)
    x = np.ascontiguousarray(values, dtype=np.float64)
    if x.shape != ts.shape:
        raise ValueError(f"{len(ts)} timestamps but values of shape {x.shape}")
    off = np.asarray(bounds)
    if off.ndim != 1 or len(off) < 1 or (off.dtype.kind not in "iu" and len(off) > 1):
        raise ValueError("bounds must be a 1-d integer array of chunk starts and the end")
    off = np.ascontiguousarray(off, dtype=np.int64)
    if off[0] != 0 or off[-1] != len(ts):
        raise ValueError(f"bounds must run from 0 to {len(ts)}, got {off[0]} to {off[-1]}")
    n = np.diff(off)
    if len(n) == 0:
        return []
    if (n < 0).any():
        raise ValueError("bounds must not decrease")
    short = np.flatnonzero((n < 1) | (n > MAX_SAMPLES))
    if len(short):
        c = int(short[0])
        raise ValueError(f"a chunk holds 1 to {MAX_SAMPLES} samples, got {n[c]} in chunk {c}")
    bad = np.flatnonzero(ts[1:] <= ts[:-1]) + 1
    if len(bad):
        bad = bad[np.isin(bad, off, invert=True)]  # going back across chunks is fine
    if len(bad):
        i = int(bad[0])
        c = int(np.searchsorted(off, i, side="right")) - 1
        j = i - int(off[c])
        raise ValueError(
            f"timestamps must be strictly increasing: ts[{j}]={ts[i]} after ts[{j - 1}]="
            f"{ts[i - 1]} in chunk {c}"
        )
    buf, ends, values_at, flags = _encode_all(ts, x, off, np.empty(4 * len(ts) + 1024, np.uint8))
    data = buf[: ends[-1]].tobytes()
    starts = [0, *ends[:-1].tolist()]
    out = [data[a:b] for a, b in zip(starts, ends.tolist(), strict=True)]
    for c in np.flatnonzero(flags).tolist():
        a, b = int(off[c]), int(off[c + 1])
        if flags[c] == _REFERENCE:
            out[c] = encode_chunk(ts[a:b], x[a:b])
            continue
        xor = bytearray()
        _put_xor(x[a:b], xor)
        head = int(values_at[c]) - starts[c]
        if len(xor) < len(out[c]) - head:
            out[c] = out[c][:head] + bytes(xor)
    return out


# ------------------------------------------------------------------------------------ decoding
# Every reading kernel takes the buffer, a position and the end of the chunk in it, and returns
# the position after what it read, or _FAIL: the chunk is corrupt, or holds something the kernels
# leave to the reference (zstd, a varint beyond 64 bits, patches inside patches, positions out
# of order). A failed chunk is decoded again by `decoding.decode_chunk`, which then decodes it or
# raises its precise ValueError; so a kernel may fail where the reference would not, never the
# reverse. Every read is checked against `end` first: numba does not bounds-check.

_FAIL = -1


@kernel
def _read_uvarint(buf: U8, pos: int, end: int) -> tuple[np.uint64, int]:
    """`encoding._Reader.uvarint`, failing also where the value needs more than 64 bits."""
    result = _U0
    shift = 0
    while pos >= 0:
        if pos >= end:
            return _U0, _FAIL
        b = np.uint64(buf[pos])
        pos += 1
        if shift == 63 and b > _U1:  # more than 64 bits, or too long
            return _U0, _FAIL
        result |= (b & _U0x7F) << np.uint64(shift)
        if b < _U0x80:
            return result, pos
        shift += 7
    return _U0, _FAIL


@kernel
def _read_svarint(buf: U8, pos: int, end: int) -> tuple[np.uint64, int]:
    """`encoding._Reader.svarint` (zigzag), as the uint64 of its int64 (any uint64 is in range)."""
    u, pos = _read_uvarint(buf, pos, end)
    return (u >> _U1) ^ (_U0 - (u & _U1)), pos


@kernel
def _unpack(buf: U8, pos: int, end: int, out: U64, width: int) -> int:
    """`encoding._bitunpack` of len(out) values `width` bits wide (little-endian) into out."""
    n = len(out)
    size = (n * width + 7) // 8
    if pos < 0 or size > end - pos:
        return _FAIL
    if width == 0:
        out[:] = _U0
        return pos
    mask = ~_U0 if width == 64 else (_U1 << np.uint64(width)) - _U1
    stop = pos + size
    q = pos
    acc = _U0
    used = 0  # bits held in acc, below width when more are loaded
    for i in range(n):
        if used >= width:
            out[i] = acc & mask
            acc = acc >> np.uint64(width) if width < 64 else _U0
            used -= width
            continue
        take = min(8, stop - q)  # the payload holds the n * width bits, so this suffices
        nxt = _U0
        for j in range(take):
            nxt |= np.uint64(buf[q + j]) << np.uint64(8 * j)
        q += take
        out[i] = (acc | (nxt << np.uint64(used))) & mask
        rest = width - used  # bits of nxt this value took
        acc = nxt >> np.uint64(rest) if rest < 64 else _U0
        used = 8 * take - rest
    return stop


@kernel
def _read_head(buf: U8, pos: int, end: int) -> tuple[int, np.uint64, np.uint64, bool, int]:
    """An int stream's head, base and gcd (`encoding._get_ints`): (width, base, gcd, patched,
    pos). Fails on a zstd payload and where the reference raises."""
    head, pos = _read_uvarint(buf, pos, end)
    width = np.int64(head & _U0x7F)
    if pos < 0 or width > 64 or head >> np.uint64(10) or head & _U0x80:
        return 0, _U0, _U0, False, _FAIL
    base, pos = _read_svarint(buf, pos, end)
    g = _U1
    if head & np.uint64(0x100):
        g, pos = _read_uvarint(buf, pos, end)
    return width, base, g, bool(head & np.uint64(0x200)), pos


@kernel
def _finish(out: U64, base: np.uint64, g: np.uint64) -> None:
    """u * gcd + base, wrapping as the reference's uint64 arithmetic does."""
    if g > _U1:
        for i in range(len(out)):
            out[i] *= g
    for i in range(len(out)):
        out[i] += base


@kernel
def _read_plain(buf: U8, pos: int, end: int, out: U64) -> int:
    """`encoding._get_ints` of a stream without patches (patch positions and high bits: the
    encoder never patches those; a stream that does is left to the reference)."""
    width, base, g, patched, pos = _read_head(buf, pos, end)
    if pos < 0 or patched:
        return _FAIL
    pos = _unpack(buf, pos, end, out, width)
    _finish(out, base, g)
    return pos


@kernel
def _read_ints(buf: U8, pos: int, end: int, out: U64) -> int:
    """`encoding._get_ints`: an int stream of len(out) values, patches included."""
    n = len(out)
    width, base, g, patched, pos = _read_head(buf, pos, end)
    if pos < 0:
        return _FAIL
    if patched:
        count, pos = _read_uvarint(buf, pos, end)
        if pos < 0 or count == _U0 or count > np.uint64(n) or width >= 64:
            return _FAIL
        m = np.int64(count)
        where = np.empty(m, np.uint64)  # `_get_diffs(r, count, 1)`: a seed, then the deltas
        seed, pos = _read_svarint(buf, pos, end)
        where[0] = seed
        if pos < 0:
            return _FAIL
        pos = _read_plain(buf, pos, end, where[1:])
        high = np.empty(m, np.uint64)
        pos = _read_plain(buf, pos, end, high)
        if pos < 0:
            return _FAIL
        for j in range(1, m):
            where[j] += where[j - 1]
        for j in range(m):  # in range and strictly increasing (the reference allows repeats)
            if np.int64(where[j]) < 0 or where[j] >= np.uint64(n):
                return _FAIL
            if j and where[j] <= where[j - 1]:
                return _FAIL
        pos = _unpack(buf, pos, end, out, width)
        if pos < 0:
            return _FAIL
        for j in range(m):
            out[where[j]] |= high[j] << np.uint64(width)
    else:
        pos = _unpack(buf, pos, end, out, width)
    _finish(out, base, g)
    return pos


@kernel
def _read_diffs(buf: U8, pos: int, end: int, out: U64, order: int) -> int:
    """`encoding._get_diffs`: min(order, n) seeds, the int stream of the order-th differences,
    summed back (wrapping, as the reference's int64 cumsum)."""
    n = len(out)
    k = min(order, n)
    for i in range(k):
        seed, pos = _read_svarint(buf, pos, end)
        out[i] = seed
    if pos < 0:
        return _FAIL
    pos = _read_ints(buf, pos, end, out[k:])
    for o in range(k, 0, -1):  # the last seed's sum first, as `encoding._undiff`
        for i in range(o, n):
            out[i] += out[i - 1]
    return pos


@kernel
def _read_decimal(buf: U8, pos: int, end: int, x: F64, bits: U64, k: U64) -> int:
    """`encoding._get_decimal`: k / 10**e, then the exceptions' raw bits."""
    n = len(x)
    if pos < 0 or end - pos < 2:
        return _FAIL
    e, order = buf[pos], buf[pos + 1]
    if e > _MAX_EXP or order > 2:
        return _FAIL
    pos = _read_diffs(buf, pos + 2, end, k, order)
    if pos < 0:
        return _FAIL
    p = _POW10[e]
    for i in range(n):
        x[i] = np.float64(np.int64(k[i])) / p
    count, pos = _read_uvarint(buf, pos, end)
    if pos < 0 or count > np.uint64(n):
        return _FAIL
    m = np.int64(count)
    if m == 0:
        return pos
    where = k[:m]  # k is spent: it holds the positions now
    pos = _read_diffs(buf, pos, end, where, 1)
    if pos < 0 or 8 * m > end - pos:
        return _FAIL
    for j in range(m):
        if np.int64(where[j]) < 0 or where[j] >= np.uint64(n):
            return _FAIL
        if j and where[j] <= where[j - 1]:
            return _FAIL
    for j in range(m):
        v = _U0
        for b in range(8):
            v |= np.uint64(buf[pos + b]) << np.uint64(8 * b)
        bits[where[j]] = v  # raw bits: NaN payloads survive
        pos += 8
    return pos


@kernel
def _read_xor(buf: U8, pos: int, end: int, bits: U64) -> int:
    """`encoding._get_xor` without zstd: the 8 byte planes of x[i] XOR x[i - 1]."""
    n = len(bits)
    if pos < 0 or end - pos < 1 + 8 * n or buf[pos] != 0:
        return _FAIL
    pos += 1
    acc = _U0
    for i in range(n):
        xo = _U0
        for b in range(8):
            xo |= np.uint64(buf[pos + b * n + i]) << np.uint64(8 * b)
        acc ^= xo
        bits[i] = acc
    return pos + 8 * n


@kernel
def _chunk_size(buf: U8, pos: int, end: int) -> tuple[int, int]:
    """A chunk's version and sample count (`encoding.decode_chunk`): (n, position after them),
    n 0 where the kernels leave the chunk to the reference: a bad header, or more samples than
    its bytes make plausible (bounding what corrupt headers make the batch allocate)."""
    if end - pos < 1 or buf[pos] != VERSION:
        return 0, _FAIL
    n, at = _read_uvarint(buf, pos + 1, end)
    if at < 0 or n < _U1 or n > np.uint64(MAX_SAMPLES) or n > np.uint64(8 * (end - pos) + 256):
        return 0, _FAIL
    return np.int64(n), at


@kernel
def _decode_all(buf: U8, starts: I64) -> tuple[I64, F64, I64, I8]:
    """`encoding.decode_chunk` of each chunk buf[starts[c]:starts[c + 1]], concatenated. Returns
    (timestamps, values, each chunk's offset in them, its flag: 1 for the reference to finish)."""
    s = len(starts) - 1
    off = np.zeros(s + 1, np.int64)
    flags = np.zeros(s, np.int8)
    longest = 0
    for c in range(s):
        n, _ = _chunk_size(buf, starts[c], starts[c + 1])
        off[c + 1] = off[c] + n
        longest = max(longest, n)
        if n == 0:
            flags[c] = 1
    ts = np.empty(off[s], np.int64)
    x = np.empty(off[s], np.float64)
    ts_u = ts.view(np.uint64)
    bits = x.view(np.uint64)
    k = np.empty(longest, np.uint64)
    for c in range(s):
        if flags[c]:
            continue
        a, b, end = off[c], off[c + 1], starts[c + 1]
        n, pos = _chunk_size(buf, starts[c], end)
        order = buf[pos] if pos < end else 0
        if order != 1 and order != 2:
            flags[c] = 1
            continue
        pos = _read_diffs(buf, pos + 1, end, ts_u[a:b], order)
        if pos < 0 or pos >= end:
            flags[c] = 1
            continue
        mode = buf[pos]
        if mode == 0:  # DECIMAL
            pos = _read_decimal(buf, pos + 1, end, x[a:b], bits[a:b], k[:n])
        elif mode == 1:  # XOR
            pos = _read_xor(buf, pos + 1, end, bits[a:b])
        else:
            pos = _FAIL
        if pos != end:  # failed, or trailing bytes
            flags[c] = 1
    return ts, x, off, flags


def decode_chunks(
    datas: Sequence[bytes],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Decode many chunks at once: (timestamps, values, bounds), chunk i's samples at
    [bounds[i]:bounds[i + 1]], bit for bit `encoding.decode_chunk` of each concatenated.
    A corrupt chunk raises `decode_chunk`'s ValueError (the first such chunk in order)."""
    sizes = np.fromiter(map(len, datas), np.int64, len(datas))
    starts = np.zeros(len(datas) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    buf = np.frombuffer(b"".join(datas), np.uint8)
    ts, x, off, flags = _decode_all(buf, starts)
    redo = np.flatnonzero(flags).tolist()
    if not redo:
        return ts, x, off
    fixed = {c: decode_chunk(datas[c]) for c in redo}  # raises for a corrupt chunk
    if all(len(fixed[c][0]) == off[c + 1] - off[c] for c in redo):  # their places are reserved
        for c, (t, v) in fixed.items():
            ts[off[c] : off[c + 1]], x[off[c] : off[c + 1]] = t, v
        return ts, x, off
    ts_parts, val_parts = [], []
    lengths = np.diff(off)
    at = 0
    for c in redo:  # the kernels' runs between the redone chunks, and the redone chunks
        ts_parts += [ts[off[at] : off[c]], fixed[c][0]]
        val_parts += [x[off[at] : off[c]], fixed[c][1]]
        lengths[c] = len(fixed[c][0])
        at = c + 1
    ts_parts.append(ts[off[at] :])
    val_parts.append(x[off[at] :])
    bounds = np.zeros(len(datas) + 1, np.int64)
    np.cumsum(lengths, out=bounds[1:])
    return np.concatenate(ts_parts), np.concatenate(val_parts), bounds


@warms
def _warm() -> None:
    """One chunk of each kind a flush meets, for `core.jit.warm`."""
    ts = np.arange(0, 40_000, 1000, dtype=np.int64)
    chunks = encode_chunks(ts, np.linspace(0, 1, len(ts)), np.array([0, 20, 40]))
    decode_chunks(chunks)
