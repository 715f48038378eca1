"""HTTP ingestion through one `filopy gateway` process, side by side with VictoriaMetrics.

Needs Kafka from `scripts/services.sh up kafka` and Debian's victoria-metrics package
(/usr/bin/victoria-metrics). Starts, each in a temporary directory:
- `python -m filopy.cli gateway --port P` (SQLite store holding one 8-shard dataset, real Kafka);
- `victoria-metrics -storageDataPath ... -httpListenAddr 127.0.0.1:P2` (single node).

The same samples are pre-built as (a) remote write 1.0 requests of 2,000 samples (snappy
protobuf, as Prometheus sends: many series with 8 labels, one sample per series per request,
the same series in the same request scrape after scrape), (b) Influx line protocol bodies of
the same samples (gzip, as Telegraf sends; `precision=ms`) and, with `--protocols rw2`, (c)
remote write 2.0 requests (FiloPy only: VictoriaMetrics 1.79 has no 2.0 receiver). One client
(threads, one keep-alive connection each, pre-encoded bodies) sends them to each server; a run
is timed from the first request to the last answer, and every answer must be 204. One warm-up
scrape per server process and protocol is sent first and not timed (both servers then know
every series: the steady state). `--gateways N` starts N gateway processes of the one dataset
(as behind a load balancer: each learns every series in its own warm-up) and spreads the
connections over them.

What a 204 means differs: FiloPy answers once Kafka acknowledged every sample (acks=all);
VictoriaMetrics once the samples are parsed and added to its in-memory buffers (written to disk
within about a second, not fsynced). CPU seconds of each server process (and of the Kafka
broker during FiloPy's runs, and of this client) are read from /proc: the machine's cores are
shared by the client, the servers and the broker.

Results: bench/results/ingest_http.txt (`--out -` prints only).
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import itertools
import os
import platform
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cramjam

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from procstat import cpu_seconds  # noqa: E402

from core.config import load_settings  # noqa: E402
from core.dataset import Dataset, LabelLimits, SourceSettings  # noqa: E402
from filopy.auth import TokenBook  # noqa: E402
from ingest.topics import ensure_topic  # noqa: E402
from ingest.wire.line_protocol import decode_lines  # noqa: E402
from ingest.wire.prompb import write_v2_pb2  # noqa: E402
from ingest.wire.prompb.remote_pb2 import WriteRequest  # noqa: E402
from store import open_stores  # noqa: E402

BOOTSTRAP = f"127.0.0.1:{os.environ.get('FILOPY_KAFKA_PORT', '9092')}"
VICTORIA = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
KAFKA_PID_FILE = ROOT / ".services" / "run" / "kafka.pid"
SHARDS = 8
SAMPLES_PER_REQUEST = 2_000
SCRAPE_INTERVAL_MS = 15_000
RW1, RW2, LP = "remote write 1.0", "remote write 2.0", "line protocol"


# ----- the samples ---------------------------------------------------------------------------


def series_labels(n: int) -> list[list[tuple[str, str]]]:
    """`n` series of a node-exporter-like fleet, 8 labels each, sorted by name as Prometheus
    sends them (`__name__` first)."""
    modes = ["idle", "user", "system", "iowait", "irq", "softirq", "steal", "nice"]
    out = []
    for i in range(n):
        host = i // 500
        labels = {
            "__name__": f"node_metric_{i % 100}",
            "cluster": f"c{host % 4}",
            "cpu": str(i % 16),
            "env": "prod",
            "instance": f"host-{host:04d}.example.net:9100",
            "job": "node",
            "mode": modes[(i // 16) % len(modes)],
            "region": ["eu-west-1", "us-east-1", "ap-south-1"][host % 3],
        }
        out.append(sorted(labels.items()))
    return out


@dataclass(frozen=True, slots=True)
class Workload:
    """The same samples, pre-encoded per protocol; the first `per_scrape` bodies are warm-up."""

    series: int
    scrapes: int  # timed scrapes (one more is sent first, untimed)
    per_scrape: int  # requests per scrape
    remote_write: list[bytes]  # snappy-compressed prometheus.WriteRequest
    lines: list[bytes]  # gzip-compressed line protocol, ms timestamps
    remote_write_v2: list[bytes]  # snappy-compressed io.prometheus.write.v2.Request (or none)

    def bodies(self, protocol: str) -> list[bytes]:
        return {RW1: self.remote_write, LP: self.lines, RW2: self.remote_write_v2}[protocol]

    @property
    def timed_samples(self) -> int:
        return self.series * self.scrapes


def _v2_request(series: list[list[tuple[str, str]]], values: list[float], t: int) -> bytes:
    """One remote write 2.0 request: its own symbol table, each series' label refs."""
    req = write_v2_pb2.Request()
    symbols: dict[str, int] = {"": 0}
    for labels, v in zip(series, values, strict=True):
        ts = req.timeseries.add()
        refs = []
        for name, value in labels:
            refs.append(symbols.setdefault(name, len(symbols)))
            refs.append(symbols.setdefault(value, len(symbols)))
        ts.labels_refs.extend(refs)
        s = ts.samples.add()
        s.value = v
        s.timestamp = t
    req.symbols.extend(symbols)
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


