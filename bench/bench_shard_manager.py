"""Time the shard manager's two heaviest calls at a realistic large size.

4096 shards over 256 nodes: ``add_dataset`` (members already joined, so it assigns every shard)
and ``remove_member`` of one node (its shards go Down and are offered to the other 255). Each
run builds a fresh manager; the best and median of several runs are reported, printed and
written to bench/results/shard_manager.txt. Target: under 50 ms each.

    .venv/bin/python bench/bench_shard_manager.py [--runs N]
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the real packages, whatever the editable install resolves

from coordinator import NodeShardMap, ShardManager  # noqa: E402
from filopy import Dataset  # noqa: E402

NUM_SHARDS = 4096
NUM_NODES = 256
TARGET_MS = 50.0
RESULTS = ROOT / "bench" / "results" / "shard_manager.txt"


def one_run(with_subscribers: bool) -> tuple[float, float, float, int, int, int]:
    mgr = ShardManager()
    for i in range(NUM_NODES):
        mgr.add_member(f"node-{i:03d}")
    if with_subscribers:
        mgr.subscribe_all("guardian")
    ds = Dataset(name="bench", num_shards=NUM_SHARDS, min_num_nodes=NUM_NODES)

    t0 = time.perf_counter()
    added = mgr.add_dataset(ds)
    t1 = time.perf_counter()
    if with_subscribers:
        mgr.subscribe("query-gateway", ds.ref)
    t2 = time.perf_counter()
    removed = mgr.remove_member(f"node-{NUM_NODES // 2:03d}")
    t3 = time.perf_counter()

    mapper = mgr.mapper(ds.ref)
    assert mapper is not None and mapper.num_assigned_nodes == NUM_NODES - 1
    # What a Ray actor pays to ship the result: every message pickled on its own.
    t4 = time.perf_counter()
    for message in added.messages:
        pickle.dumps(message)
    t5 = time.perf_counter()
    node_map = next(m for m in added.messages if isinstance(m, NodeShardMap))
    return (
        (t1 - t0) * 1000,
        (t3 - t2) * 1000,
        (t5 - t4) * 1000,
        len(added.messages),
        len(removed.messages),
        len(pickle.dumps(node_map)),
    )


def summarize(label: str, samples: list[float]) -> tuple[str, float]:
    best, median = min(samples), statistics.median(samples)
    verdict = "ok" if median < TARGET_MS else f"OVER {TARGET_MS:.0f} ms target"
    return f"  {label:<34} best {best:7.2f} ms   median {median:7.2f} ms   {verdict}", median


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    lines = [
        f"ShardManager benchmark: {NUM_SHARDS} shards over {NUM_NODES} nodes, "
        f"{args.runs} runs each (fresh manager per run)",
        f"python {platform.python_version()} on {platform.platform()} "
        f"({platform.machine()}, {os.cpu_count()} CPUs)",
        "",
    ]
    all_ok = True
    for with_subs in (False, True):
        runs = [one_run(with_subs) for _ in range(args.runs)]
        title = "with a guardian and a subscriber" if with_subs else "no subscribers"
        lines.append(f"{title}:")
        for label, col in (("add_dataset (assigns all)", 0), ("remove_member (one node)", 1)):
            text, median = summarize(label, [r[col] for r in runs])
            lines.append(text)
            all_ok &= median < TARGET_MS
        pickle_ms = statistics.median(r[2] for r in runs)
        _, _, _, n_add, n_remove, map_bytes = runs[-1]
        lines.append(
            f"  messages: add_dataset {n_add}, remove_member {n_remove}; "
            f"one NodeShardMap pickles to {map_bytes} bytes"
        )
        lines.append(f"  pickling every add_dataset message separately: median {pickle_ms:.2f} ms")
        lines.append("")
    report = "\n".join(lines).rstrip() + "\n"
    print(report, end="")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
