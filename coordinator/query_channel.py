"""A node's query channel: the node parts of queries over long-lived TCP connections, instead
of a Ray actor call per query.

Why: a Ray actor call costs the caller about a millisecond of submission CPU and crosses four
threads (the caller's thread, Ray's core worker, the actor's event loop, a worker thread for the
evaluation, and back), which was most of a small PromQL query's time. Here the caller's own
thread writes one frame and reads one frame; on the node, the thread that owns the connection
reads the frame, evaluates the part and writes the answer: no event loop, no thread hop, and
the node actor's event loop (shard maps, health) is never blocked by a big query.

Trust: frames carry data, never code. Payloads are msgpack read by an explicit schema
(`query.wire`: every type field by field, arrays as an allowed dtype, shape and bytes,
expressions as PromQL text parsed on the node), so even a caller or node that holds the key, or
a flaw in the MAC check, can send nothing but a query or an answer; a payload outside the
schema closes its connection like a bad MAC. Nothing is decoded before its HMAC-SHA256 checks
out. The key is random per node process and handed out with the address through Ray
(`NodeCoordinator.query_endpoint`); it never crosses the socket. Each connection opens with a
random nonce from the node, and every frame's MAC covers its direction, that nonce and its
sequence number on the connection, so a recorded frame cannot be replayed, reordered or
reflected. A frame that fails the check (or is garbage, too large, or not a message of the
schema) closes that connection and nothing else.

Wire format: the node sends `MAGIC + nonce` (`FQC2`: a node or caller of the pickled format,
`FQC1`, and this one refuse each other at the greeting); then each frame is `!Q` payload length,
32 bytes of MAC, the payload. A request is `query.wire.encode_request(ref, shards, NodeQuery)`;
an answer is `encode_answer(NodeAnswer)` or `encode_error(exception)`: the error's class, args
and fields for FiloPy's query errors (`query.wire.ERRORS`), `RemoteQueryError` with the type and
message of any other. One request at a time per connection: callers keep a pool for concurrent
queries (`ChannelPool`).

Pure sockets and threads, no Ray: `coordinator.cluster_queries` finds endpoints through Ray
and falls back to Ray calls when the channel cannot be used.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.dataset import DatasetRef
from core.errors import FiloPyError, Unavailable
from query.executor import NodeAnswer, NodeQuery
from query.wire import (
    RemoteQueryError,
    WireError,
    decode_reply,
    decode_request,
    encode_answer,
    encode_error,
    encode_request,
)

log = logging.getLogger("filopy.query")

MAGIC = b"FQC2"  # FQC1 was the pickled format
NONCE_BYTES = 16
HEADER = struct.Struct("!Q32s")  # payload length, HMAC-SHA256 of the frame
REQUEST, ANSWER = b"Q", b"A"  # a frame's direction, part of its MAC
MAX_REQUEST_BYTES = 64 << 20  # a request is an expression and the step times: far less
MAX_ANSWER_BYTES = 16 << 30
SMALL_FRAME = 64 << 10  # up to this, header and payload leave in one write
MAX_CONNECTIONS = 256  # per node; each is a thread while open
# A connection must bring its first signed request this soon, and is closed when idle this long,
# so connections that never authenticate (or callers that went away) cannot keep the node's
# connection slots: callers reconnect as their pools find a connection closed.
FIRST_FRAME_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 600.0
# Parts evaluated at once per node, as many as asyncio.to_thread's default pool ran on the Ray
# path: more would only share the GIL and hold more memory at once.
MAX_EVALUATING = min(32, (os.cpu_count() or 1) + 4)
REFUSAL_LOG_EVERY_S = 10.0

Handler = Callable[[DatasetRef, list[int], NodeQuery], NodeAnswer]


@dataclass(frozen=True, slots=True)
class QueryEndpoint:
    """Where a node's query channel listens, and the key its frames are signed with."""

    host: str
    port: int
    key: bytes = field(repr=False)


class ChannelError(Unavailable):
    """The peer broke the protocol (bad MAC, bad greeting, a frame too large): the connection
    cannot be trusted any more and is closed."""


class ChannelClosed(ChannelError):
    """The peer closed the connection."""


