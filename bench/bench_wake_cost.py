"""What a pause before a query costs: the same work, back to back and after the CPU idled.

Why: on this machine (a VM) a small PromQL query's time is mostly fixed costs, and each of
FiloPy's processes on a query's path (the REST server, two nodes) starts it from idle when
queries come a few milliseconds apart, as in bench/bench_promql.py's interleaved runs. This
measures how much more CPU the same work takes then, for three kinds of work:

- a node part that finds no series (the query channel's request read, the lookups, the answer
  encoded and signed): the fixed cost of every part;
- a node part of `sum by (instance) (rate(...[5m]))` over 20 series, as in bench_promql.py;
- a compiled loop (numba) of about the same CPU time, touching almost no memory.

The node parts are served by a real `QueryServer` over loopback (its CPU counters per part);
the loop runs in this thread. Each is run `--runs` times with no pause and with pauses of 1, 5
and 20 ms, in `--rounds` alternating rounds. The CPU time is the thread's (`thread_time`), so
waiting is not in it: what grows is the work itself, from cold caches.

    .venv/bin/python bench/bench_wake_cost.py [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coordinator.query_channel import Connection, QueryServer, request_payload  # noqa: E402
from core.dataset import Dataset, DatasetRef  # noqa: E402
from ingest.batch import SampleBatch  # noqa: E402
from ingest.memstore import ShardMemstore  # noqa: E402
from query.executor import NodeAnswer, NodeQuery, ShardSource, run_node_query  # noqa: E402
from query.promql import parse  # noqa: E402

END_MS = 1_700_000_000_000
SAMPLES = 2_340  # 3 h 15 min at 5 s, as bench_promql.py's demo series
PAUSES_MS = (0.0, 1.0, 5.0, 20.0)


def memstores(ds: Dataset) -> dict[int, ShardMemstore]:
    """Two shards of 10 counters each, `SAMPLES` samples per series."""
    out = {}
    ts = END_MS - (SAMPLES - 1 - np.arange(SAMPLES)) * 5000
    for shard in (0, 1):
        mem = ShardMemstore(ds, shard)
        series = [
            {"_metric_": "demo_cpu_usage_seconds_total", "instance": f"i{shard * 5 + i}", "mode": m}
            for i in range(5)
            for m in ("idle", "user")
        ]
        for lo in range(0, SAMPLES, 60):
            k = min(60, SAMPLES - lo)
            idx = np.repeat(np.arange(len(series), dtype=np.int32), k)
            t = np.tile(ts[lo : lo + k], len(series)).astype(np.int64)
            mem.ingest(SampleBatch(series, idx, t, np.cumsum(np.ones(len(idx)))), lo)
        out[shard] = mem
    return out


@numba.njit(cache=False)
def _spin(n: int) -> float:
    s = 0.0
    for i in range(n):
        s = s * 0.999999 + i
    return s


def node_part(conn: Connection, server: QueryServer, payload: bytes) -> Callable[[], float]:
    """One request over the channel; the server's CPU seconds for it."""

    def run() -> float:
        before = server.stats()["cpu_s"]
        conn.send(payload)
        kind, value = conn.receive(time.monotonic() + 10)
        if kind != "ok":
            raise value
        return server.stats()["cpu_s"] - before

    return run


def compiled(n: int) -> Callable[[], float]:
    def run() -> float:
        t = time.thread_time()
        _spin(n)
        return time.thread_time() - t

    return run


def measure(work: Callable[[], float], pause_s: float, runs: int) -> float:
    """Median CPU seconds of `work` over `runs` calls, `pause_s` apart."""
    cpu = []
    for _ in range(runs):
        if pause_s:
            time.sleep(pause_s)
        cpu.append(work())
    return float(np.median(cpu))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "wake_cost.txt"))
    args = ap.parse_args()

    ds = Dataset(name="wake", num_shards=2)
    mems = memstores(ds)

    def handler(ref: DatasetRef, shards: list[int], request: NodeQuery) -> NodeAnswer:
        return run_node_query(request, ShardSource(ds, {s: mems[s] for s in shards}, None))  # type: ignore[arg-type]

    server = QueryServer("127.0.0.1", handler)
    conn = Connection(server.endpoint, 2.0)
    times = np.array([END_MS], np.int64)

    def request(query: str) -> bytes:
        part = NodeQuery("partial", expr=parse(query), times=times)
        return request_payload(ds.ref, [0, 1], part)

    rate = node_part(
        conn, server, request("sum by (instance) (rate(demo_cpu_usage_seconds_total[5m]))")
    )
    empty = node_part(conn, server, request("sum(rate(demo_no_such_metric[5m]))"))
    # A loop of about the rate part's CPU time when warm.
    for _ in range(200):
        rate()
    warm = measure(rate, 0.0, 200)
    _spin(10)
    probe = measure(compiled(100_000), 0.0, 50)
    loop = compiled(max(1000, int(100_000 * warm / probe)))
    works = {
        "node part, no series": empty,
        "node part, rate of 20 series": rate,
        "compiled loop (numba)": loop,
    }
    results: dict[str, dict[float, list[float]]] = {w: {p: [] for p in PAUSES_MS} for w in works}
    for r in range(args.rounds):
        order = list(works.items())
        if r % 2:
            order.reverse()
        for name, work in order:
            for pause in PAUSES_MS:
                results[name][pause].append(measure(work, pause / 1000, args.runs))
    conn.close()
    server.close()

    head = "".join(f"{f'{p:g} ms':>16}" for p in PAUSES_MS)
    lines = [
        "# CPU time of the same work back to back and after a pause (bench/bench_wake_cost.py)",
        f"# {platform.node()}: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; {args.rounds} alternating rounds of {args.runs} runs per "
        "pause; median us of CPU per run, the spread of the rounds' medians in brackets, and "
        "the ratio to no pause",
        f"# command: .venv/bin/python bench/bench_wake_cost.py --runs {args.runs} "
        f"--rounds {args.rounds}",
        f"{'work':<30}{head}",
    ]
    for name, by_pause in results.items():
        base = float(np.median(by_pause[0.0]))
        cells = []
        for pause in PAUSES_MS:
            us = np.array(by_pause[pause]) * 1e6
            mid = float(np.median(us))
            cells.append(f"{mid:>6.0f} [{us.min():.0f}-{us.max():.0f}]".rjust(16))
        lines.append(f"{name:<30}{''.join(cells)}")
        ratios = "".join(f"{f'x{float(np.median(by_pause[p])) / base:.2f}':>16}" for p in PAUSES_MS)
        lines.append(f"{'':<30}{ratios}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
