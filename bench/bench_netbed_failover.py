"""Failover across hosts, on the many-hosts bed (tests/netbed; needs root). Results in
bench/results/netbed_failover.txt.

- a node's machine killed (every process, -9) -> each of its shards Active on another node: the
  time, p50 / p99 / max over the runs (each run kills the node holding shard 0, then starts it
  again and waits until rebalancing has spread the shards out before the next);
- the head's machine killed for a few seconds and started again (Ray's control state in Redis):
  how long the REST API and admin calls were unavailable (from the kill until REST answers), how
  long the singleton took after the head started, and whether writes through the gateway were
  acknowledged throughout (the longest gap between two acknowledged rounds of the writer).

The same measurement on one host is bench_failover.py's (a whole Ray node removed).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.netbed.bed import Bed  # noqa: E402
from tests.netbed.cluster import HEAD_ADDRESS, NODES, NetCluster  # noqa: E402

DATASET = "benchfail"
RESULTS = ROOT / "bench" / "results" / "netbed_failover.txt"


def _active_elsewhere(c: NetCluster, victim: str, shards: list[int]) -> bool:
    state = {s["shard"]: s for s in c.shards(DATASET)}
    return all(state[s]["status"] == "Active" and state[s]["node"] != victim for s in shards)


def node_failovers(c: NetCluster, runs: int) -> list[float]:
    took = []
    for i in range(runs):
        victim = c.wait_settled(DATASET, timeout_s=600)[0]
        owned = [s["shard"] for s in c.shards(DATASET) if s["node"] == victim]
        t0 = time.monotonic()
        c.bed.kill(victim)
        while not _active_elsewhere(c, victim, owned):
            time.sleep(0.05)
        took.append(time.monotonic() - t0)
        print(f"run {i + 1}: {victim}'s {len(owned)} shards moved in {took[-1]:.2f} s", flush=True)
        c.join(victim)
        c.wait_members(set(NODES))
    return took


def head_failover(c: NetCluster, dataset: str, down_s: float, node_died: bool) -> dict[str, float]:
    """The head killed for `down_s`, then started again, under a writer to a dataset of its own
    (a writer's rounds restart at the same timestamps); with `node_died`, a node's machine is
    killed and rejoined first, so the head dies while Ray still counts that node's old
    incarnation alive (the case that held the singleton's restart up for a minute)."""
    c.cli("dataset", "create", dataset, "--shards", "8", "--min-nodes", "2",
          "--address", HEAD_ADDRESS)  # fmt: skip
    before = c.wait_settled(dataset, timeout_s=600)
    if node_died:
        victim = before[0]
        c.bed.kill(victim)
        c.wait_active(dataset, avoid=[victim])
        c.join(victim)
        c.wait_members(set(NODES))
        before = c.wait_settled(dataset, timeout_s=600)  # shards spread out again
    producer, out = c.start_writer(dataset)
    t0 = time.monotonic()
    c.bed.kill("head")
    time.sleep(down_s)
    to_rest = c.start_head()
    unavailable = time.monotonic() - t0
    after = {s["shard"]: s["node"] for s in c.wait_active(dataset)}
    assert after == before, f"shards moved: {before} -> {after}"
    print(f"head back (node died before: {node_died}): REST {to_rest:.1f} s after its start",
          flush=True)  # fmt: skip
    time.sleep(3)
    record = c.stop_producer(producer, out)
    # The writer's rounds are 0.2 s apart plus its request: the longest gap between two
    # acknowledged rounds (wall clock, from the producer's log of round times) shows a stall.
    c.assert_stored_once(dataset, record)
    gaps = [b - a for a, b in zip(record["ack_times"], record["ack_times"][1:], strict=False)]
    return {
        "down_s": down_s,
        "rest_unavailable_s": unavailable,
        "rest_after_head_start_s": to_rest,
        "longest_write_gap_s": max(gaps) if gaps else float("nan"),
        "rounds_acked": float(len(record["acked_ts"])),
    }


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--head-down-s", type=float, default=10.0)
    p.add_argument("--head-runs", type=int, default=3, help="head failovers after a node died")
    args = p.parse_args()
    workdir = ROOT / ".netbed" / "bench"
    shutil.rmtree(workdir, ignore_errors=True)
    bed = Bed(workdir).create()
    # Moves without the 5 min cooldown: each run waits for rebalancing to spread the shards out
    # again, and the shards a failover just moved would otherwise hold that up for minutes.
    c = NetCluster(bed, ROOT, env={"FILOPY_REBALANCE__MOVE_COOLDOWN_S": "0"})
    try:
        c.start()
        c.cli("dataset", "create", DATASET, "--shards", "8", "--min-nodes", "2",
              "--address", HEAD_ADDRESS)  # fmt: skip
        c.wait_active(DATASET)
        nodes = node_failovers(c, args.runs)
        head = head_failover(c, "headfail", args.head_down_s, node_died=False)
        after_node = [head_failover(c, f"headfail{i}", args.head_down_s, node_died=True)
                      for i in range(args.head_runs)]  # fmt: skip
    finally:
        bed.remove()
    lines = [
        f"# bench_netbed_failover.py on {platform.node()} ({platform.machine()}), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "# bed: Kafka, Redis, head, 3 nodes, gateway, client each in a network namespace;",
        "# 8 shards over 3 nodes; SQLite store on the shared file system",
        "",
        f"node machine killed -> its shards Active elsewhere, {len(nodes)} runs (s): "
        f"p50 {statistics.median(nodes):.2f}  p99 {pct(nodes, 0.99):.2f}  max {max(nodes):.2f}",
        "  runs: " + " ".join(f"{t:.2f}" for t in nodes),
        "",
        f"head machine killed for {head['down_s']:.0f} s, then filopy head started again:",
        f"  REST and admin calls unavailable {head['rest_unavailable_s']:.1f} s "
        f"(REST answering {head['rest_after_head_start_s']:.1f} s after the head's start)",
        f"  writes through the gateway: {head['rounds_acked']:.0f} rounds acknowledged, the "
        f"longest gap between two {head['longest_write_gap_s']:.2f} s (rounds 0.2 s apart)",
        "  every acknowledged sample stored once; no shard moved",
        "",
        f"the same, {len(after_node)} runs, each right after a node's machine was killed and "
        "rejoined (Ray still counting its old incarnation alive):",
        "  REST answering after the head's start (s): "
        + " ".join(f"{h['rest_after_head_start_s']:.1f}" for h in after_node),
        "  longest write gaps (s): "
        + " ".join(f"{h['longest_write_gap_s']:.2f}" for h in after_node),
    ]
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(json.dumps({"nodes": nodes, "head": head, "after_node": after_node}))


if __name__ == "__main__":
    main()