def _mac(key: bytes, direction: bytes, nonce: bytes, seq: int, payload: bytes | bytearray) -> bytes:
    h = hmac.new(key, direction + nonce + seq.to_bytes(8, "big"), hashlib.sha256)
    h.update(payload)
    return h.digest()


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytearray:
    """Exactly `n` bytes; `ChannelClosed` at EOF, `TimeoutError` past the deadline."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer in time")
            sock.settimeout(left)
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ChannelClosed("the peer closed the connection")
        got += k
    return buf


class _Framer:
    """Signed, numbered frames over one connection, in both directions."""

    def __init__(
        self,
        sock: socket.socket,
        key: bytes,
        nonce: bytes,
        out: bytes,
        max_in: int,
    ) -> None:
        self._sock, self._key, self._nonce = sock, key, nonce
        self._out = out
        self._in = ANSWER if out == REQUEST else REQUEST
        self._max_in = max_in
        self._sent = 0
        self._received = 0

    def send(self, payload: bytes) -> None:
        mac = _mac(self._key, self._out, self._nonce, self._sent, payload)
        self._sent += 1
        header = HEADER.pack(len(payload), mac)
        if len(payload) <= SMALL_FRAME:
            self._sock.sendall(header + payload)
        else:
            self._sock.sendall(header)
            self._sock.sendall(payload)

    def receive(self, deadline: float | None = None) -> bytearray:
        length, mac = HEADER.unpack(_recv_exact(self._sock, HEADER.size, deadline))
        if length > self._max_in:
            raise ChannelError(f"a frame of {length} bytes (at most {self._max_in})")
        payload = _recv_exact(self._sock, length, deadline)
        expected = _mac(self._key, self._in, self._nonce, self._received, payload)
        if not hmac.compare_digest(mac, expected):
            raise ChannelError("a frame with a bad HMAC")
        self._received += 1
        return payload


def _no_delay(sock: socket.socket) -> None:
    """Frames are small and answered at once: Nagle's delay would cost milliseconds."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# ------------------------------------------------------------------------------- node side


class QueryServer:
    """A node's query channel: an accepting thread and one thread per open connection, each
    evaluating its requests with `handler` (which may raise `ShardsNotHere` or any error; the
    caller gets it). Threads, not the actor's event loop: a query part runs where its frame was
    read, and a big one blocks nothing but its own connection."""

    def __init__(
        self,
        host: str,
        handler: Handler,
        *,
        key: bytes | None = None,
        max_evaluating: int = MAX_EVALUATING,
    ) -> None:
        self._handler = handler
        self._evaluating = threading.BoundedSemaphore(max_evaluating)
        self._key = key or secrets.token_bytes(32)
        self._sock = socket.create_server((host, 0), backlog=128)
        self.endpoint = QueryEndpoint(host, self._sock.getsockname()[1], self._key)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._closed = False
        self.served = 0
        self.cpu_s = 0.0  # CPU time of decoding, evaluating and encoding the parts served
        self.wall_s = 0.0  # their wall time: well above cpu_s, they waited (the GIL, the lock)
        self.refused = 0
        self._refusal_logged = 0.0
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"query-channel-{self.endpoint.port}", daemon=True
        )
        self._thread.start()

    def stats(self) -> dict[str, float]:
        """Parts served and the CPU and wall seconds they took here, connections refused and
        open."""
        with self._lock:
            return {
                "served": self.served,
                "cpu_s": self.cpu_s,
                "wall_s": self.wall_s,
                "refused": self.refused,
                "open": len(self._conns),
            }

    def close(self) -> None:
        """Stop accepting and drop every connection (their callers see the node gone)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                if self._closed:
                    return
                log.exception("query channel: accept failed")
                time.sleep(0.1)
                continue
            with self._lock:
                full = len(self._conns) >= MAX_CONNECTIONS
                if not full:
                    self._conns.add(conn)
            if full:
                self._refuse(peer, f"more than {MAX_CONNECTIONS} connections")
                conn.close()
                continue
            threading.Thread(
                target=self._serve, args=(conn, peer), name="query-channel-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        try:
            _no_delay(conn)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            nonce = secrets.token_bytes(NONCE_BYTES)
            conn.sendall(MAGIC + nonce)
            framer = _Framer(conn, self._key, nonce, ANSWER, MAX_REQUEST_BYTES)
            signed = False  # a request with a good HMAC came on this connection
            while not self._closed:
                wait_s = IDLE_TIMEOUT_S if signed else FIRST_FRAME_TIMEOUT_S
                try:
                    payload = framer.receive(time.monotonic() + wait_s)
                except ChannelClosed:
                    return  # the caller is done with it
                except ChannelError as e:
                    self._refuse(peer, str(e))
                    return
                except TimeoutError:
                    if not signed:
                        self._refuse(peer, "no signed request in time")
                    return  # else idle: its caller reconnects when it needs to
                signed = True
                conn.settimeout(None)  # the answer is sent without the receive's deadline
                cpu, wall = time.thread_time(), time.perf_counter()
                try:
                    answer = self._answer(payload)
                except WireError as e:  # signed, but not a request: a broken or hostile peer
                    self._refuse(peer, str(e))
                    return
                cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
                with self._lock:
                    self.served += 1
                    self.cpu_s += cpu
                    self.wall_s += wall
                framer.send(answer)
        except OSError:
            return  # the caller went away (or gave up on a slow answer)
        except Exception:
            log.exception("query channel: a connection from %s failed", peer)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _answer(self, payload: bytearray) -> bytes:
        """The answer's bytes; `WireError` (raised) if the payload is not a request."""
        try:
            ref, shards, request = decode_request(payload)
            with self._evaluating:
                answer = self._handler(ref, shards, request)
        except WireError:
            raise
        except Exception as e:
            if not isinstance(e, FiloPyError):  # a bug, not a stale map or a bad query
                log.exception("query channel: a query part failed")
            return encode_error(e)
        try:
            return encode_answer(answer)
        except Exception as e:  # a result of a type that does not cross: a bug
            log.exception("query channel: an answer could not be encoded")
            return encode_error(RemoteQueryError(f"{type(e).__name__}: {e}"))

    def _refuse(self, peer: Any, why: str) -> None:
        """Count a refused connection; log it, at most once per `REFUSAL_LOG_EVERY_S`."""
        with self._lock:
            self.refused += 1
            now = time.monotonic()
            loud = now - self._refusal_logged >= REFUSAL_LOG_EVERY_S
            if loud:
                self._refusal_logged = now
        if loud:
            log.warning("query channel: refused %s: %s (%d so far)", peer, why, self.refused)


