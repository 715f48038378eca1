"""The query channel's protocol without Ray: frames, HMAC, errors, refusals, timeouts, pooling
(coordinator/query_channel.py). The cluster tests are in tests/runtime/test_query_channel.py."""

from __future__ import annotations

import pickle
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from coordinator.query_channel import (
    ANSWER,
    HEADER,
    MAGIC,
    NONCE_BYTES,
    REQUEST,
    ChannelClosed,
    ChannelError,
    ChannelPool,
    Connection,
    QueryEndpoint,
    QueryServer,
    RemoteQueryError,
    _mac,
    request_payload,
)
from core.dataset import DatasetRef
from core.errors import DatasetUnknownError, Invalid
from filopy.rest.errors import api_error
from query.executor import NodeAnswer, NodeQuery, ShardsNotHere
from query.limits import QueryLimitExceeded
from query.promql import QueryError, parse
from tests.waiting import wait_for

REF = DatasetRef(name="m")
SERIES = NodeQuery("series")
release = threading.Event()


class Unpicklable(Exception):
    def __reduce__(self) -> object:
        raise TypeError("not today")


def handler(ref: DatasetRef, shards: list[int], request: NodeQuery) -> NodeAnswer:
    """Answers its shards; 9 moved away, 8 fails the query, 7 is a bug, 6 waits."""
    if 9 in shards:
        raise ShardsNotHere(ref.name, "n1", [9])
    if 8 in shards:
        raise QueryError("execution", "many-to-many matching not allowed")
    if 7 in shards:
        raise Unpicklable("boom")
    if 6 in shards:
        release.wait(10)
    return NodeAnswer([{"shard": str(s)} for s in shards], tuple(shards), len(shards), 5)


@pytest.fixture
def server() -> Iterator[QueryServer]:
    release.clear()
    srv = QueryServer("127.0.0.1", handler)
    yield srv
    release.set()
    srv.close()


def ask(conn: Connection, shards: list[int], timeout_s: float = 5.0) -> tuple[str, object]:
    conn.send(request_payload(REF, shards, SERIES))
    return conn.receive(time.monotonic() + timeout_s)


def test_answers_and_errors_come_back_as_the_node_raised_them(server: QueryServer) -> None:
    conn = Connection(server.endpoint, 2.0)
    kind, answer = ask(conn, [1, 2])
    assert kind == "ok" and answer == NodeAnswer([{"shard": "1"}, {"shard": "2"}], (1, 2), 2, 5)
    kind, err = ask(conn, [9])
    assert kind == "error" and type(err) is ShardsNotHere
    assert (err.dataset, err.node, err.shards) == ("m", "n1", [9])
    kind, err = ask(conn, [8])
    assert isinstance(err, QueryError) and err.kind == "execution"
    kind, err = ask(conn, [7])  # an error that does not pickle: its type and message
    assert isinstance(err, RemoteQueryError) and "Unpicklable: boom" in str(err)
    assert ask(conn, [3])[0] == "ok"  # the connection goes on after every error
    conn.close()
    stats = server.stats()
    assert stats["served"] == 5
    assert stats["cpu_s"] > 0 and stats["wall_s"] > 0  # (CPU may exceed wall: clock grains)


def _raw(server: QueryServer) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection((server.endpoint.host, server.endpoint.port), timeout=5)
    hello = b""
    while len(hello) < len(MAGIC) + NONCE_BYTES:
        hello += sock.recv(64)
    assert hello.startswith(MAGIC)
    return sock, hello[len(MAGIC) :]


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    "frame",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b" " * 40,  # garbage
        HEADER.pack(5, b"\0" * 32) + b"hello",  # a frame with a made-up MAC
        HEADER.pack(1 << 40, b"\0" * 32),  # a frame too large to accept
    ],
    ids=["garbage", "bad-hmac", "too-large"],
)
def test_bad_frames_close_their_connection_and_nothing_else(
    server: QueryServer, frame: bytes
) -> None:
    good = Connection(server.endpoint, 2.0)
    sock, _ = _raw(server)
    sock.sendall(frame)
    assert _closed_by_peer(sock)
    sock.close()
    assert server.stats()["refused"] == 1
    assert ask(good, [1])[0] == "ok"  # the server, and other connections, go on
    assert ask(Connection(server.endpoint, 2.0), [1])[0] == "ok"


