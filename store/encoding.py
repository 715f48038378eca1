"""Chunk codec: int64 millisecond timestamps and float64 values, bit-exact, NumPy-vectorised.

Layout (version 1). `uvarint` is LEB128, `svarint` zigzag LEB128, fixed-width fields little-endian:

    u8 version=1 | uvarint n | timestamps | values

timestamps: u8 order (1 or 2) | `order` svarint seeds | int stream of the order-th differences.
    Seeds are t[0] (and t[1]-t[0]); a steady scrape interval makes deltas nearly constant and
    delta-of-deltas nearly 0. The encoder keeps whichever order packs smaller (jitter favours
    deltas, a drifting interval delta-of-deltas).
values, one of two modes; the encoder picks the smaller:
    u8 0 (DECIMAL) | u8 e | u8 order (0..2) | seeds | int stream | exceptions.
        Most real values are decimals with few digits (counters, byte counts, percentages): for
        them x == k / 10**e exactly for integers k (IEEE division is correctly rounded), the idea
        of ALP. k, or its deltas (counters) or delta-of-deltas (steady rates), is stored as an int
        stream. Values no exponent reproduces bit for bit (NaN, infinities, -0.0, long mantissas)
        are exceptions: uvarint count, positions (svarint seed + int stream of deltas), then
        their raw 8-byte patterns, so NaN payloads survive.
    u8 1 (XOR) | u8 zstd? | payload: x[i] XOR x[i-1] as in Gorilla, its 8 byte planes
        transposed (sign/exponent planes are mostly zero), zstd-compressed if that is smaller.
int stream: uvarint head (width | zstd << 7 | gcd << 8 | patched << 9) | svarint base
    | [uvarint gcd] | [patches] | payload.
    Patched frame of reference: u = (v - base) / gcd is bit-packed at `width` bits per value
    (0 bits when all equal), width chosen to minimise size; the few values wider than that (a gap
    in the scrapes, a counter reset) keep their low bits in place and list their high bits as
    patches: uvarint count, positions (svarint seed + int stream of deltas), int stream of high
    bits. With the zstd flag the packed bytes are a magicless zstd frame after its uvarint length.

This module is the reference: NumPy, chunk by chunk, the format's every rule in one place.
Its fast path is `encoding_fast.encode_chunks` (a flush: thousands of chunks at once), compiled
loops that write the same bytes (tests/stores/test_encoding_batch.py compares them); decoding
has no fast path (queries decode chunk by chunk, through a cache: store/api.py).

Differences wrap around int64, so any int64 timestamps round-trip. Timestamps must be strictly
increasing: the encoder rejects equal or out-of-order ones (ValueError) rather than guess which
duplicate wins; ordering and deduplication are the ingester's policy.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import zstandard

VERSION = 1
MAX_SAMPLES = 1 << 24  # bounds what a corrupt header can make the decoder allocate
_DECIMAL, _XOR = 0, 1
_MAX_EXP = 18  # 10**e is exact in float64 up to e = 22; beyond 18 nothing fits 53 bits anyway
_POW10 = np.array([10.0**e for e in range(_MAX_EXP + 1)])
_MAX_EXACT = float(1 << 53)
_MIN_ZSTD_INPUT = 24  # below this zstd's frame overhead always loses
_PATCH_BITS = 16  # estimated cost of one patch besides its high bits (position, overheads)
_SMALL = 8  # below this many values: no patches, and difference orders chosen by exact size
_MASK64 = (1 << 64) - 1
_MAGICLESS = zstandard.FORMAT_ZSTD1_MAGICLESS

U64 = np.uint64
I64 = np.int64
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


# ---------------------------------------------------------------------------------- zstd, varint


class _Zstd(threading.local):
    """zstd (de)compressors must not be shared between threads: one pair per thread."""

    def __init__(self) -> None:
        params = zstandard.ZstdCompressionParameters.from_level(
            6,
            format=zstandard.FORMAT_ZSTD1_MAGICLESS,
            write_checksum=0,
            write_content_size=0,
            write_dict_id=0,
        )
        self.c = zstandard.ZstdCompressor(compression_params=params)
        self.d = zstandard.ZstdDecompressor(format=zstandard.FORMAT_ZSTD1_MAGICLESS)


_zstd = _Zstd()


def _maybe_zstd(payload: bytes) -> bytes | None:
    """The zstd frame of payload if that is smaller (counting its length prefix), else None."""
    if len(payload) < _MIN_ZSTD_INPUT:
        return None
    packed = _zstd.c.compress(payload)
    return packed if len(packed) + 2 < len(payload) else None


def _unzstd(frame: bytes, size: int) -> bytes:
    try:
        # Frames are written without their size; zstandard would allocate whatever size a
        # garbled header declares (MemoryError), so such a header is refused first.
        declared = zstandard.get_frame_parameters(frame, format=_MAGICLESS).content_size
        if declared not in (zstandard.CONTENTSIZE_UNKNOWN, size):
            raise ValueError("corrupt chunk: compressed payload declares the wrong size")
        out = _zstd.d.decompress(frame, max_output_size=size)
    except zstandard.ZstdError as e:
        raise ValueError(f"corrupt chunk: {e}") from e
    if len(out) != size:
        raise ValueError("corrupt chunk: compressed payload has the wrong size")
    return out


def _uvarint(v: int, out: bytearray) -> None:
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _svarint(v: int, out: bytearray) -> None:
    _uvarint(-2 * v - 1 if v < 0 else 2 * v, out)


class _Reader:
    """A cursor over an encoded chunk; every read is bounds-checked."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError("corrupt chunk: truncated")
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def u8(self) -> int:
        return self.take(1)[0]

    def uvarint(self) -> int:
        shift = result = 0
        while True:
            b = self.u8()
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7
            if shift > 63:
                raise ValueError("corrupt chunk: varint too long")

    def svarint(self) -> int:
        u = self.uvarint()
        v = -((u + 1) >> 1) if u & 1 else u >> 1
        if not -(1 << 63) <= v < 1 << 63:
            raise ValueError("corrupt chunk: varint out of int64 range")
        return v


