"""Time the shard manager's heaviest calls at realistic large sizes.

1. 4096 shards over 256 nodes: ``add_dataset`` (members already joined, so it assigns every
   shard) and ``remove_member`` of one node (its shards go Down and are offered to the other
   255). Each run builds a fresh manager; best and median of several runs. Target: under 50 ms.
2. A big dataset becoming Active: 4096 and 65536 shards over 3 nodes, with a guardian watching:
   ``add_dataset``, then every shard reports ``RecoveryInProgress`` then ``IngestionStarted``,
   one report per call (as nodes sent them before batching) and, when the manager has it, in
   batches of 256 per node (``update_from_external_shard_events``). Every message of every call
   is pickled once, as the Ray actor would ship it. Wall time, and peak memory in a second run
   under tracemalloc. Aim (issue 11 item 8): 65536 Active in under 30 s, under 500 MB.

Results are printed and written to bench/results/shard_manager.txt.

    .venv/bin/python bench/bench_shard_manager.py [--runs N] [--only-big] [--sizes 4096,65536]
"""

from __future__ import annotations

import argparse
import os
import pickle
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the real packages, whatever the editable install resolves

from coordinator import ShardManager  # noqa: E402
from coordinator.messages import NodeShardMap, Result  # noqa: E402
from filopy import Dataset, IngestionStarted, RecoveryInProgress, ShardEvent  # noqa: E402

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


BIG_NODES = 3
BATCH = 256


def become_active(num_shards: int, batched: bool) -> tuple[int, int, int]:
    """add_dataset, then Recovery and Active reports for every shard; pickles every message.

    Returns (messages, node maps, pickled bytes)."""
    mgr = ShardManager()
    nodes = [f"node-{i}" for i in range(BIG_NODES)]
    for node in nodes:
        mgr.add_member(node)
    mgr.subscribe_all("guardian")
    ds = Dataset(name="big", num_shards=num_shards, min_num_nodes=BIG_NODES)
    totals = [0, 0, 0]

    def ship(result: Result) -> None:
        totals[0] += len(result.messages)
        for m in result.messages:
            totals[1] += isinstance(m, NodeShardMap)
            totals[2] += len(pickle.dumps(m))

    ship(mgr.add_dataset(ds))
    mapper = mgr.mapper(ds.ref)
    assert mapper is not None
    by_node = {n: mapper.shards_for_node(n) for n in nodes}
    del mapper
    make: list[Callable[[str, int], ShardEvent]] = [
        lambda n, s: RecoveryInProgress(ds.ref, s, n, 0),
        lambda n, s: IngestionStarted(ds.ref, s, n),
    ]
    for build in make:
        for node, shards in by_node.items():
            if batched:
                for i in range(0, len(shards), BATCH):
                    events = [build(node, s) for s in shards[i : i + BATCH]]
                    ship(mgr.update_from_external_shard_events(node, events))
            else:
                for s in shards:
                    ship(mgr.update_from_external_shard_event(node, build(node, s)))
    snap = mgr.snapshot(ds.ref)
    assert all(str(st) == "Active" for st in snap.state.statuses)  # type: ignore[union-attr]
    return totals[0], totals[1], totals[2]


def big_dataset_lines(sizes: list[int]) -> list[str]:
    lines = [
        f"Big dataset becoming Active: add_dataset + Recovery + Active reports for every shard, "
        f"{BIG_NODES} nodes, a guardian watching; every message pickled (time), then again under "
        "tracemalloc (peak Python memory)",
    ]
    modes = [False, True] if hasattr(ShardManager, "update_from_external_shard_events") else [False]
    for n in sizes:
        for batched in modes:
            t0 = time.perf_counter()
            msgs, maps, nbytes = become_active(n, batched)
            seconds = time.perf_counter() - t0
            tracemalloc.start()
            become_active(n, batched)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            how = f"batches of {BATCH}" if batched else "one report per call"
            lines.append(
                f"  {n:6d} shards, {how:<20} {seconds:8.2f} s   peak {peak / 2**20:8.1f} MB   "
                f"{msgs} messages ({maps} node maps), {nbytes / 2**20:.1f} MB pickled"
            )
            print(lines[-1], flush=True)
    return lines


def summarize(label: str, samples: list[float]) -> tuple[str, float]:
    best, median = min(samples), statistics.median(samples)
    verdict = "ok" if median < TARGET_MS else f"OVER {TARGET_MS:.0f} ms target"
    return f"  {label:<34} best {best:7.2f} ms   median {median:7.2f} ms   {verdict}", median


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--only-big", action="store_true", help="only the big-dataset part")
    parser.add_argument("--sizes", default="4096,65536", help="shard counts of the big part")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    big = big_dataset_lines([int(x) for x in args.sizes.split(",")])
    if args.only_big:
        if not args.no_write:
            RESULTS.write_text("\n".join(big) + "\n")
        return 0

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
    lines += big
    report = "\n".join(lines).rstrip() + "\n"
    print(report, end="")
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(report)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
