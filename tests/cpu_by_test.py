"""Where the suite's CPU goes, test by test, with every process a test starts counted.

A per-test profile inside pytest sees one process; a service test's CPU is mostly in others: the
Ray actors and agents of its cluster, the JVMs and CLI subprocesses it starts, the hosts of the
many-hosts bed. Each pytest-xdist worker moves itself into a cgroup of its own (cgroup v1
`cpuacct`: needs root), which every process it starts from then on inherits, so the cgroup's
CPU between a test's start and end is that test's, its module fixtures' set-up and tear-down
included (in the module's first and last test). Services started before the session (Kafka and
Cassandra by `make test`) are the machine's, not a test's: the report shows them as the rest.

    FILOPY_CPU_BY_TEST=1 make test

(tests/conftest.py then loads this plugin) prints the modules and tests that used the most CPU
at the end, and leaves one JSON line per test in `.pytest-cpu/`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
GROUP = "filopy-tests"
OUT = ".pytest-cpu"


def _usage_s(group: Path) -> float:
    return int((group / "cpuacct.usage").read_text()) / 1e9


class _Worker:
    """One worker's cgroup and its per-test lines."""

    def __init__(self, out: Path, name: str) -> None:
        self.group = CPUACCT / GROUP / name
        self.group.mkdir(parents=True, exist_ok=True)
        (self.group / "cgroup.procs").write_text(str(os.getpid()))
        self.lines = out / f"{name}.jsonl"

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        cpu, wall = _usage_s(self.group), time.monotonic()
        yield
        line = {
            "test": item.nodeid,
            "cpu_s": round(_usage_s(self.group) - cpu, 3),
            "wall_s": round(time.monotonic() - wall, 3),
        }
        with self.lines.open("a") as f:
            f.write(json.dumps(line) + "\n")


class _Report:
    """The controller: the machine's CPU over the session, and the summary at its end."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.machine = _usage_s(CPUACCT)
        self.wall = time.monotonic()

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        machine, wall = _usage_s(CPUACCT) - self.machine, time.monotonic() - self.wall
        rows = [json.loads(line) for f in self.out.glob("*.jsonl") for line in f.open()]
        by_module: Counter[str] = Counter()
        for r in rows:
            by_module[r["test"].split("::", 1)[0]] += r["cpu_s"]
        tests = sum(by_module.values())
        tr = terminalreporter
        tr.section("CPU by test (tests.cpu_by_test)")
        tr.write_line(
            f"machine: {machine:.0f} CPU s in {wall:.0f} s ({machine / wall:.2f} cores busy); "
            f"tests and what they started: {tests:.0f}; the rest (services, the machine): "
            f"{machine - tests:.0f}"
        )
        tr.write_line("modules using the most CPU (CPU s, share of the tests'):")
        for module, cpu in by_module.most_common(25):
            tr.write_line(f"  {cpu:8.1f}  {100 * cpu / max(tests, 1e-9):5.1f} %  {module}")
        tr.write_line("tests using the most CPU (CPU s, wall s):")
        for r in sorted(rows, key=lambda r: -r["cpu_s"])[:25]:
            tr.write_line(f"  {r['cpu_s']:8.1f}  {r['wall_s']:7.1f}  {r['test']}")
        tr.write_line(f"every test: {self.out}/*.jsonl")


def pytest_configure(config: pytest.Config) -> None:
    if not os.access(CPUACCT, os.W_OK):
        raise pytest.UsageError(
            f"tests.cpu_by_test needs a writable cgroup v1 cpuacct hierarchy at {CPUACCT} (root)"
        )
    out = config.rootpath / OUT
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:  # the controller (or a run without -n: then it is also the worker)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        config.pluginmanager.register(_Report(out), "cpu-by-test-report")
        if config.getoption("numprocesses", None):
            return
        worker = "main"
    config.pluginmanager.register(_Worker(out, worker), "cpu-by-test-worker")
