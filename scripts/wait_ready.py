"""Wait until a local Kafka broker, Cassandra node or Redis server really serves requests.

Used by scripts/services.sh: "the port is open" is not enough (Cassandra opens 9042 before it can
answer a query), so this asks each service a real question: Kafka a metadata request, Cassandra a
CQL SELECT on system.local, Redis a PING.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def kafka_ready(address: str) -> str:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": address, "socket.timeout.ms": 2000, "log_level": 0})
    md = admin.list_topics(timeout=3)
    return f"Kafka cluster {md.cluster_id} with {len(md.brokers)} broker(s)"


def cassandra_ready(address: str) -> str:
    import logging

    from cassandra.cluster import Cluster

    logging.getLogger("cassandra").setLevel(logging.CRITICAL)  # refusals are expected while waiting
    host, _, port = address.rpartition(":")
    cluster = Cluster([host], port=int(port), connect_timeout=3, control_connection_timeout=3)
    try:
        session = cluster.connect()
        row = session.execute("SELECT release_version FROM system.local", timeout=5).one()
        return f"Cassandra {row.release_version}"
    finally:
        cluster.shutdown()


def redis_ready(address: str) -> str:
    import socket

    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=3) as s:
        s.sendall(b"PING\r\n")
        answer = s.recv(64)
    if not answer.startswith(b"+PONG"):
        raise RuntimeError(f"answered {answer!r}")
    return "Redis"


CHECKS = {"kafka": kafka_ready, "cassandra": cassandra_ready, "redis": redis_ready}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("service", choices=sorted(CHECKS))
    p.add_argument("address", help="host:port")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait (default 180)")
    p.add_argument("--pid", type=int, help="give up at once if this process exits")
    args = p.parse_args()

    deadline = time.monotonic() + args.timeout
    last_error = ""
    while time.monotonic() < deadline:
        if args.pid is not None:
            try:
                os.kill(args.pid, 0)
            except ProcessLookupError:
                print(f"{args.service}: process {args.pid} exited while starting", file=sys.stderr)
                return 1
        try:
            print(f"{args.service}: ready ({CHECKS[args.service](args.address)})")
            return 0
        except Exception as e:  # any failure means "not yet": keep asking until the deadline
            last_error = f"{type(e).__name__}: {e}"
        time.sleep(1.0)
    print(
        f"{args.service}: not ready at {args.address} after {args.timeout:.0f}s ({last_error})",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
