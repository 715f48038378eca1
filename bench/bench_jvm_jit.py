"""What the test suite's Kafka and Cassandra cost in CPU, with the JVM's default JIT and with C1
alone (`-XX:TieredStopAtLevel=1`, what `make test` gives the JVMs it starts).

Why: a test run starts a dozen JVMs (the local services, the secured ones, the many-hosts beds')
that live minutes and serve small tests; C2 compiles hot code for a payoff that only comes over a
long run, and its compilations take CPU from the tests on a two-core machine. Each round starts
the service through scripts/services.sh (its own directory and ports), runs test modules of the
suite against it, and reads the JVM's own CPU time before stopping it; the options alternate
round by round.

    .venv/bin/python bench/bench_jvm_jit.py [--rounds 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from procstat import cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {"default JIT": "", "C1 only": "-XX:TieredStopAtLevel=1"}
# The service, its ports, and test modules of the suite that use it.
WORKLOADS = {
    "cassandra": (
        {"FILOPY_CASSANDRA_PORT": "19042", "FILOPY_CASSANDRA_STORAGE_PORT": "17000"},
        ["tests/stores/test_contract.py", "tests/ingest/test_flush.py", "-k", "cassandra"],
    ),
    "kafka": (
        {"FILOPY_KAFKA_PORT": "19092"},
        [
            "tests/services/test_kafka_smoke.py",
            "tests/ingest/test_cluster_ingest.py",
            "-k",
            "not cassandra",
        ],
    ),
}


def one_round(service: str, options: str) -> tuple[float, float]:
    """(the JVM's CPU seconds from its start to the workload's end, the workload's wall seconds)."""
    ports, tests = WORKLOADS[service]
    with tempfile.TemporaryDirectory(prefix="jvm-jit-") as d:
        env = {
            **os.environ,
            **ports,
            "FILOPY_SERVICES_DIR": d,
            "FILOPY_SERVICES_CACHE": str(ROOT / ".services" / "cache"),
            "FILOPY_SERVICES_JVM_OPTS": options,
        }
        script = str(ROOT / "scripts" / "services.sh")
        subprocess.run(["bash", script, "up", service], env=env, check=True, capture_output=True)
        try:
            pid = int(Path(d, "run", f"{service}.pid").read_text())
            t0 = time.monotonic()
            pytest = [str(ROOT / ".venv" / "bin" / "pytest"), "-q", "-p", "no:cacheprovider"]
            subprocess.run([*pytest, *tests], env=env, cwd=ROOT, check=True, capture_output=True)
            return cpu_seconds(pid), time.monotonic() - t0
        finally:
            subprocess.run(["bash", script, "down", service], env=env, capture_output=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "jvm_jit.txt")
    args = p.parse_args()
    version = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    java = version.split()[2].strip('"')
    lines = [
        f"FiloPy test services' JVM CPU, {time.strftime('%Y-%m-%d %H:%M')}, Java {java}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs; median of {args.rounds} rounds",
        "",
    ]
    for service in WORKLOADS:
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in OPTIONS}
        for _ in range(args.rounds):
            for name, options in OPTIONS.items():
                got[name].append(one_round(service, options))
        cpu = {name: statistics.median(c for c, _ in runs) for name, runs in got.items()}
        wall = {name: statistics.median(w for _, w in runs) for name, runs in got.items()}
        for name in OPTIONS:
            lines.append(
                f"{service:9s} {name:11s} JVM CPU {cpu[name]:6.1f} s   tests {wall[name]:5.1f} s"
                f"   [{', '.join(f'{c:.1f}' for c, _ in got[name])}]"
            )
        ratio = cpu["C1 only"] / cpu["default JIT"]
        lines.append(f"{service:9s} C1 only / default JIT: CPU x{ratio:.2f}")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
