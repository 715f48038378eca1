"""Open-buffer snapshots: a flush group's unsealed samples, as one blob per checkpoint.

Chunks are written only once sealed (full, or their time bucket over), so they stay large; the
samples still in open buffers are covered by a snapshot of the whole group written with each
checkpoint instead (docs/memstore.md, "Flushing"). One blob for all of a group's series, encoded
in one vectorised pass (NumPy over every sample, then one zstd frame): its cost is per sample, and
a crash replays at most one flush interval of Kafka on top of it.

Layout (version 1): ``b"FOB1" | zstd frame of``
``u32 n | u32 keys_len | keys (UTF-8, "\\n"-joined part keys) | i64 first_ts[n] | i64 len[n] |``
``i64 ts deltas (a series' first sample raw) | u64 value XOR deltas, as 8 byte planes``.
Part keys are compact JSON, which never holds a raw newline.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import zstandard

MAGIC = b"FOB1"
_HEAD = struct.Struct("<II")
_LEVEL = 1  # the blob is rewritten every flush: speed over ratio
I64 = np.int64


@dataclass(frozen=True, slots=True)
class OpenBuffers:
    """Series i's open samples are `ts[bounds[i]:bounds[i + 1]]` (strictly increasing), with
    `first_ts[i]` its first sample ever (its part key's start, which a new series has not
    written yet)."""

    part_keys: list[str]
    first_ts: npt.NDArray[np.int64]
    bounds: npt.NDArray[np.int64]
    ts: npt.NDArray[np.int64]
    vals: npt.NDArray[np.float64]

    @property
    def samples(self) -> int:
        return len(self.ts)


def encode_open_buffers(ob: OpenBuffers) -> bytes:
    n, total = len(ob.part_keys), len(ob.ts)
    if len(ob.first_ts) != n or len(ob.bounds) != n + 1 or len(ob.vals) != total:
        raise ValueError("open buffers: part keys, first_ts, bounds and samples disagree")
    keys = "\n".join(ob.part_keys).encode()
    starts = ob.bounds[:-1]
    ts = np.asarray(ob.ts, I64)
    dts = np.empty(total, I64)
    if total:
        dts[0] = ts[0]
        np.subtract(ts[1:], ts[:-1], out=dts[1:])
        dts[starts[starts < total]] = ts[starts[starts < total]]
    bits = np.asarray(ob.vals, np.float64).view(np.uint64)
    xor = bits.copy()
    if total:
        np.bitwise_xor(bits[1:], bits[:-1], out=xor[1:])
        xor[starts[starts < total]] = bits[starts[starts < total]]
    planes = xor.view(np.uint8).reshape(total, 8).T.tobytes()
    payload = b"".join(
        (
            _HEAD.pack(n, len(keys)),
            keys,
            np.asarray(ob.first_ts, I64).tobytes(),
            np.diff(ob.bounds).astype(I64).tobytes(),
            dts.tobytes(),
            planes,
        )
    )
    return MAGIC + zstandard.ZstdCompressor(level=_LEVEL).compress(payload)


def decode_open_buffers(data: bytes) -> OpenBuffers:
    if data[:4] != MAGIC:
        raise ValueError(f"not an open-buffer snapshot (magic {data[:4]!r})")
    payload = zstandard.ZstdDecompressor().decompress(data[4:])
    n, keys_len = _HEAD.unpack_from(payload)
    pos = _HEAD.size
    keys = payload[pos : pos + keys_len].decode()
    pos += keys_len
    part_keys = keys.split("\n") if n else []
    first_ts = np.frombuffer(payload, I64, n, pos).copy()
    pos += 8 * n
    lengths = np.frombuffer(payload, I64, n, pos)
    pos += 8 * n
    bounds = np.zeros(n + 1, I64)
    np.cumsum(lengths, out=bounds[1:])
    total = int(bounds[-1])
    dts = np.frombuffer(payload, I64, total, pos)
    pos += 8 * total
    planes = np.frombuffer(payload, np.uint8, 8 * total, pos)
    if len(part_keys) != n or pos + 8 * total != len(payload):
        raise ValueError("open-buffer snapshot is truncated or corrupt")
    starts = bounds[:-1][lengths > 0]
    # undo the deltas per series: a running sum restarted at each series' raw first sample
    ts = np.cumsum(dts)
    if len(starts) > 1:
        ts -= np.repeat(ts[starts] - dts[starts], lengths[lengths > 0])
    xor = planes.reshape(8, total).T.copy().view(np.uint64).ravel()
    bits = np.bitwise_xor.accumulate(xor) if total else xor
    if len(starts) > 1:
        # the XOR running value restarts at each series' first sample in the same way
        prev = np.bitwise_xor(bits[starts], xor[starts])
        bits = np.bitwise_xor(bits, np.repeat(prev, lengths[lengths > 0]))
    return OpenBuffers(part_keys, first_ts, bounds, ts.astype(I64), bits.view(np.float64))
