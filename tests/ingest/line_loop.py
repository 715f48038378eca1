"""Line protocol's reference for the tests: `decode_influx` with its fast path (the column path)
off, so the parser decides every line (the fast path must give exactly what it gives)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from ingest.batch import IntKeyedBatch, KeyedBatch, SampleBatch
from ingest.wire import line_protocol


@contextmanager
def line_loop_only() -> Iterator[None]:
    """decode_influx with its column path off: the reference decides every line."""
    columns = line_protocol._decode_columns
    line_protocol._decode_columns = lambda *_: False  # type: ignore[assignment]
    try:
        yield
    finally:
        line_protocol._decode_columns = columns


def keyed_alike(x: SampleBatch, y: SampleBatch) -> None:
    """Both batches keyed (the gateway finds their series by key) or neither; a column path
    batch's int64 keys (`IntKeyedBatch`) equal to its key list."""
    assert isinstance(x, KeyedBatch) == isinstance(y, KeyedBatch)
    for b in (x, y):
        if isinstance(b, IntKeyedBatch):
            assert b.key_array.dtype == np.int64 and b.key_array.tolist() == b.keys
