"""A FiloPy cluster spread over the bed's hosts, started as an operator starts one.

Kafka runs on `kafka` (scripts/services.sh, bound to the host's address), the head on `head`
(`filopy head --bind head`), each node on its own host (`filopy node join --address head:6379`),
and every look at the cluster is taken from `client` through the REST API over the network, or
with the `filopy` command line on the head (a Ray driver needs a Ray node on its machine). The
store is SQLite on the shared file system (the bed's stand-in for a store every host reaches), or
Cassandra on `cassandra` when the environment says `FILOPY_STORE__BACKEND=cassandra`. Ray
admits only processes holding the cluster's Ray token (`ray_token`), as docs/deployment.md's
"Several machines, secured" has it.
"""

from __future__ import annotations

import json
import secrets
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

from prometheus_client.parser import text_string_to_metric_families

from coordinator.ray_env import ray_token_env
from core.local_state import write_private
from tests import waiting
from tests.netbed.bed import Bed, BedError
from tests.waiting import DEADLINE_S

NODES = ("node-1", "node-2", "node-3")
HEAD_ADDRESS = "head:6379"
REST = "http://head:8080"
# Clusters on the bed run with Ray's token authentication, as production should: it costs the
# bed's tests nothing measurable (docs/deployment.md, "Several machines, secured").
RAY_TOKEN = True
T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float = DEADLINE_S) -> T:
    """tests.waiting.wait_for at the bed's pace: a check that runs commands on the hosts every
    half second, a host not answering yet counting as "not yet"."""
    return waiting.wait_for(
        what, check, timeout_s, interval_s=0.5, retry_on=(BedError, ValueError, KeyError)
    )