# ----------------------------------------------------------------------------- caller side


class Connection:
    """One connection to a node's channel, used by one query part at a time."""

    def __init__(self, endpoint: QueryEndpoint, connect_timeout_s: float) -> None:
        deadline = time.monotonic() + connect_timeout_s
        self._sock = socket.create_connection(
            (endpoint.host, endpoint.port), timeout=connect_timeout_s
        )
        try:
            _no_delay(self._sock)
            hello = _recv_exact(self._sock, len(MAGIC) + NONCE_BYTES, deadline)
            if hello[: len(MAGIC)] != MAGIC:
                raise ChannelError("not a FiloPy query channel")
            nonce = bytes(hello[len(MAGIC) :])
        except BaseException:
            self._sock.close()
            raise
        self._framer = _Framer(self._sock, endpoint.key, nonce, REQUEST, MAX_ANSWER_BYTES)

    def send(self, payload: bytes) -> None:
        self._sock.settimeout(None)
        self._framer.send(payload)

    def receive(self, deadline: float) -> tuple[str, Any]:
        """The answer to the request sent: ("ok", answer) or ("error", exception);
        `ChannelError` for one that is not an answer (the connection cannot be trusted)."""
        payload = self._framer.receive(deadline)
        try:
            return decode_reply(payload)
        except WireError as e:
            raise ChannelError(f"a signed frame that is not an answer: {e}") from None

    def idle_and_open(self) -> bool:
        """Nothing to read on an idle connection: a readable one was closed by the node (or
        broke), and reusing it would only fail the next query."""
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        return not poller.poll(0)

    def close(self) -> None:
        self._sock.close()


def request_payload(ref: DatasetRef, shards: Sequence[int], request: NodeQuery) -> bytes:
    """A request frame's payload (`query.wire.encode_request`)."""
    return encode_request(ref, shards, request)


class ChannelPool:
    """Idle connections to one node's channel, reused most recent first; a connection is
    opened when none is idle, so concurrent queries each get their own."""

    def __init__(
        self, endpoint: QueryEndpoint, *, connect_timeout_s: float = 2.0, max_idle: int = 16
    ) -> None:
        self.endpoint = endpoint
        self._connect_timeout_s = connect_timeout_s
        self._max_idle = max_idle
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self.connected = False  # whether a connection ever opened (the address is right)

    def checkout(self) -> Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = Connection(self.endpoint, self._connect_timeout_s)
                self.connected = True
                return conn
            if conn.idle_and_open():
                return conn
            conn.close()

    def checkin(self, conn: Connection) -> None:
        with self._lock:
            if len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


__all__ = [
    "ChannelClosed",
    "ChannelError",
    "ChannelPool",
    "Connection",
    "QueryEndpoint",
    "QueryServer",
    "RemoteQueryError",
    "request_payload",
]
