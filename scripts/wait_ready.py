"""Wait until a local Kafka broker, Cassandra node or Redis server really serves requests.

Used by scripts/services.sh: "the port is open" is not enough (Cassandra opens 9042 before it can
answer a query), so this asks each service a real question: Kafka a metadata request, Cassandra a
CQL SELECT on system.local, Redis a PING. The secured instances are asked the same over TLS with
the credentials scripts/services.sh made (the secure directory); for Cassandra, being ready also
means FiloPy's role exists, created here through the default superuser on first start.
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


def _secret(secure_dir: str, name: str) -> str:
    with open(os.path.join(secure_dir, f"{name}.password")) as f:
        return f.read().strip()


def kafka_secure_ready(address: str, secure_dir: str) -> str:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(
        {
            "bootstrap.servers": address,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "filopy",
            "sasl.password": _secret(secure_dir, "kafka"),
            "ssl.ca.location": os.path.join(secure_dir, "ca.pem"),
            "socket.timeout.ms": 2000,
            "log_level": 0,
        }
    )
    md = admin.list_topics(timeout=3)
    return f"Kafka cluster {md.cluster_id} over SASL_SSL with {len(md.brokers)} broker(s)"


def cassandra_secure_ready(address: str, secure_dir: str) -> str:
    import logging
    import ssl

    from cassandra import AuthenticationFailed
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import Cluster, NoHostAvailable

    logging.getLogger("cassandra").setLevel(logging.CRITICAL)
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=os.path.join(secure_dir, "ca.pem"))
    password = _secret(secure_dir, "cassandra")

    def query(user: str, secret: str, cql: str, params: tuple[str, ...] = ()) -> object:
        cluster = Cluster(
            [host],
            port=int(port),
            connect_timeout=3,
            control_connection_timeout=3,
            ssl_context=context,
            auth_provider=PlainTextAuthProvider(user, secret),
        )
        try:
            return cluster.connect().execute(cql, params, timeout=10).one()
        finally:
            cluster.shutdown()

    try:
        row = query("filopy", password, "SELECT release_version FROM system.local")
    except NoHostAvailable as e:
        if not any(isinstance(x, AuthenticationFailed) for x in e.errors.values()):
            raise
        query(  # first start: only the default superuser exists yet
            "cassandra",
            "cassandra",
            "CREATE ROLE IF NOT EXISTS filopy WITH PASSWORD = %s AND LOGIN = true",
            (password,),
        )
        row = query("filopy", password, "SELECT release_version FROM system.local")
    return f"Cassandra {row.release_version} over TLS, role filopy"  # type: ignore[attr-defined]


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
SECURE_CHECKS = {"kafka-secure": kafka_secure_ready, "cassandra-secure": cassandra_secure_ready}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("service", choices=sorted({*CHECKS, *SECURE_CHECKS}))
    p.add_argument("address", help="host:port")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait (default 180)")
    p.add_argument("--pid", type=int, help="give up at once if this process exits")
    p.add_argument("--secure-dir", default="", help="CA and passwords of the secured instances")
    args = p.parse_args()
    secure = SECURE_CHECKS.get(args.service)

    def check(address: str) -> str:
        return secure(address, args.secure_dir) if secure else CHECKS[args.service](address)

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
            print(f"{args.service}: ready ({check(args.address)})")
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
