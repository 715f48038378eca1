"""A node's query channel probed from a host of the bed: what a stranger on the network can send.

    python -m tests.netbed.channel_probe endpoint NODE --address head:6379   (JSON)
    python -m tests.netbed.channel_probe frames HOST PORT KEY_FILE DATASET SHARD...   (JSON)

`endpoint` runs as a Ray driver (on a machine with a Ray node, holding the cluster's Ray token):
the node's channel address, its key (hex) and its counters, and whether the node answers a ping.
`frames` runs anywhere that reaches the node, without Ray: it opens a connection per case and
sends one frame as the case says, then reports what the node did (`answered`, or `closed`: the
node ended the connection without answering). `KEY_FILE` holds the key in hex, for the one
correctly signed request (answered) and its replays (refused: the MAC covers the connection's
nonce and the frame's number).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from coordinator.query_channel import (
    HEADER,
    MAGIC,
    NONCE_BYTES,
    REQUEST,
    _mac,
    _recv_exact,
    request_payload,
)
from core.dataset import DatasetRef
from query.executor import NodeQuery
from query.promql import parse
from query.wire import decode_reply

TIMEOUT_S = 30.0  # the node closes a refused connection at once; an answer comes in well under


def endpoint(node_name: str, address: str) -> dict[str, Any]:
    import ray

    from coordinator.client import connect
    from coordinator.names import node_actor_name

    client = connect(address)
    ids = {name: node for node, name in client.node_names().items()}
    node = ids[node_name]
    actor = ray.get_actor(node_actor_name(node), namespace=client._settings.ray.namespace)
    where = ray.get(actor.query_endpoint.remote(), timeout=60)
    stats = ray.get(actor.query_channel_stats.remote(), timeout=60)
    alive = ray.get(actor.ping.remote(), timeout=60).node_id == node
    return {"host": where.host, "port": where.port, "key": where.key.hex(), "stats": stats,
            "alive": alive}  # fmt: skip


def _open(host: str, port: int) -> tuple[socket.socket, bytes]:
    """A connection and the nonce of the node's greeting."""
    sock = socket.create_connection((host, port), timeout=TIMEOUT_S)
    hello = _recv_exact(sock, len(MAGIC) + NONCE_BYTES, time.monotonic() + TIMEOUT_S)
    if hello[: len(MAGIC)] != MAGIC:
        raise RuntimeError(f"not a query channel's greeting: {bytes(hello)!r}")
    return sock, bytes(hello[len(MAGIC) :])


def _frame(key: bytes, nonce: bytes, seq: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), _mac(key, REQUEST, nonce, seq, payload)) + payload


def _outcome(sock: socket.socket) -> str:
    """What the node did with what was sent: `closed` (end of stream or a reset, nothing read),
    `answered` (bytes came back) or `open` (neither within the timeout)."""
    sock.settimeout(TIMEOUT_S)
    try:
        data = sock.recv(1 << 16)
    except ConnectionResetError:
        return "closed"
    except TimeoutError:
        return "open"
    return "answered" if data else "closed"


def _answer(sock: socket.socket) -> str:
    """The kind of the signed answer read from `sock` (`ok` or `error`)."""
    deadline = time.monotonic() + TIMEOUT_S
    length, _ = HEADER.unpack(_recv_exact(sock, HEADER.size, deadline))
    kind, _ = decode_reply(_recv_exact(sock, length, deadline))
    return str(kind)


def frames(host: str, port: int, key: bytes, dataset: str, shards: list[int]) -> dict[str, str]:
    payload = request_payload(
        DatasetRef(name=dataset), shards, NodeQuery("series", matchers=(parse("up").matchers,))
    )
    out: dict[str, str] = {}

    def case(name: str, frame: bytes) -> None:
        sock, _ = _open(host, port)
        with sock:
            sock.sendall(frame)
            out[name] = _outcome(sock)

    # Without a signature (a zero MAC), and signed with a key of the sender's own.
    case("unsigned", HEADER.pack(len(payload), bytes(32)) + payload)
    sock, nonce = _open(host, port)
    with sock:
        sock.sendall(_frame(os.urandom(32), nonce, 0, payload))
        out["wrong_key"] = _outcome(sock)
    case("garbage", os.urandom(4096))
    # A correctly signed request is answered; the same bytes sent again are not, on the same
    # connection (the node expects the next number) or on another (another nonce).
    sock, nonce = _open(host, port)
    with sock:
        signed = _frame(key, nonce, 0, payload)
        sock.sendall(signed)
        out["signed"] = _answer(sock)
        sock.sendall(signed)
        out["replayed_on_its_connection"] = _outcome(sock)
    case("replayed_on_another_connection", signed)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("endpoint")
    e.add_argument("node")
    e.add_argument("--address", default="auto")
    f = sub.add_parser("frames")
    f.add_argument("host")
    f.add_argument("port", type=int)
    f.add_argument("key_file", type=Path)
    f.add_argument("dataset")
    f.add_argument("shards", type=int, nargs="*")
    args = p.parse_args()
    if args.command == "endpoint":
        print(json.dumps(endpoint(args.node, args.address)))
    else:
        key = bytes.fromhex(args.key_file.read_text().strip())
        print(json.dumps(frames(args.host, args.port, key, args.dataset, args.shards)))


if __name__ == "__main__":
    main()