def build(n_series: int, scrapes: int, seed: int = 1, v2: bool = False) -> Workload:
    """(1 + scrapes) scrapes of every series, cut into requests of 2,000 series each (as 2.0
    requests too with `v2`)."""
    rng = random.Random(seed)
    series = series_labels(n_series)
    t0 = (int(time.time() * 1000) // SCRAPE_INTERVAL_MS - scrapes - 10) * SCRAPE_INTERVAL_MS
    keys = []  # line protocol series key: measurement,tag=v,...
    for labels in series:
        name = labels[0][1]
        keys.append(name + "," + ",".join(f"{k}={v}" for k, v in labels[1:]))
    protos = []  # each series' labels as a TimeSeries, copied into every request (fast)
    for labels in series:
        proto = WriteRequest().timeseries.add()
        for name, value in labels:
            lb = proto.labels.add()
            lb.name = name
            lb.value = value
        protos.append(proto)
    rw: list[bytes] = []
    lines: list[bytes] = []
    rw2: list[bytes] = []
    for k in range(scrapes + 1):
        t = t0 + k * SCRAPE_INTERVAL_MS
        for lo in range(0, n_series, SAMPLES_PER_REQUEST):
            req = WriteRequest()
            text = []
            values = []
            for i in range(lo, min(lo + SAMPLES_PER_REQUEST, n_series)):
                v = round(rng.uniform(0, 1000), 3) if i % 2 else float(k * 10 + i % 7)
                values.append(v)
                ts = req.timeseries.add()
                ts.CopyFrom(protos[i])
                s = ts.samples.add()
                s.value = v
                s.timestamp = t
                text.append(f"{keys[i]} value={v!r} {t}")
            rw.append(bytes(cramjam.snappy.compress_raw(req.SerializeToString())))
            lines.append(gzip.compress("\n".join(text).encode(), compresslevel=6))
            if v2:
                rw2.append(_v2_request(series[lo : lo + SAMPLES_PER_REQUEST], values, t))
    per_scrape = -(-n_series // SAMPLES_PER_REQUEST)
    return Workload(n_series, scrapes, per_scrape, rw, lines, rw2)


# ----- the servers ---------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kafka_pid() -> int | None:
    """The broker scripts/services.sh started: its pid file, else the one process whose command
    line names it (None if there is no such process, or several)."""
    try:
        return int(KAFKA_PID_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"-Dfilopy.service=kafka\0" in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found[0] if len(found) == 1 else None


class Server:
    """A server process and the URLs it takes each protocol at."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], health: str, log: Path
    ) -> None:
        self.name = name
        self.argv = argv
        log.parent.mkdir(parents=True, exist_ok=True)
        self.health = health
        self._log = log.open("wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.paths: dict[str, str] = {}  # protocol -> path (a protocol it does not take: none)
        self.headers: dict[str, str] = {}  # sent with every request (FiloPy's: its token)
        self.port = 0
        self.peers: list[Server] = []  # more processes of the same server (`--gateways`)

    @property
    def ports(self) -> list[int]:
        """Every process' port: the client spreads its connections over them."""
        return [self.port, *(p.port for p in self.peers)]

    def wait_ready(self, port: int, timeout_s: float = 60.0) -> None:
        self.port = port
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: see its log")
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", self.health)
                if c.getresponse().status == 200:
                    c.close()
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready on port {port} in {timeout_s} s")
            time.sleep(0.2)

    def get(self, path: str) -> str:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", path, headers=self.headers)
        body = c.getresponse().read().decode()
        c.close()
        return body

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid) + sum(p.cpu() for p in self.peers)

    def stop(self) -> None:
        for peer in self.peers:
            peer.stop()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def start_filopy(tmp: Path, extra_env: dict[str, str] | None = None, processes: int = 1) -> Server:
    """`filopy gateway` on a SQLite store holding one dataset whose topic exists; with
    `processes` > 1, that many gateways of the same dataset (as behind a load balancer)."""
    db = tmp / "filopy.db"
    env = {
        **os.environ,
        "FILOPY_STATE_DIR": str(tmp / "state"),
        "FILOPY_STORE__BACKEND": "sqlite",
        "FILOPY_STORE__SQLITE_PATH": str(db),
        "FILOPY_KAFKA__BOOTSTRAP_SERVERS": BOOTSTRAP,
        "PYTHONSAFEPATH": "1",  # not the working directory first: `--gateway-env PYTHONPATH=`
        **(extra_env or {}),
    }
    base = load_settings()
    settings = base.model_copy(
        update={
            "store": base.store.model_copy(update={"backend": "sqlite", "sqlite_path": db}),
            "kafka": base.kafka.model_copy(update={"bootstrap_servers": BOOTSTRAP}),
        }
    )
    ds = Dataset(
        name=f"bench{uuid.uuid4().hex[:8]}",
        num_shards=SHARDS,
        source=SourceSettings(bootstrap_servers=BOOTSTRAP),
    )
    ensure_topic(ds, BOOTSTRAP)
    meta, columns = open_stores(settings)
    try:
        meta.create_dataset(ds)
        # Auth is on, as by default: every request carries a token, as agents' do (read too:
        # the bench reads the gateway's /metrics).
        _, token = TokenBook(meta).create("bench", ["write", "read"])
    finally:
        meta.close()
        columns.close()

    def gateway(k: int) -> Server:
        port = free_port()
        argv = [sys.executable, "-m", "filopy.cli", "gateway", "--port", str(port)]
        own = {**env, "FILOPY_STATE_DIR": str(tmp / f"state{k or ''}")}
        name = "FiloPy gateway" if processes == 1 else f"FiloPy x{processes}"
        server = Server(name, argv, own, "/__liveness", tmp / f"gateway{k or ''}.log")
        server.wait_ready(port)
        return server

    server = gateway(0)
    server.peers = [gateway(k) for k in range(1, processes)]
    server.paths = {
        RW1: f"/ingest/{ds.name}/api/v1/write",
        RW2: f"/ingest/{ds.name}/api/v1/write",
        LP: f"/ingest/{ds.name}/write?precision=ms",
    }
    server.dataset = ds  # type: ignore[attr-defined]
    server.headers = {"Authorization": f"Bearer {token}"}
    return server


def start_victoria(tmp: Path) -> Server:
    port = free_port()
    argv = [
        VICTORIA,
        f"-storageDataPath={tmp / 'vm-data'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=1y",
        "-loggerLevel=ERROR",
    ]
    server = Server("VictoriaMetrics", argv, dict(os.environ), "/health", tmp / "vm.log")
    server.wait_ready(port)
    server.paths = {RW1: "/api/v1/write", LP: "/write?precision=ms"}
    return server


# ----- the client ----------------------------------------------------------------------------


def send_all(
    ports: Sequence[int],
    path: str,
    bodies: Sequence[bytes],
    headers: dict[str, str],
    connections: int,
) -> float:
    """Send every body (each once, in order across `connections` threads, connection k to
    `ports[k % len(ports)]`); seconds from the first request to the last answer. Any answer
    but 204 fails the run."""
    counter = itertools.count()  # next() is atomic under the GIL
    failures: list[str] = []

    def worker(port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            while not failures:
                i = next(counter)
                if i >= len(bodies):
                    return
                conn.request("POST", path, body=bodies[i], headers=headers)
                r = conn.getresponse()
                answer = r.read()
                if r.status != 204:
                    failures.append(f"request {i}: {r.status} {answer[:300]!r}")
        finally:
            conn.close()

    threads = [
        threading.Thread(target=worker, args=(ports[k % len(ports)],)) for k in range(connections)
    ]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t
    if failures:
        raise RuntimeError(f"{path}: {failures[0]}")
    return elapsed


RW_HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
    "User-Agent": "bench_ingest_http",
}
RW2_HEADERS = {
    **RW_HEADERS,
    "Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
    "X-Prometheus-Remote-Write-Version": "2.0.0",
}
LP_HEADERS = {"Content-Type": "text/plain; charset=utf-8", "Content-Encoding": "gzip"}
HEADERS = {RW1: RW_HEADERS, RW2: RW2_HEADERS, LP: LP_HEADERS}


@dataclass(slots=True)
class Run:
    server: str
    protocol: str
    samples: int
    seconds: float
    server_cpu: float
    broker_cpu: float | None
    client_cpu: float

    @property
    def rate(self) -> float:
        return self.samples / self.seconds

    @property
    def per_cpu(self) -> float:
        return self.samples / self.server_cpu if self.server_cpu > 0 else float("nan")


def timed_run(
    server: Server, protocol: str, work: Workload, connections: int, broker: int | None
) -> Run:
    bodies, path = work.bodies(protocol), server.paths[protocol]
    headers = {**HEADERS[protocol], **server.headers}
    for port in server.ports:  # warm-up: each process meets every series once
        send_all([port], path, bodies[: work.per_scrape], headers, connections)
    time.sleep(1.0)
    cpu0, b0, c0 = server.cpu(), broker and cpu_seconds(broker), time.process_time()
    seconds = send_all(server.ports, path, bodies[work.per_scrape :], headers, connections)
    cpu1, b1, c1 = server.cpu(), broker and cpu_seconds(broker), time.process_time()
    return Run(
        server.name,
        protocol,
        work.timed_samples,
        seconds,
        cpu1 - cpu0,
        (b1 - b0) if broker else None,
        c1 - c0,
    )


FILOPY_PROTOCOL_LABELS = {
    RW1: 'protocol="prometheus_remote_write"',
    RW2: 'protocol="prometheus_remote_write_v2"',
    LP: 'protocol="influx_v1"',
}
VM_ROW_TYPES = {RW1: 'type="promremotewrite"', LP: 'type="influx"'}


def check_counts(
    filopy: Server | None, vm: Server | None, work: Workload, protos: list[str]
) -> None:
    """Each server counted every sample sent (warm-up included: once per process) as stored."""
    if filopy is not None:
        texts = [s.get("/metrics") for s in (filopy, *filopy.peers)]
        n = work.series * (work.scrapes + len(texts))
        for proto in protos:
            label = FILOPY_PROTOCOL_LABELS[proto]
            got = sum(_metric(t, "filopy_http_ingest_samples_accepted_total", label) for t in texts)
            if got != n:
                raise RuntimeError(f"FiloPy acked {got} {proto} samples, sent {n}")
    if vm is not None:
        text = vm.get("/metrics")
        n = work.series * (work.scrapes + 1)
        for proto in protos:
            if proto in VM_ROW_TYPES:
                got = _metric(text, "vm_rows_inserted_total", VM_ROW_TYPES[proto])
                if got != n:
                    raise RuntimeError(f"VictoriaMetrics inserted {got} {proto} rows, sent {n}")


def _metric(text: str, name: str, label_part: str) -> int:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and label_part in line.split("}")[0]:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


# ----- the report ----------------------------------------------------------------------------


def _processes(n: int) -> str:
    return "one `filopy gateway` process" if n == 1 else f"{n} `filopy gateway` processes"


def report(runs: list[Run], work: Workload, args: argparse.Namespace, note: str) -> str:
    per_request = work.scrapes * work.per_scrape * 1024

    def kib(bodies: list[bytes]) -> float:
        return sum(len(b) for b in bodies[work.per_scrape :]) / per_request

    out = [
        f"HTTP ingestion: {_processes(args.gateways)} vs VictoriaMetrics single-node, same samples",
        f"{time.strftime('%Y-%m-%d %H:%M')}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs shared by client, servers and the Kafka broker (load average "
        f"{os.getloadavg()[0]:.1f} at the end)",
        "command: " + shlex.join(["python", *sys.argv]),
        f"{work.series:,} series x 8 labels; {work.scrapes} timed scrapes (+1 warm-up per "
        f"process) = "
        f"{work.timed_samples:,} samples in requests of {SAMPLES_PER_REQUEST:,} samples "
        f"(1 per series); {args.connections} client connections",
        f"bodies: remote write 1.0 snappy {kib(work.remote_write):.1f} KiB/request; line "
        f"protocol gzip {kib(work.lines):.1f} KiB/request, precision=ms"
        + (
            f"; remote write 2.0 snappy {kib(work.remote_write_v2):.1f} KiB/request"
            if work.remote_write_v2
            else ""
        ),
        "FiloPy 204 = every sample acked by Kafka (acks=all, 8 partitions); VictoriaMetrics 204 ="
        " parsed and in its in-memory buffers (on disk within ~1 s, not fsynced)",
        *([note] if note else []),
        "",
        f"{'protocol':<18}{'server':<17}{'samples/s':>12}{'seconds':>9}{'server CPU s':>14}"
        f"{'samples/CPU s':>15}{'broker CPU s':>14}{'client CPU s':>14}",
    ]
    for r in runs:
        broker = f"{r.broker_cpu:.2f}" if r.broker_cpu is not None else "-"
        out.append(
            f"{r.protocol:<18}{r.server:<17}{r.rate:>12,.0f}{r.seconds:>9.2f}"
            f"{r.server_cpu:>14.2f}{r.per_cpu:>15,.0f}{broker:>14}{r.client_cpu:>14.2f}"
        )
    out.append("")
    for proto in (RW1, LP):
        f = next((r for r in runs if r.protocol == proto and r.server.startswith("FiloPy")), None)
        v = next((r for r in runs if r.protocol == proto and r.server.startswith("Victoria")), None)
        if f and v:
            out.append(
                f"ratio FiloPy/VictoriaMetrics, {proto}: {f.rate / v.rate:.2f} in samples/s, "
                f"{f.per_cpu / v.per_cpu:.2f} in samples per server CPU second"
            )
    return "\n".join(out) + "\n"


def decode_only(work: Workload, rounds: int = 3) -> str:
    """The gateway's line protocol decoding alone, in this process: every timed body decoded
    in turn (after the warm-up scrape, as the server sees them: each series' entries cold
    again by its next scrape), thread CPU time, best of `rounds`."""
    bodies = [gzip.decompress(b) for b in work.lines]
    warm, timed = bodies[: work.per_scrape], bodies[work.per_scrape :]
    limits = LabelLimits()
    received = int(time.time() * 1000)
    for body in warm:
        decode_lines(body, received, "_metric_", "ms", limits)
    best = float("inf")
    for _ in range(rounds):
        t = time.thread_time()
        for body in timed:
            decode_lines(body, received, "_metric_", "ms", limits)
        best = min(best, time.thread_time() - t)
    samples = work.timed_samples
    return (
        f"line protocol decode only (decode_lines, one thread): {samples / best:,.0f} samples "
        f"per CPU second, {best / len(timed) * 1e3:.2f} ms per request of "
        f"{samples // len(timed):,} lines (best of {rounds}; load average "
        f"{os.getloadavg()[0]:.1f})"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--series", type=int, default=50_000)
    # 60 scrapes: ~2 s timed per server and protocol (20 were ~0.5 s: too short on a shared
    # machine). 8 connections: with 4, FiloPy's gateway idles while each request waits for
    # Kafka's acknowledgements (docs/ingestion-http.md); senders at this rate run several.
    p.add_argument("--scrapes", type=int, default=60, help="timed scrapes (one more warms up)")
    p.add_argument("--connections", type=int, default=8)
    p.add_argument(
        "--gateways",
        type=int,
        default=1,
        help="FiloPy gateway processes of the one dataset, the connections spread over them",
    )
    p.add_argument("--servers", default="filopy,vm", help="filopy, vm or both")
    p.add_argument("--protocols", default="rw,lp", help="some of rw, lp, rw2 (FiloPy only)")
    p.add_argument(
        "--gateway-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for the gateway process (repeatable), e.g. "
        "PYTHONPATH=DIR with httptools and uvloop in DIR, which uvicorn then uses",
    )
    p.add_argument("--note", default="", help="a line for the results file")
    p.add_argument(
        "--decode-only",
        action="store_true",
        help="only time the line protocol decoder on the same bodies, in process (no servers)",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "ingest_http.txt"))
    args = p.parse_args(argv)
    servers, protocols = args.servers.split(","), args.protocols.split(",")
    t = time.perf_counter()
    work = build(args.series, args.scrapes, v2="rw2" in protocols)
    print(
        f"built {len(work.remote_write)} requests per protocol in {time.perf_counter() - t:.1f} s"
    )
    if args.decode_only:
        print(decode_only(work))
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench-ingest-http-"))
    started: list[Server] = []
    runs: list[Run] = []
    try:
        filopy = vm = None
        if "filopy" in servers:
            env = dict(kv.split("=", 1) for kv in args.gateway_env)
            filopy = start_filopy(tmp / "filopy", env, args.gateways)
            started.append(filopy)
        if "vm" in servers:
            vm = start_victoria(tmp / "vm")
            started.append(vm)
        broker = kafka_pid()
        names = {"rw": RW1, "lp": LP, "rw2": RW2}
        for proto in (names[p] for p in protocols):
            for server in (s for s in (filopy, vm) if s is not None and proto in s.paths):
                run = timed_run(
                    server, proto, work, args.connections, broker if server is filopy else None
                )
                runs.append(run)
                print(f"{proto:<18}{server.name:<17}{run.rate:>12,.0f} samples/s", flush=True)
                time.sleep(2.0)
        check_counts(filopy, vm, work, [names[p] for p in protocols])
    except BaseException:
        print(f"failed; the servers' logs are kept under {tmp}", file=sys.stderr)
        raise
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        for s in started:
            s.stop()
    text = report(runs, work, args, args.note)
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