# ----------------------------------------------------------------------------------- int streams


def _bitpack(u: npt.NDArray[np.uint64], width: int) -> bytes:
    """The low `width` bits of each value, concatenated little-endian."""
    if width == 0 or len(u) == 0:
        return b""
    if width in (8, 16, 32, 64):
        return u.astype(f"<u{width // 8}").tobytes()  # astype keeps the low bits
    bits = (u[:, None] >> np.arange(width, dtype=U64)) & U64(1)
    return np.packbits(bits.astype(np.uint8), bitorder="little").tobytes()


def _bitunpack(buf: bytes, n: int, width: int) -> npt.NDArray[np.uint64]:
    if width == 0 or n == 0:
        return np.zeros(n, dtype=U64)
    if len(buf) != (n * width + 7) // 8:
        raise ValueError("corrupt chunk: packed length mismatch")
    if width in (8, 16, 32, 64):
        return np.frombuffer(buf, dtype=f"<u{width // 8}").astype(U64)
    raw = np.frombuffer(buf, dtype=np.uint8)
    bits = np.unpackbits(raw, count=n * width, bitorder="little").reshape(n, width)
    return (bits.astype(U64) << np.arange(width, dtype=U64)).sum(axis=1, dtype=U64)


@dataclass(slots=True)
class _Plan:
    """How an int stream will be packed, and its estimated size in bits."""

    base: int
    gcd: int
    u: npt.NDArray[np.uint64]
    width: int
    patches: npt.NDArray[np.intp]
    bits: int


