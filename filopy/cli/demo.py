"""The main job in one command: a local FiloPy cluster ingesting, losing a node, recovering.

It starts Kafka (through scripts/services.sh), a real multi-node Ray cluster on this machine
(each FiloPy node is its own set of Ray processes), the cluster singleton on the embedded SQLite
store, creates a dataset, streams a synthetic Prometheus-like workload through the gateway while
showing the shard map and the ingestion rate, kills the node holding the most shards, shows its
shards moving and recovering from their checkpoints, and finally reads every series back from the
nodes' memstores and the ColumnStore and compares with what was produced.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack, redirect_stderr, redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from coordinator.local_cluster import LocalRayCluster
from core.config import Settings, load_settings

# isort: split
import ray

from coordinator.client import FiloPyClient
from coordinator.cluster_actor import start_cluster_actor
from coordinator.node_coordinator import NAME_LABEL
from core.dataset import Dataset, SourceSettings
from core.mapper import ShardMapper
from core.shard_status import ShardEvent
from ingest.gateway import Gateway
from ingest.workload import JOBS, SCRAPE_MS, scrapes

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000_000


@dataclass(frozen=True)
class DemoPlan:
    nodes: int = 3
    series: int = 2000
    scrapes: int = 600  # 1.2M samples by default
    scrapes_per_send: int = 10
    shards: int = 8
    quick: bool = False
    verbose: bool = False  # Ray's own output on the terminal too

    @property
    def samples(self) -> int:
        return self.series * self.scrapes


QUICK = DemoPlan(series=500, scrapes=120, quick=True)


def _status_table(
    mapper: ShardMapper, rate: float, produced: int, plan: DemoPlan, names: dict[str, str]
) -> Table:
    table = Table(title=f"FiloPy demo: {plan.shards} shards", show_lines=False)
    table.add_column("shard", justify="right")
    table.add_column("status")
    table.add_column("node")
    colours = {"A": "green", "R": "yellow", "N": "cyan", "D": "red", "E": "red"}
    for s in range(mapper.num_shards):
        status = mapper.status(s)
        colour = colours.get(status.letter, "white")
        owner = mapper.owner(s)
        table.add_row(str(s), f"[{colour}]{status}[/]", names.get(owner or "", owner or ""))
    table.caption = (
        f"produced {produced:,} of {plan.samples:,} samples · gateway {rate:,.0f} samples/s"
    )
    return table


class Demo:
    def __init__(self, plan: DemoPlan, settings: Settings, console: Console) -> None:
        self.plan, self.settings, self.console = plan, settings, console
        self.produced = 0
        self.rate = 0.0
        self.events: list[ShardEvent] = []

    def run(self) -> bool:
        c = self.console
        c.rule("[bold]1. Kafka")
        self._kafka_up()
        c.rule("[bold]2. A Ray cluster of FiloPy nodes on 127.0.0.1")
        with ExitStack() as quiet:
            if not self.plan.verbose:
                # Ray prints its raylets' deaths (a killed node's last log lines, state dumps)
                # and other errors on the driver's sys.stdout, whatever log_to_driver says:
                # they go to a file; the story keeps the real terminal.
                c.file = sys.stdout
                log = self.settings.store.sqlite_path.with_suffix(".log")
                sink = quiet.enter_context(log.open("a", encoding="utf-8"))
                quiet.enter_context(redirect_stdout(sink))
                quiet.enter_context(redirect_stderr(sink))
            cluster = LocalRayCluster(
                namespace=self.settings.ray.namespace, log_to_driver=self.plan.verbose
            )
            if not self.plan.verbose:
                c.print(f"[dim]Ray's messages: {log}; its logs: {cluster.logs_dir}[/]")
            try:
                return self._run_on(cluster)
            finally:
                c.print("[dim]stopping the Ray cluster…[/]")
                cluster.shutdown()

    def _kafka_up(self) -> None:
        out = subprocess.run(
            [str(ROOT / "scripts" / "services.sh"), "up", "kafka"],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"could not start Kafka:\n{out.stderr.strip()}")
        self.console.print(out.stdout.strip() or out.stderr.strip().splitlines()[-1])

    def _run_on(self, cluster: LocalRayCluster) -> bool:
        c, plan, s = self.console, self.plan, self.settings
        resource = {s.cluster.node_resource: 1}
        # One node more than the dataset needs (its min_num_nodes), so the shards of the node the
        # demo kills have somewhere to go. It is no spare: rebalancing gives it shards too.
        nodes = [
            cluster.add_node(resources=resource, labels={NAME_LABEL: f"node-{i + 1}"})
            for i in range(plan.nodes + 1)
        ]
        actor = start_cluster_actor(s)
        ray.get(actor.ready.remote(), timeout=60)
        client = FiloPyClient(actor, s)
        _wait(lambda: len(client.members()) == plan.nodes + 1, 60)
        names = client.node_names()  # kept: the killed node's name outlives it here
        c.print(
            f"{plan.nodes + 1} FiloPy nodes joined (one more than the dataset needs, to take over "
            f"a lost node's shards); SQLite store {s.store.sqlite_path}"
        )

        c.rule("[bold]3. SetupDataset")
        ds = Dataset(
            name=f"demo{uuid.uuid4().hex[:6]}",
            num_shards=plan.shards,
            min_num_nodes=plan.nodes,
            source=SourceSettings(bootstrap_servers=s.kafka.bootstrap_servers),
        )
        client.setup_dataset(ds)
        _wait(lambda: client.shard_map(ds.name).is_healthy(), 60)
        c.print(client.shard_map(ds.name).render(names))
        sub = client.subscribe(ds.name)
        sub.next(timeout_s=10)  # the snapshot
        listener = threading.Thread(target=self._listen, args=(sub,), daemon=True)
        listener.start()

        c.rule("[bold]4. Ingesting a synthetic workload through the gateway")
        producer = threading.Thread(target=self._produce, args=(ds,), daemon=True)
        producer.start()
        victim, moved, killed_at = None, [], 0.0
        # Not redirecting stdout: what Ray prints there meanwhile belongs in the log file.
        live = Live(
            console=c,
            refresh_per_second=4,
            transient=plan.quick,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        with live:
            while producer.is_alive():
                mapper = client.shard_map(ds.name)
                live.update(_status_table(mapper, self.rate, self.produced, plan, names))
                if victim is None and self.produced >= plan.samples // 2:
                    counts = Counter(mapper.owner(x) for x in range(plan.shards))
                    victim = max(nodes, key=lambda n: counts[n.node_id])
                    moved = mapper.shards_for_node(victim.node_id)
                    live.console.print(
                        f"[bold red]5. killing node {names[victim.node_id]} (shards {moved})[/]"
                    )
                    killed_at = time.monotonic()
                    cluster.remove_node(victim)
                time.sleep(0.25)
            producer.join()
            healthy = _wait(
                lambda: (
                    (m := client.shard_map(ds.name)).is_healthy()
                    and victim is not None
                    and not m.shards_for_node(victim.node_id)
                ),
                120,
            )
            final = client.shard_map(ds.name)
            live.update(_status_table(final, self.rate, self.produced, plan, names))
        if victim is not None and healthy:
            after = client.shard_map(ds.name)
            homes = ", ".join(sorted({f"{x} → {names.get(after.owner(x) or '')}" for x in moved}))
            c.print(
                f"moved and recovered from their checkpoints: {homes}; all Active "
                f"{time.monotonic() - killed_at:.1f} s after the kill"
            )
        c.print("events seen by a subscriber for the moved shards:")
        for e in [e for e in self.events if victim is not None and e.shard in moved][:12]:
            c.print(f"  shard {e.shard}: {type(e).__name__} {names.get(e.node or '', e.node)}")

        c.rule("[bold]6. Reading every series back")
        ok = self._verify(client, ds)

        c.rule("[bold]7. A PromQL query, routed by shard key and evaluated on the nodes")
        try:
            ok = self._query(client, ds) and ok
        finally:
            # Nothing may call Ray once it is shut down: Ray's core worker ends the process
            # (exit 1) when a thread does. The query service follows shard maps on threads.
            client.queries().close()
            sub.unsubscribe()
            listener.join(timeout=30)
        return ok

    def _listen(self, sub: Any) -> None:
        for update in sub:
            if isinstance(update, ShardEvent):
                self.events.append(update)

    def _produce(self, ds: Dataset) -> None:
        plan = self.plan
        started = time.monotonic()
        with Gateway(ds, self.settings.kafka.bootstrap_servers, kafka=self.settings.kafka) as gw:
            for batch in scrapes(plan.series, plan.scrapes, plan.scrapes_per_send, T0):
                gw.send_batch(batch)
                self.produced += len(batch)
                self.rate = self.produced / max(1e-9, time.monotonic() - started)
                time.sleep(0.05 if plan.quick else 0.1)  # a steady stream, not one burst

    def _query(self, client: FiloPyClient, ds: Dataset) -> bool:
        """Count each job's samples over the whole run with PromQL and check it against what
        was produced: every job has series/4 series (see ingest.workload) of `scrapes` samples."""
        plan = self.plan
        end = T0 + (plan.scrapes - 1) * SCRAPE_MS
        span = f"{plan.scrapes * SCRAPE_MS // 1000}s"
        promql = f'sum by (_ns_) (count_over_time({{_ws_="demo"}}[{span}]))'
        res = client.query(ds.name, promql, end)
        value = res.value
        got = {lb["_ns_"]: int(row[0]) for lb, row in zip(value.labels, value.values, strict=True)}
        per_job = plan.series // len(JOBS) * plan.scrapes
        self.console.print(f"[bold]{promql}[/] at the last scrape:")
        table = Table()
        table.add_column("_ns_")
        table.add_column("samples", justify="right")
        for job in sorted(got):
            table.add_row(job, f"{got[job]:,}")
        self.console.print(table)
        hot = 'sum(count_over_time(memory_bytes{_ws_="demo", _ns_="db"}[1m]))'
        plan_hot = client.queries().explain(ds.name, hot)
        self.console.print(
            f"{hot} visits shards {plan_hot['shards']} of {plan.shards} "
            f"(spread {plan_hot['selectors'][0]['shardKeys'][0]['spread']}); "
            f"{res.samples_scanned:,} samples scanned on {len(res.nodes)} nodes for the first query"
        )
        ok = got == dict.fromkeys(JOBS, per_job)
        if not ok:
            self.console.print(f"[bold red]query result differs: expected {per_job:,} per job[/]")
        return ok

    def _verify(self, client: FiloPyClient, ds: Dataset) -> bool:
        deadline = time.monotonic() + 120
        total, per_series = 0, {}
        while time.monotonic() < deadline:
            per_series = {}
            for held in client.series_samples(ds.ref).values():
                per_series.update(held)
            total = sum(len(ts) for ts in per_series.values())
            if total >= self.plan.samples:
                break
            time.sleep(0.5)
        dupes = sum(len(ts) - len(np.unique(ts)) for ts in per_series.values())
        table = Table(title="read back from memstores + ColumnStore")
        table.add_column("")
        table.add_column("value", justify="right")
        table.add_row("series", f"{len(per_series):,} (produced {self.plan.series:,})")
        table.add_row("samples", f"{total:,} (produced {self.plan.samples:,})")
        table.add_row("duplicated samples", f"{dupes:,}")
        self.console.print(table)
        ok = total == self.plan.samples and len(per_series) == self.plan.series and dupes == 0
        self.console.print(
            "[bold green]nothing lost, nothing duplicated[/]"
            if ok
            else "[bold red]MISMATCH between produced and stored samples[/]"
        )
        return ok


def _wait(check: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def demo_settings(base: Settings | None = None) -> Settings:
    """The embedded defaults, with a fresh SQLite file and a fast flush so the kill shows
    recovery from checkpoints rather than a full replay."""
    base = base or load_settings()
    db = Path(".filopy") / f"demo-{uuid.uuid4().hex[:6]}.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    return base.model_copy(
        update={
            "store": base.store.model_copy(update={"backend": "sqlite", "sqlite_path": db}),
            "ingest": base.ingest.model_copy(update={"flush_interval_s": 2.0}),
            "ray": base.ray.model_copy(update={"namespace": f"filopy-demo-{uuid.uuid4().hex[:6]}"}),
        }
    )


def run_demo(quick: bool = False, console: Console | None = None, verbose: bool = False) -> bool:
    console = console or Console()
    plan = replace(QUICK if quick else DemoPlan(), verbose=verbose)
    return Demo(plan, demo_settings(), console).run()