def test_a_caller_with_the_wrong_key_is_refused(server: QueryServer) -> None:
    wrong = QueryEndpoint(server.endpoint.host, server.endpoint.port, b"k" * 32)
    conn = Connection(wrong, 2.0)
    conn.send(request_payload(REF, [1], SERIES))
    with pytest.raises((ChannelClosed, ConnectionResetError)):
        conn.receive(time.monotonic() + 5)
    assert server.stats()["refused"] == 1


def test_a_recorded_frame_cannot_be_replayed(server: QueryServer) -> None:
    """The MAC covers the connection's nonce and the frame's number: a frame sent twice on its
    connection is refused the second time, and a frame copied to another connection too."""
    sock, nonce = _raw(server)
    payload = request_payload(REF, [1], SERIES)
    frame = HEADER.pack(len(payload), _mac(server.endpoint.key, REQUEST, nonce, 0, payload))
    frame += payload
    sock.sendall(frame)
    length, _ = HEADER.unpack(_recv(sock, HEADER.size))
    _recv(sock, length)  # answered
    sock.sendall(frame)  # the same frame again
    assert _closed_by_peer(sock)
    other, _ = _raw(server)
    other.sendall(frame)
    assert _closed_by_peer(other)
    stats = server.stats()
    assert (stats["served"], stats["refused"], stats["open"]) == (1, 2, 0)


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        out += sock.recv(n - len(out))
    return out


def test_a_slow_answer_times_out_at_the_deadline(server: QueryServer) -> None:
    conn = Connection(server.endpoint, 2.0)
    conn.send(request_payload(REF, [6], SERIES))
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        conn.receive(time.monotonic() + 0.3)
    assert 0.25 < time.monotonic() - began < 2


def test_a_node_that_goes_away_mid_query_closes_the_connection(server: QueryServer) -> None:
    conn = Connection(server.endpoint, 2.0)
    conn.send(request_payload(REF, [6], SERIES))  # waits on the node
    time.sleep(0.1)
    threading.Thread(target=server.close).start()
    with pytest.raises((ChannelClosed, ConnectionResetError)):
        conn.receive(time.monotonic() + 5)
    release.set()


def test_the_pool_reuses_connections_and_drops_closed_ones(server: QueryServer) -> None:
    pool = ChannelPool(server.endpoint)
    a = pool.checkout()
    b = pool.checkout()  # concurrent parts: a connection each
    assert a is not b
    pool.checkin(a)
    pool.checkin(b)
    assert pool.checkout() is b  # most recent first
    pool.checkin(b)
    wait_for("two connections open", lambda: server.stats()["open"] == 2)
    server.close()  # the node drops its connections: idle ones are not handed out again
    wait_for("every connection closed", lambda: server.stats()["open"] == 0)
    with pytest.raises(OSError):
        pool.checkout()  # and a new one cannot be opened
    assert pool.connected


def test_a_port_that_is_not_a_channel_is_refused() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def speak_http() -> None:
        conn, _ = listener.accept()
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()

    threading.Thread(target=speak_http, daemon=True).start()
    with pytest.raises(ChannelError):
        Connection(QueryEndpoint("127.0.0.1", port, b"k" * 32), 2.0)
    listener.close()


def test_parts_are_evaluated_a_few_at_a_time() -> None:
    """Connections are many, evaluations at once are bounded (they share one GIL)."""
    lock = threading.Lock()
    now = peak = 0

    def slow(ref: DatasetRef, shards: list[int], request: NodeQuery) -> NodeAnswer:
        nonlocal now, peak
        with lock:
            now += 1
            peak = max(peak, now)
        time.sleep(0.05)
        with lock:
            now -= 1
        return NodeAnswer([], tuple(shards), 0, 0)

    srv = QueryServer("127.0.0.1", slow, max_evaluating=2)
    try:
        conns = [Connection(srv.endpoint, 2.0) for _ in range(6)]
        for c in conns:
            c.send(request_payload(REF, [1], SERIES))
        assert all(c.receive(time.monotonic() + 5)[0] == "ok" for c in conns)
        assert peak == 2
    finally:
        srv.close()