def _plan(v: IntArray, patch: bool = True) -> _Plan:
    n = len(v)
    if n == 0:
        return _Plan(0, 1, np.zeros(0, dtype=U64), 0, np.zeros(0, dtype=np.intp), 16)
    base = int(v.min())
    u = v.view(U64) - U64(base & _MASK64)  # wraps: the exact unsigned distance to the minimum
    g = int(np.gcd.reduce(u))
    if g > 1:
        u = u // U64(g)
    top = int(u.max()).bit_length()
    width, bits = top, n * top
    if patch and top > 0 and n >= _SMALL:
        # Bit lengths (float exponents; may overshoot by one above 2**53, only guiding the choice).
        lengths = np.frexp(u.astype(np.float64))[1]
        above = n - np.cumsum(np.bincount(lengths, minlength=top + 1))[: top + 1]
        w = np.arange(top + 1)
        cost = n * w + above * (top - w + _PATCH_BITS) + np.where(above > 0, 32, 0)
        width = int(np.argmin(cost))
        bits = int(cost[width])
    patches = np.zeros(0, dtype=np.intp)
    if width < top:
        patches = np.flatnonzero(u >> U64(width))
    return _Plan(base, max(g, 1), u, width, patches, bits + 16 + (8 if g > 1 else 0))


def _write_plan(p: _Plan, out: bytearray) -> None:
    payload = _bitpack(p.u, p.width)
    # Entropy coding only finds structure in whole bytes; sub-byte packing defeats it.
    packed = _maybe_zstd(payload) if p.width % 8 == 0 else None
    has_patches = len(p.patches) > 0
    head = p.width | (packed is not None) << 7 | (p.gcd > 1) << 8 | has_patches << 9
    _uvarint(head, out)
    _svarint(p.base, out)
    if p.gcd > 1:
        _uvarint(p.gcd, out)
    if has_patches:
        _uvarint(len(p.patches), out)
        _put_diffs(p.patches.astype(I64), 1, out, patch=False)
        high = p.u[p.patches] >> U64(p.width)
        _write_plan(_plan(high.view(I64), patch=False), out)
    if packed is not None:
        _uvarint(len(packed), out)
        out += packed
    else:
        out += payload


def _get_ints(r: _Reader, n: int) -> IntArray:
    head = r.uvarint()
    width = head & 0x7F
    if width > 64 or head >> 10:
        raise ValueError("corrupt chunk: bad int stream header")
    base = r.svarint()
    g = r.uvarint() if head & 0x100 else 1
    patches = high = None
    if head & 0x200:
        count = r.uvarint()
        if not 0 < count <= n or width >= 64:
            raise ValueError("corrupt chunk: bad patch count")
        patches = _get_diffs(r, count, 1)
        high = _get_ints(r, count).view(U64)
        if patches.min() < 0 or patches.max() >= n:
            raise ValueError("corrupt chunk: patch position out of range")
    size = (n * width + 7) // 8
    payload = _unzstd(r.take(r.uvarint()), size) if head & 0x80 else r.take(size)
    u = _bitunpack(payload, n, width)
    if patches is not None and high is not None:
        u[patches] |= high << U64(width)
    if g > 1:
        u *= U64(g & _MASK64)
    return (u + U64(base & _MASK64)).view(I64)


def _diff(v: IntArray, order: int) -> tuple[list[int], IntArray]:
    """Seeds (the first element of each successive difference) and the order-th differences."""
    seeds = []
    for _ in range(order):
        if len(v) == 0:
            break
        seeds.append(int(v[0]))
        v = np.diff(v)  # int64 arithmetic wraps, and the inverse cumsum wraps back
    return seeds, v


def _undiff(seeds: list[int], d: IntArray) -> IntArray:
    for s in reversed(seeds):
        d = np.concatenate((np.array([s], dtype=I64), d)).cumsum(dtype=I64)
    return d


def _put_best_diffs(v: IntArray, orders: range, out: bytearray) -> None:
    """`u8 order | seeds | int stream` for the difference order (of `orders`) that packs smallest.

    Under `_SMALL` values each candidate is written and the shortest kept (the first of equals):
    exact, and cheap on a few values. From `_SMALL` on the candidates are sized together on their
    common tail by the patched cost model (one set of array operations for all of them, no gcd),
    and only the winner is written."""
    if len(v) < _SMALL:
        best = bytearray()
        for o in orders:
            cand = bytearray((o,))
            _put_diffs(v, o, cand)
            if not best or len(cand) < len(best):
                best = cand
        out += best
        return
    cands = [_diff(v, o)[1] for o in orders]
    m = len(cands[-1])
    d = np.stack([c[len(c) - m :] for c in cands]).view(U64)
    d = d - d.view(I64).min(axis=1, keepdims=True).view(U64)
    lengths = np.frexp(d.astype(np.float64))[1]
    top = lengths.max(axis=1, keepdims=True)
    w = np.arange(int(top.max()) + 1)
    above = (lengths[:, :, None] > w).sum(axis=1)
    cost = m * w + above * (top - w + _PATCH_BITS) + np.where(above > 0, 32, 0)
    order = orders[int(np.argmin(cost.min(axis=1)))]
    out.append(order)
    _put_diffs(v, order, out)


