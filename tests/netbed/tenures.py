"""The ingesters' tenure logs of every member node, and the check that no two ever overlapped.

    python -m tests.netbed.tenures DATASET --address head:6379   (prints them as JSON)

A tenure is one ingester's hold on one shard (ingest/tenure.py): claimed under an ownership epoch,
released when its consumer closed, with the offsets it read. Run on a machine with a Ray node
(the head): it asks each member's coordinator for its log. `check` is what the tests assert.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import time
from collections.abc import Iterable
from typing import Any


def collect(dataset: str, address: str, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Every member's tenures of `dataset`, as one consistent picture: the nodes are asked one
    after another, so a shard moving meanwhile can show its old owner still holding (asked
    before it let go) beside its new owner's claim (asked after). The nodes are asked again until
    two rounds agree (the tests ask once writing stopped: only a move changes the logs then)."""
    import ray

    from coordinator.client import connect
    from coordinator.names import node_actor_name

    client = connect(address)

    def one_round() -> list[dict[str, Any]]:
        names = client.node_names()
        out = []
        for node in client.members():
            actor = ray.get_actor(node_actor_name(node), namespace=client._settings.ray.namespace)
            for t in ray.get(actor.tenures.remote(dataset), timeout=60):
                out.append({**dataclasses.asdict(t), "node": names.get(node, node)})
        return sorted(out, key=lambda t: (t["shard"], t["epoch"], t["node"]))

    deadline = time.monotonic() + timeout_s
    last = one_round()
    while True:
        time.sleep(0.5)
        now = one_round()
        if now == last:
            return now
        if time.monotonic() > deadline:
            raise RuntimeError(f"the tenures of {dataset} kept changing for {timeout_s:.0f} s")
        last = now


def check(tenures: Iterable[dict[str, Any]], fenced: str | None = None) -> dict[int, int]:
    """Per shard, ordered by epoch: one holder per epoch, each tenure claimed after the one
    before was released, reading on from the offset after the last one it read (nothing
    skipped). The exception is `fenced`, a node cut off while it held shards: it could not know
    they had moved, so its hold ends only at its first commit after the move, which the store
    refused; its tenure may overlap the next, and the next starts from the last checkpoint,
    at or before where the fenced one read to. Returns shard -> tenures seen."""
    by_shard: dict[int, list[dict[str, Any]]] = {}
    for t in tenures:
        by_shard.setdefault(t["shard"], []).append(t)
    for shard, held in by_shard.items():
        held.sort(key=lambda t: t["epoch"])
        epochs = [t["epoch"] for t in held]
        assert len(set(epochs)) == len(epochs), f"shard {shard}: an epoch held twice: {held}"
        assert all(t["released_at"] is not None for t in held[:-1]), f"shard {shard}: {held}"
        for old, new in itertools.pairwise(held):
            if old["node"] == fenced:
                assert new["first_offset"] <= old["next_offset"], f"shard {shard}: gap {old} {new}"
                continue
            assert old["released_at"] <= new["claimed_at"], f"shard {shard}: overlap {old} {new}"
            assert new["first_offset"] == old["next_offset"], f"shard {shard}: {old} {new}"
    return {s: len(h) for s, h in by_shard.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dataset")
    p.add_argument("--address", default="auto")
    args = p.parse_args()
    print(json.dumps(collect(args.dataset, args.address)))


if __name__ == "__main__":
    main()
