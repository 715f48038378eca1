"""docs/deployment.md, every command block as written, each on the machine its first line names.

A block's first line says where it runs: `# on HOST`, or `# on HOST, keeps running` for a server
that stays in the foreground (the test starts it in the background on that host and waits until
it serves; one that exits is started again, as the page's service manager would: Ray may give up
on a node's start on a loaded machine more often than the command retries it, "The current node
timed out during startup"). Blocks run in the page's order with `bash -e -c`, from the repository
root, with the project's virtual environment on PATH (the page's "FiloPy installed") and nothing
else of this test process: no Ray loopback switch, no Ray address. Kafka's and Cassandra's data
live in the bed's work directory (FILOPY_SERVICES_DIR), the jars come from the suite's cache.

A new block is run too; one whose first line names no host of the bed fails the test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.netbed.bed import Bed, BedError
from tests.netbed.cluster import wait_for

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "deployment.md"
WHERE = re.compile(r"^# on ([\w-]+)(, keeps running)?(, .*)?$")
# The token the page has the head make for the client (in the working directory, shared here).
CLIENT_TOKEN = ROOT / "client.token"
# The store of the page's head: where the test's own probe token is made.
STORE_ENV = {
    "FILOPY_STORE__BACKEND": "cassandra",
    "FILOPY_CASSANDRA__CONTACT_POINTS": '["cassandra"]',
}

# How often a server block may exit and be started again before the test fails with its output.
RESTARTS = 3

# What a block must print (regular expressions, in order), by its last command's first word(s).
EXPECTED = {
    "kafka": [r"kafka: ready"],
    "cassandra": [r"cassandra: ready"],
    "head": [r"created: prom", r"----- prom: 8 shards -----"],
    "client": [
        r'"status":"Active"',
        r'"metric":\{[^}]*"__name__":"cpu_usage"[^}]*\},"value":\[[\d.]+,"0\.5"\]',
        r"----- prom: 8 shards -----",  # filopy status --url
        r"\n1 series",  # filopy query --url: count(cpu_usage) is one series
    ],
}


def blocks() -> list[tuple[str, bool, str]]:
    """(host, keeps running, script) of every bash block, in order."""
    found = []
    for m in re.finditer(r"^```bash\n(.*?)^```\s*$", DOC.read_text(), re.S | re.M):
        first, _, _ = m.group(1).partition("\n")
        where = WHERE.match(first.strip())
        assert where, f"docs/deployment.md: a block's first line must say where it runs: {first}"
        found.append((where.group(1), bool(where.group(2)), m.group(1)))
    return found


@pytest.fixture
def clean_bed(bed: Bed) -> Iterator[Bed]:
    """The session's bed with nothing running, and nothing left running after the test."""
    for host in bed.hosts:
        bed.kill(host)
    bed.heal()
    bed.clear_ray_dirs()
    yield bed
    for host in bed.hosts:
        bed.kill(host)
    bed.clear_ray_dirs()


def test_every_block_of_the_deployment_page_runs_as_written(clean_bed: Bed) -> None:
    bed = clean_bed
    env = {
        "PATH": f"{ROOT / '.venv' / 'bin'}:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "VIRTUAL_ENV": str(ROOT / ".venv"),
        "FILOPY_SERVICES_DIR": str(bed.workdir / "deployment-services"),
        "FILOPY_SERVICES_CACHE": str(ROOT / ".services" / "cache"),
        "FILOPY_STATE_DIR": str(bed.workdir / "deployment-state"),
    }
    ran = []
    CLIENT_TOKEN.unlink(missing_ok=True)
    _probe.clear()  # a token of an earlier run's store
    for host, keeps_running, script in blocks():
        assert host in bed.hosts, f"docs/deployment.md names a machine the bed lacks: {host}"
        host_env = env
        if keeps_running:
            log = f"deployment-{host}.log"
            bed.spawn(host, ["bash", "-e", "-c", script], env=host_env, log=log, cwd=ROOT)
            wait_for(f"{host} serving", _ready(bed, host, bed.workdir / log), 240)
        else:
            proc = bed.sh(host, ["bash", "-e", "-c", script], env=host_env, cwd=ROOT, timeout=600)
            _expect(host, proc.stdout + proc.stderr, EXPECTED.get(host, []))
        ran.append(host)
    assert ran[-1] == "client" and {"head", "node-1", "node-2", "gateway"} <= set(ran)
    CLIENT_TOKEN.unlink(missing_ok=True)
    # the page's own order: the dataset exists before the client writes to it


def _ready(bed: Bed, host: str, log: Path) -> Callable[[], bool]:
    """When a server block serves: the head and nodes say so in their output, the gateway's port
    answers from the client's machine. A block that exited is started again (`RESTARTS` times at
    most); its output from then on is what counts."""
    start, restarts = 0, 0  # where the running start's output begins in the log

    def check() -> bool:
        nonlocal start, restarts
        if bed.exited(host) is not None:
            bed.kill(host)  # and whatever it started: nothing writes to its log any more
            whole = log.read_text(errors="replace")
            last, start = whole[start:], len(whole)
            restarts += 1
            if restarts > RESTARTS:
                raise AssertionError(f"{host}'s block exited {restarts} times:\n{last[-2000:]}")
            print(f"{host}'s block exited; started again:\n{last[-1000:]}")
            bed.restart(host)
            return False
        text = log.read_text(errors="replace")[start:] if log.exists() else ""
        if host == "head":
            return "FiloPy singleton ready" in text
        if host.startswith("node-"):
            return "joined the cluster" in text and _member(bed, host)
        if host == "gateway":
            return bed.reaches("client", "gateway", 8081)
        raise AssertionError(f"no readiness check for a server on {host}")

    return check


_probe: list[str] = []


def _probe_token(bed: Bed) -> str:
    """A read token of the test's own, made on the head in the page's store (auth is on)."""
    if not _probe:
        env = {"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin", **STORE_ENV}
        argv = ["filopy", "token", "create", "deployment-test", "--scope", "read"]
        _probe.append(bed.sh("head", argv, env=env, cwd=ROOT, timeout=120).stdout.strip())
    return _probe[0]


def _member(bed: Bed, node: str) -> bool:
    argv = ["curl", "-sS", "--max-time", "10", "-H", f"Authorization: Bearer {_probe_token(bed)}",
            "http://head:8080/api/v1/nodes"]  # fmt: skip
    try:
        out = bed.sh("client", argv)
    except BedError:
        return False
    return node in {m["name"] for m in json.loads(out.stdout)["data"]["members"]}


def _expect(host: str, output: str, patterns: list[str]) -> None:
    at = 0
    for pattern in patterns:
        m = re.compile(pattern).search(output, at)
        assert m, f"the block on {host} did not print /{pattern}/ (after offset {at}):\n{output}"
        at = m.end()


def test_the_page_names_each_block_by_its_machine() -> None:
    """Runs without the bed: the parse the test above relies on, and the machines it names."""
    hosts = [h for h, _, _ in blocks()]
    assert hosts[:2] == ["kafka", "cassandra"] and hosts[-1] == "client"