def test_silent_and_idle_connections_are_closed(
    server: QueryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that never sends a signed request gives its slot back (refused), and one
    idle past IDLE_TIMEOUT_S is closed quietly; the pool then reconnects."""
    import coordinator.query_channel as qc

    monkeypatch.setattr(qc, "FIRST_FRAME_TIMEOUT_S", 0.3)
    monkeypatch.setattr(qc, "IDLE_TIMEOUT_S", 0.6)
    silent = socket.create_connection((server.endpoint.host, server.endpoint.port), timeout=5)
    try:
        assert silent.recv(len(MAGIC) + NONCE_BYTES)[: len(MAGIC)] == MAGIC
        assert silent.recv(1) == b""  # closed by the node, unasked
        assert server.stats()["refused"] == 1
    finally:
        silent.close()
    conn = Connection(server.endpoint, 5.0)
    conn.send(request_payload(REF, [1], SERIES))
    assert conn.receive(time.monotonic() + 5)[0] == "ok"
    time.sleep(0.3)  # past the first-frame timeout, within the idle one: still open
    conn.send(request_payload(REF, [2], SERIES))
    assert conn.receive(time.monotonic() + 5)[0] == "ok"
    wait_for("the idle connection closed", lambda: not conn.idle_and_open())
    assert server.stats()["refused"] == 1 and server.stats()["open"] == 0


# ------------------------------------------------------------------- data, never code


class Touch:
    """A pickle that, if ever loaded, creates a file: what a key holder could have sent when
    frames were pickles."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return open, (str(self.path), "w")


def _signed(key: bytes, direction: bytes, nonce: bytes, seq: int, payload: bytes) -> bytes:
    return HEADER.pack(len(payload), _mac(key, direction, nonce, seq, payload)) + payload


def _with_times(times: object) -> bytes:
    """A well-formed request whose step times are replaced by `times`."""
    request = NodeQuery("series_local", parse("x"), np.zeros(2, np.int64))
    fields = msgpack.unpackb(request_payload(REF, [1], request))
    fields[4] = times
    return msgpack.packb(fields)  # type: ignore[no-any-return]


SIGNED_BUT_NOT_A_REQUEST: dict[str, Callable[[Path], bytes]] = {
    "pickle": lambda path: pickle.dumps((REF, [1], Touch(path)), protocol=5),
    "pickle calling os.system": lambda path: pickle.dumps(
        (REF, [1], _System(f"touch {path}")), protocol=5
    ),
    "unknown ext type": lambda path: msgpack.packb([msgpack.ExtType(42, b"\x80\x05")]),
    "object dtype": lambda path: _with_times(["|O", [1], struct.pack("<q", 0)]),
    "a pickle as the expression": lambda path: msgpack.packb(
        ["m", [1], "series_local", pickle.dumps(Touch(path)), None, 1, [], 0, 0, []]
    ),
}


class _System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return os.system, (self.command,)


@pytest.mark.parametrize("name", list(SIGNED_BUT_NOT_A_REQUEST))
def test_a_signed_frame_that_is_not_a_request_closes_its_connection_and_runs_nothing(
    server: QueryServer, tmp_path: Path, name: str
) -> None:
    """The key alone buys no code execution: a correctly signed pickle (or msgpack outside the
    schema) is refused like a bad MAC, the file it would create is not created, and the
    server goes on serving other connections."""
    path = tmp_path / "touched"
    good = Connection(server.endpoint, 2.0)
    sock, nonce = _raw(server)
    payload = SIGNED_BUT_NOT_A_REQUEST[name](path)
    sock.sendall(_signed(server.endpoint.key, REQUEST, nonce, 0, payload))
    assert _closed_by_peer(sock)
    sock.close()
    assert not path.exists()
    stats = server.stats()
    assert (stats["served"], stats["refused"]) == (0, 1)
    assert ask(good, [1])[0] == "ok"
    assert ask(Connection(server.endpoint, 2.0), [1])[0] == "ok"
    assert not path.exists()


def _fake_node(answer: Callable[[bytes, bytes], bytes], greeting: bytes = MAGIC) -> QueryEndpoint:
    """A listener that greets, reads one request and writes `answer(key, nonce)` back."""
    key = secrets.token_bytes(32)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            conn.settimeout(10)
            nonce = secrets.token_bytes(NONCE_BYTES)
            conn.sendall(greeting + nonce)
            header = conn.recv(HEADER.size, socket.MSG_WAITALL)
            if len(header) < HEADER.size:
                return  # the caller hung up at the greeting
            conn.recv(HEADER.unpack(header)[0], socket.MSG_WAITALL)
            conn.sendall(answer(key, nonce))
            conn.recv(1)  # until the caller closes

    threading.Thread(target=serve, daemon=True).start()
    return QueryEndpoint("127.0.0.1", listener.getsockname()[1], key)


@pytest.mark.parametrize("kind", ["ok", "error"])
def test_a_node_that_answers_with_a_signed_pickle_is_refused_and_runs_nothing(
    tmp_path: Path, kind: str
) -> None:
    """The other way round: a caller never loads a pickle from a node either."""
    path = tmp_path / "touched"
    payload = pickle.dumps((kind, Touch(path)), protocol=5)
    endpoint = _fake_node(lambda key, nonce: _signed(key, ANSWER, nonce, 0, payload))
    conn = Connection(endpoint, 2.0)
    conn.send(request_payload(REF, [1], SERIES))
    with pytest.raises(ChannelError, match="not an answer"):
        conn.receive(time.monotonic() + 5)
    conn.close()
    assert not path.exists()


def test_a_node_of_the_pickled_format_is_refused_at_its_greeting() -> None:
    """FQC1 (pickled frames) and FQC2 refuse each other before any frame is sent."""
    endpoint = _fake_node(lambda key, nonce: b"", greeting=b"FQC1")
    with pytest.raises(ChannelError, match="not a FiloPy query channel"):
        Connection(endpoint, 2.0)


class NodeOwnInvalid(Invalid):
    """A node's error for a bad query, not on the channel's allow-list."""

    error_type = "bad_shape"


def test_every_error_of_a_node_gets_its_own_rest_answer_across_the_channel() -> None:
    """A node's error crosses as itself or as its category, and the REST answer is the one
    the node's error has (a 4xx for a bad query, the limit's 422); a bug is a 500 that says
    what the node said."""
    raised: dict[int, Exception] = {
        1: NodeOwnInvalid("the shape is wrong"),
        2: QueryLimitExceeded("team-a", "samples", 1000),
        3: QueryError("unsupported", "unsupported: limitk"),
        4: DatasetUnknownError("gone"),
        5: KeyError("a bug"),
    }

    def failing(ref: DatasetRef, shards: list[int], request: NodeQuery) -> NodeAnswer:
        raise raised[shards[0]]

    srv = QueryServer("127.0.0.1", failing)
    conn = Connection(srv.endpoint, 2.0)
    try:
        answers = {}
        for shard in raised:
            kind, err = ask(conn, [shard])
            assert kind == "error" and isinstance(err, Exception)
            a = api_error(err, 5.0)
            answers[shard] = (a.status, a.error_type, a.message)
    finally:
        conn.close()
        srv.close()
    assert answers[1] == (400, "bad_shape", "the shape is wrong")
    assert (
        answers[2][:2] == (422, "execution") and "query.tenant_max_samples = 1000" in answers[2][2]
    )
    assert answers[3] == (501, "unsupported", "unsupported: limitk")
    assert answers[4] == (404, "not_found", "unknown dataset 'gone'")
    assert answers[5] == (500, "internal", "a node failed on the query: KeyError: 'a bug'")
