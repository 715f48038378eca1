"""The pure core (sharding, mapper, manager, strategy, PromQL engine, routing) imports no Ray,
Kafka or Cassandra."""

from __future__ import annotations

import subprocess
import sys

PURE = [
    "filopy",
    "core.hashing",
    "core.mapper",
    "core.shard_status",
    "core.dataset",
    "core.backoff",
    "core.worker",
    "coordinator.manager",
    "coordinator.moves",
    "coordinator.strategy",
    "coordinator.rebalance",
    "coordinator.failure_detector",
    "coordinator.membership",
    "coordinator.messages",
    "coordinator.names",
    "coordinator.subscriptions",
    "coordinator.inbox",
    "coordinator.guardian",
    "query.promql",
    "query.values",
    "query.binary",
    "query.pushdown",
    "query.evaluator",
    "query.routing",
]
IO = ["ray", "confluent_kafka", "cassandra"]


def test_pure_core_imports_no_io_library() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in PURE)
        + f"print(sorted(m for m in {IO!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
