"""Prometheus's staleness marker: the one NaN bit pattern that says "this series ended here".

A sender (Prometheus when a target or series disappears, an OTLP point flagged "no recorded
value") writes it as an ordinary sample; FiloPy stores it bit for bit like any NaN, and queries
read it as the end of the series (see docs/query.md). Other NaNs are values.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["STALE_NAN", "STALE_NAN_BITS", "is_stale"]

STALE_NAN_BITS = 0x7FF0000000000002  # Prometheus's value.StaleNaN
STALE_NAN = float(np.array([STALE_NAN_BITS], np.uint64).view(np.float64)[0])


def is_stale(vals: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Where `vals` holds the staleness marker (compared by bits: other NaNs are values)."""
    return np.asarray(vals, dtype=np.float64).view(np.uint64) == STALE_NAN_BITS