def _put_diffs(v: IntArray, order: int, out: bytearray, patch: bool = True) -> None:
    seeds, d = _diff(v, order)
    for s in seeds:
        _svarint(s, out)
    _write_plan(_plan(d, patch), out)


def _get_diffs(r: _Reader, n: int, order: int) -> IntArray:
    k = min(order, n)
    seeds = [r.svarint() for _ in range(k)]
    return _undiff(seeds, _get_ints(r, n - k))


# --------------------------------------------------------------------------------------- values


def _find_decimal(x: FloatArray) -> tuple[int, IntArray, npt.NDArray[np.bool_]]:
    """The exponent e with the fewest exceptions, the integers k and the exception mask.

    Stops at the first e where only values no exponent can represent (NaN, infinities, -0.0)
    are exceptions."""
    bits = x.view(U64)
    finite = np.isfinite(x)
    hopeless = int(np.count_nonzero(~finite | (bits == U64(1 << 63))))
    best: tuple[int, IntArray, npt.NDArray[np.bool_]] | None = None
    best_exc = len(x) + 1
    with np.errstate(all="ignore"):
        for e in range(_MAX_EXP + 1):
            p = _POW10[e]
            scaled = x * p
            ok = finite & (np.abs(scaled) < _MAX_EXACT)
            if not ok.any():
                break
            k = np.rint(np.where(ok, scaled, 0.0)).astype(I64)
            exact = ok & ((k.astype(np.float64) / p).view(U64) == bits)
            exc = len(x) - int(np.count_nonzero(exact))
            if exc < best_exc:
                best, best_exc = (e, k, ~exact), exc
                if exc == hopeless:
                    break
    if best is None:
        return 0, np.zeros(len(x), dtype=I64), np.ones(len(x), dtype=np.bool_)
    return best


def _put_decimal(x: FloatArray, out: bytearray) -> None:
    e, k, exc = _find_decimal(x)
    if exc.any():
        # An exception takes its predecessor's integer, keeping differences small.
        idx = np.where(exc, 0, np.arange(len(k)))
        np.maximum.accumulate(idx, out=idx)
        k = np.where(exc[idx], 0, k[idx])
    out += bytes((_DECIMAL, e))
    # Raw integers suit noisy gauges, deltas counters, delta-of-deltas steady rates.
    _put_best_diffs(k, range(3), out)
    pos = np.flatnonzero(exc).astype(I64)
    _uvarint(len(pos), out)
    if len(pos):
        _put_diffs(pos, 1, out, patch=False)
        out += x.view(U64)[pos].astype("<u8").tobytes()


def _get_decimal(r: _Reader, n: int) -> FloatArray:
    e, order = r.u8(), r.u8()
    if e > _MAX_EXP or order > 2:
        raise ValueError("corrupt chunk: bad decimal header")
    x = _get_diffs(r, n, order).astype(np.float64) / _POW10[e]
    count = r.uvarint()
    if count:
        if count > n:
            raise ValueError("corrupt chunk: too many exceptions")
        pos = _get_diffs(r, count, 1)
        if pos.min() < 0 or pos.max() >= n:
            raise ValueError("corrupt chunk: exception position out of range")
        x.view(U64)[pos] = np.frombuffer(r.take(8 * count), dtype="<u8")  # keeps NaN payloads
    return x


def _put_xor(x: FloatArray, out: bytearray) -> None:
    u = x.view(U64)
    xo = u ^ np.concatenate((np.zeros(1, dtype=U64), u[:-1]))
    planes = np.ascontiguousarray(xo.astype("<u8").view(np.uint8).reshape(-1, 8).T).tobytes()
    packed = _maybe_zstd(planes)
    out += bytes((_XOR, packed is not None))
    if packed is not None:
        _uvarint(len(packed), out)
        out += packed
    else:
        out += planes


