"""What per-tenant query limits cost a node's read (run on demand; no services needed).

One shard of 20,000 series x 10 samples in a real memstore, over a SQLite ColumnStore: the
time of `ShardSource.select_batch` for all of them, limits off and on (limits high enough not
to refuse: reads in slices of `LIMITED_SLICE_SERIES` series, each checked), for a window that
starts before memory (a ColumnStore read per slice) and one inside it. Median of 15 each.
Results: bench/results/query_limits.txt.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.dataset import Dataset  # noqa: E402
from ingest.batch import SampleBatch  # noqa: E402
from ingest.memstore import ShardMemstore  # noqa: E402
from query.executor import LIMITED_SLICE_SERIES, ShardSource  # noqa: E402
from query.limits import QueryLimits  # noqa: E402
from store.api import LabelMatcher, MatchOp  # noqa: E402
from store.sqlite import open_sqlite_stores  # noqa: E402

SERIES, EACH, RUNS = 20_000, 10, 15
T = 1_700_000_000_000
DS = Dataset(name="bench", num_shards=2)
NAME = (LabelMatcher("__name__", MatchOp.EQ, "m"),)


def memstore() -> ShardMemstore:
    mem = ShardMemstore(DS, 0, groups_per_shard=1)
    labels = [{"_metric_": "m", "_ws_": "w", "_ns_": "n", "host": f"h{i}"} for i in range(SERIES)]
    idx = np.repeat(np.arange(SERIES, dtype=np.int32), EACH)
    ts = np.tile(T + 10_000 * np.arange(EACH, dtype=np.int64), SERIES)
    mem.ingest(SampleBatch(labels, idx, ts, np.ones(len(ts))), 0)
    return mem


def main() -> None:
    _, columns = open_sqlite_stores(Path(tempfile.mkdtemp()) / "bench.db")
    mem = memstore()
    print(f"{SERIES} series x {EACH} samples, one shard; slices of {LIMITED_SLICE_SERIES} series")
    for where, start in (("before memory", T - 60_000), ("inside memory", T)):
        for label, limits in (("off", None), ("on", QueryLimits("t", 10**9, 10**9))):
            times = []
            for _ in range(RUNS):
                source = ShardSource(DS, {0: mem}, columns)
                source.limits = limits
                began = time.perf_counter()
                source.select_batch(NAME, start, T + 10**6)
                times.append(time.perf_counter() - began)
            ms = statistics.median(times) * 1000
            print(f"window {where}, limits {label}: median {ms:.1f} ms")


if __name__ == "__main__":
    main()