class NetCluster:
    def __init__(
        self,
        bed: Bed,
        root: Path,
        env: dict[str, str] | None = None,
        *,
        nodes: Sequence[str] = NODES,
        ray_token: bool = RAY_TOKEN,
    ) -> None:
        self.bed = bed
        self.root = root
        self.filopy_bin = str(root / ".venv" / "bin" / "filopy")
        # Every cluster on the bed starts from nothing: its own Kafka, Redis and store files, and
        # empty /tmp/ray on every host. (Redis kept Ray's control state of an earlier cluster:
        # a new head took it up, with that cluster's dead nodes at the same addresses.)
        self.dir = bed.workdir / f"cluster-{len(list(bed.workdir.glob('cluster-*')))}"
        self.dir.mkdir(parents=True)
        bed.clear_ray_dirs()
        self.env = {
            "FILOPY_KAFKA__BOOTSTRAP_SERVERS": "kafka:9092",
            "FILOPY_STORE__SQLITE_PATH": str(self.dir / "filopy.db"),
            "FILOPY_STATE_DIR": str(self.dir / "state"),  # no `filopy up` cluster to find
            # These tests are about faults between hosts, not access: tests/netbed/
            # test_deployment_doc.py and test_compose_run.py run with auth on.
            "FILOPY_AUTH__ENABLED": "false",
            **(env or {}),
        }
        self.node_names = tuple(nodes)
        # Ray's token authentication, as production runs it (docs/deployment.md): one random
        # token in a 0600 file, in the environment of the head, every node and every driver.
        self.ray_token: Path | None = None
        if ray_token:
            self.ray_token = self.dir / "ray-token"
            write_private(self.ray_token, secrets.token_hex(32))
            self.env.update(ray_token_env(self.ray_token))

    # ----- starting and stopping ----------------------------------------------------------------

    def start(self) -> None:
        try:
            self.start_service("kafka")
            self.start_service("redis")
            if self.env.get("FILOPY_STORE__BACKEND") == "cassandra":
                self.start_service("cassandra")
            self.start_head()
            for node in self.node_names:
                self.join(node)
            wait_for(f"members {list(self.node_names)}", self._members_restarting_exited, 300)
        except (AssertionError, BedError) as e:
            raise AssertionError(f"the cluster did not start: {e}\n{self.logs()}") from None

    def _members_restarting_exited(self) -> bool | None:
        """Whether every node is a member; a node whose `filopy node join` exited is started
        again on a clean host, as its service manager would (docs/deployment.md: systemd's
        Restart=always). On a loaded machine Ray may give up on a node's start (its raylet not
        registered within Ray's 30 s): the command starts it again itself, three times
        (coordinator/ray_start.py), then exits with that error."""
        for node in self.node_names:
            self.bed.restart_exited(node)
        return self.members() == set(self.node_names) or None

    def logs(self, lines: int = 15) -> str:
        """The last lines of every host's log in the bed's work directory, and the warnings of
        the FiloPy actors on each Ray host (the ingesters log there), for a failure."""
        out = []
        for log in sorted(self.bed.workdir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(tail))
        for host in ("head", *NODES):
            said = [
                line
                for err in sorted(self.bed.ray_dir(host).glob("session_2*/logs/worker-*.err"))
                for line in err.read_text(errors="replace").splitlines()
                if not line.startswith((" ", "[")) and "INFO" not in line
            ]
            if said:
                out.append(f"--- Ray workers on {host}\n" + "\n".join(said[-lines:]))
        return "\n".join(out)

    def start_service(self, name: str) -> None:
        """Kafka, Cassandra or Redis on the host of that name, through scripts/services.sh."""
        self.bed.sh(
            name,
            ["bash", str(self.root / "scripts" / "services.sh"), "up", name],
            env={
                "FILOPY_SERVICES_HOST": self.bed.ip(name),
                "FILOPY_SERVICES_DIR": str(self.dir / name),
                "FILOPY_SERVICES_CACHE": str(self.root / ".services" / "cache"),
            },
            timeout=900,
        )

    def start_head(self) -> float:
        """Start the head (Ray's control state in Redis); seconds until its REST API answered.
        A head whose `filopy head` exited is started again on a clean host, as its service
        manager would (as `_members_restarting_exited` does for nodes): on a loaded machine Ray
        may give up on the head's start ("The current node timed out during startup", seen in
        a CI with two beds starting at once) more often than the command starts it again."""
        started = time.monotonic()
        argv = [self.filopy_bin, "head", "--bind", "head", "--redis", "redis:6380"]
        self.bed.spawn("head", argv, env=self.env)

        def answering() -> Any:
            return None if self.bed.restart_exited("head") else self.rest("/__liveness")

        wait_for("the REST API answering on head", answering, 300)
        return time.monotonic() - started

    def start_gateway(self) -> None:
        if self.bed.reaches("client", "gateway", 8081):
            return  # started by an earlier test of the module
        # Kafka's acks not in within 5 s: the writer gets 503 + Retry-After (default 30 s).
        argv = [self.filopy_bin, "gateway", "--host", "gateway", "--port", "8081",
                "--ack-timeout-s", "5"]  # fmt: skip
        self.bed.spawn("gateway", argv, env=self.env)
        wait_for("the gateway answering", lambda: self.bed.reaches("client", "gateway", 8081))

    def start_producer(self, dataset: str, out: Path, series: int = 20) -> subprocess.Popen[bytes]:
        """tests/netbed/producer.py on the client host, writing through the gateway."""
        url = f"http://gateway:8081/ingest/{dataset}/api/v2/write"
        argv = [str(self.root / ".venv" / "bin" / "python"), "-m", "tests.netbed.producer", url,
                "--series", str(series), "--out", str(out)]  # fmt: skip
        return self.bed.spawn("client", argv, log="producer.log", cwd=self.root)

    def join(self, node: str) -> subprocess.Popen[bytes]:
        argv = [self.filopy_bin, "node", "join", "--address", HEAD_ADDRESS, "--name", node]
        return self.bed.spawn(node, argv, env=self.env)

    def stop(self) -> None:
        for host in ("client", "gateway", "head", *NODES, "kafka", "redis", "cassandra"):
            self.bed.kill(host)
        self.bed.clear_ray_dirs()

    # ----- looking at it from the client host ---------------------------------------------------

    def rest(self, path: str, *, method: str = "GET", body: Any = None) -> Any:
        """`data` of a REST call made from the client host; BedError if it fails."""
        argv = ["curl", "-sS", "--fail-with-body", "--max-time", "30", "-X", method]
        if body is not None:
            argv += ["-H", "content-type: application/json", "--data", json.dumps(body)]
        out = self.bed.sh("client", [*argv, REST + path], timeout=60).stdout
        return json.loads(out)["data"]

    def cli(self, *args: str, host: str = "head", timeout: float = 120.0) -> str:
        """`filopy ARGS` on `host` as an operator types it there; its output. The commands that
        take --address join the Ray cluster as a driver, which needs a Ray node on its machine:
        they run on the head (or a node), not on `client`, which uses the REST API."""
        argv = [self.filopy_bin, *args]
        proc = self.bed.sh(host, argv, env=self.env, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise BedError(f"{shlex.join(args)} on {host}: {proc.stderr.strip()}")
        return proc.stdout

    def members(self) -> set[str]:
        return {m["name"] for m in self.rest("/api/v1/nodes")["members"]}

    def wait_members(self, names: set[str], timeout_s: float = 180.0) -> None:
        wait_for(f"members {sorted(names)}", lambda: self.members() == names or None, timeout_s)

    def shards(self, dataset: str) -> list[dict[str, Any]]:
        return list(self.rest(f"/api/v1/cluster/{dataset}/status"))

    def wait_active(
        self, dataset: str, *, avoid: Sequence[str] = (), timeout_s: float = 120.0
    ) -> list[dict[str, Any]]:
        """Every shard Active, on a node not in `avoid`; the shard list."""

        seen: list[Any] = []

        def done() -> list[dict[str, Any]] | None:
            shards = self.shards(dataset)
            seen[:] = [(s["shard"], s["status"], s["node"]) for s in shards]
            ok = all(s["status"] == "Active" and s["node"] not in avoid for s in shards)
            return shards if ok else None

        what = f"{dataset}: every shard Active (not on {list(avoid)})"
        try:
            return wait_for(what, done, timeout_s)
        except AssertionError as e:
            raise AssertionError(f"{e}; shards (shard, status, node): {seen}") from None

    def tenures(self, dataset: str) -> list[dict[str, Any]]:
        """Every member's ingesters' tenures of `dataset` (tests/netbed/tenures.py, on the head)."""
        argv = [str(self.root / ".venv" / "bin" / "python"), "-m", "tests.netbed.tenures", dataset,
                "--address", HEAD_ADDRESS]  # fmt: skip
        proc = self.bed.sh("head", argv, env=self.env, cwd=self.root, timeout=120)
        return list(json.loads(proc.stdout.strip().splitlines()[-1]))

    def metric(self, name: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
        """The samples of metric `name` on the head's /metrics (read from the client host) whose
        labels include `labels`: labels -> value."""
        return self.metrics(name, **labels)[name]

    def metrics(
        self, *names: str, **labels: str
    ) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        """Several metrics from one scrape (values that must be compared at one moment): name ->
        labels -> value, for the samples whose labels include `labels`."""
        text = self.bed.sh("client", ["curl", "-sS", "--max-time", "30", f"{REST}/metrics"])
        out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {n: {} for n in names}
        for fam in text_string_to_metric_families(text.stdout):
            for sample in fam.samples:
                if sample.name in out and labels.items() <= sample.labels.items():
                    out[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
        return out

    def shards_with_data(self, dataset: str) -> set[int]:
        """The shards of `dataset` that ingested samples (a writer's series fill only as many
        shards as the shard key's spread allows)."""
        got = self.metric("filopy_ingested_samples_total", dataset=dataset)
        return {int(dict(k)["shard"]) for k, v in got.items() if v > 0}

    def wait_settled(self, dataset: str, timeout_s: float = 180.0) -> dict[int, str]:
        """Every shard Active and rebalancing balanced (nothing left to move): shard -> node."""

        def settled() -> dict[int, str] | None:
            plan = self.rest(f"/api/v1/cluster/{dataset}/plan")
            if plan["moves"] or plan["held_back"] != "balanced":
                return None
            shards = self.shards(dataset)
            if not all(s["status"] == "Active" for s in shards):
                return None
            return {s["shard"]: s["node"] for s in shards}

        return wait_for(f"{dataset}: every shard Active, nothing to rebalance", settled, timeout_s)

    def writing_to(
        self, dataset: str, shards: int = 8
    ) -> tuple[subprocess.Popen[bytes], Path, dict[int, str]]:
        """A new dataset over at least two nodes with a writer on it, once rebalancing settled:
        the producer, where it records what was acked, and shard -> node."""
        self.cli("dataset", "create", dataset, "--shards", str(shards), "--min-nodes", "2",
                 "--address", HEAD_ADDRESS)  # fmt: skip
        producer, out = self.start_writer(dataset)
        return producer, out, self.wait_settled(dataset)

    def busy_node(self, dataset: str, owners: dict[int, str]) -> str:
        """The owner of a shard the writer fills (a writer's series fill only as many shards as
        the spread allows; an idle shard commits nothing, so it is never fenced nor behind)."""
        busy = wait_for(
            "shards ingesting the writer's samples", lambda: self.shards_with_data(dataset)
        )
        return owners[min(busy)]

    def start_writer(self, dataset: str) -> tuple[subprocess.Popen[bytes], Path]:
        """The gateway (if not up) and a producer writing to `dataset` through it, once it has
        been acknowledged a few rounds; the producer and where it records what was acked."""
        self.start_gateway()
        out = self.dir / f"acked-{dataset}.json"
        producer = self.start_producer(dataset, out)
        wait_for("the writer acknowledged", lambda: len(self.acked(out)["acked_ts"]) >= 25, 120)
        return producer, out

    # ----- what the writer was told, against what is stored ------------------------------------

    @staticmethod
    def acked(out: Path) -> dict[str, Any]:
        """The producer's record so far (tests/netbed/producer.py)."""
        if not out.exists():
            return {"acked_ts": [], "final": False, "series": 0}
        return dict(json.loads(out.read_text()))

    def stop_producer(self, producer: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
        producer.send_signal(signal.SIGTERM)
        producer.wait(timeout=60)
        record = self.acked(out)
        assert record["final"], "the producer wrote its final record"
        return record

    def assert_stored_once(self, dataset: str, record: dict[str, Any]) -> None:
        """Every acknowledged round is stored, once, in every series: per series the count of
        samples equals the rounds acknowledged (a lost sample makes it lower, a duplicate at
        another timestamp higher; one at the same timestamp is dropped by the memstore)."""
        acked = sorted(record["acked_ts"])
        series = int(record["series"])
        assert acked, "the producer was acknowledged"
        at = (acked[-1] + 1000) / 1000
        query = urlencode({"query": "count_over_time(netbed_load[1h])", "time": f"{at:.3f}"})
        seen: list[Any] = []

        def counts() -> bool:
            result = self.rest(f"/promql/{dataset}/api/v1/query?{query}")["result"]
            got = {r["metric"]["series"]: float(r["value"][1]) for r in result}
            seen[:] = [len(got), sorted(set(got.values()))]
            return len(got) == series and set(got.values()) == {float(len(acked))}

        try:
            wait_for("every acknowledged sample stored once", counts, 120)
        except AssertionError:
            raise AssertionError(
                f"{len(acked)} rounds acknowledged in {series} series; seen {seen[0]} series "
                f"with counts {seen[1]}\n{self.logs()}"
            ) from None