def _get_xor(r: _Reader, n: int) -> FloatArray:
    planes = _unzstd(r.take(r.uvarint()), 8 * n) if r.u8() else r.take(8 * n)
    xo = np.frombuffer(planes, dtype=np.uint8).reshape(8, n).T.copy().view("<u8").ravel()
    return np.bitwise_xor.accumulate(xo.astype(U64)).view(np.float64)


# ---------------------------------------------------------------------------- other records


class HeadReader:
    """Reads the uvarints at the head of a record other than a chunk (store/downsample.py,
    bounds-checked like a chunk's), then hands over the rest."""

    def __init__(self, data: bytes) -> None:
        self._r = _Reader(bytes(data))

    def uvarint(self) -> int:
        return self._r.uvarint()

    def rest(self) -> bytes:
        return self._r.buf[self._r.pos :]


uvarint = _uvarint


def _put_values(x: FloatArray, out: bytearray) -> None:
    """Decimal mode, or XOR where that is smaller (full-precision floats)."""
    vals = bytearray()
    _put_decimal(x, vals)
    if len(vals) > 4 * len(x):  # a poor decimal fit (e.g. full-precision floats): try XOR too
        xor = bytearray()
        _put_xor(x, xor)
        if len(xor) < len(vals):
            vals = xor
    out += vals


def _get_values(r: _Reader, n: int) -> FloatArray:
    mode = r.u8()
    if mode == _DECIMAL:
        return _get_decimal(r, n)
    if mode == _XOR:
        return _get_xor(r, n)
    raise ValueError(f"corrupt chunk: unknown value mode {mode}")


# ---------------------------------------------------------------------------------------- chunks


def encode_chunk(timestamps: npt.ArrayLike, values: npt.ArrayLike) -> bytes:
    """Encode samples: int64 ms timestamps, strictly increasing, and float64 values."""
    ts = np.asarray(timestamps)
    if ts.ndim != 1 or (ts.dtype.kind not in "iu" and len(ts)):
        raise ValueError(f"timestamps must be a 1-d integer array, got {ts.dtype} {ts.shape}")
    if ts.dtype.kind == "u" and len(ts) and int(ts.max()) > (1 << 63) - 1:
        raise ValueError("timestamps must fit int64")
    ts = ts.astype(I64)
    x = np.asarray(values, dtype=np.float64)
    if x.shape != ts.shape:
        raise ValueError(f"{len(ts)} timestamps but values of shape {x.shape}")
    n = len(ts)
    if not 1 <= n <= MAX_SAMPLES:
        raise ValueError(f"a chunk holds 1 to {MAX_SAMPLES} samples, got {n}")
    bad = np.flatnonzero(ts[1:] <= ts[:-1])
    if len(bad):
        i = int(bad[0]) + 1
        raise ValueError(
            f"timestamps must be strictly increasing: ts[{i}]={ts[i]} after ts[{i - 1}]={ts[i - 1]}"
        )
    out = bytearray((VERSION,))
    _uvarint(n, out)
    _put_best_diffs(ts, range(1, 3), out)
    _put_values(x, out)
    return bytes(out)


def decode_chunk(data: bytes) -> tuple[IntArray, FloatArray]:
    """Decode a chunk into (int64 timestamps, float64 values); ValueError if it is corrupt."""
    r = _Reader(bytes(data))
    version = r.u8()
    if version != VERSION:
        raise ValueError(f"unsupported chunk version {version}")
    n = r.uvarint()
    if not 1 <= n <= MAX_SAMPLES:
        raise ValueError(f"corrupt chunk: bad sample count {n}")
    order = r.u8()
    if order not in (1, 2):
        raise ValueError("corrupt chunk: bad timestamp order")
    ts = _get_diffs(r, n, order)
    x = _get_values(r, n)
    if r.pos != len(r.buf):
        raise ValueError("corrupt chunk: trailing bytes")
    return ts, x
