"""Independent re-implementations used as test oracles, plus small factories and fakes."""

from __future__ import annotations

from filopy import Dataset, DatasetRef

_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M, 13) * _P1) & _M


def xxh32_reference(data: bytes, seed: int) -> int:
    """XXH32 straight from the algorithm description (unsigned), to cross-check the C library."""
    n, i = len(data), 0
    if n >= 16:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed, (seed - _P1) & _M]
        while i + 16 <= n:
            for j in range(4):
                v[j] = _round(v[j], int.from_bytes(data[i + 4 * j : i + 4 * j + 4], "little"))
            i += 16
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 4 <= n:
        h = (_rotl((h + int.from_bytes(data[i : i + 4], "little") * _P3) & _M, 17) * _P4) & _M
        i += 4
    while i < n:
        h = (_rotl((h + data[i] * _P5) & _M, 11) * _P1) & _M
        i += 1
    h = ((h ^ (h >> 15)) * _P2) & _M
    h = ((h ^ (h >> 13)) * _P3) & _M
    return h ^ (h >> 16)


def to_int32(x: int) -> int:
    x &= _M
    return x - (1 << 32) if x >= 1 << 31 else x


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (over UTF-16 code units), as FiloDB's specs use it."""
    units = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & _M
    return to_int32(h)


def dataset(
    name: str = "prom", num_shards: int = 8, min_num_nodes: int = 2, **kw: object
) -> Dataset:
    return Dataset(name=name, num_shards=num_shards, min_num_nodes=min_num_nodes, **kw)


def ref(name: str = "prom") -> DatasetRef:
    return DatasetRef(name=name)


class Clock:
    """A monotonic clock the test moves by hand (`clock.now += 5`)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
