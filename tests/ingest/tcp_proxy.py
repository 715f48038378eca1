"""A TCP proxy on 127.0.0.1 in its own process, so a test can cut a service off from one client
(SIGSTOP: connections hang, requests time out) and bring it back (SIGCONT), without touching the
shared service others use. Run as `python -m tests.ingest.tcp_proxy TARGET_HOST TARGET_PORT`; it
prints the port it listens on."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

ROOT = Path(__file__).resolve().parents[2]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(host: str, port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


class TcpProxy:
    """The proxy process: `port` to connect to, `cut()` / `restore()` the traffic."""

    def __init__(self, host: str, port: int) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.ingest.tcp_proxy", host, str(port)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        self.port = int(self._proc.stdout.readline())
        self.address = f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Freeze the proxy: open connections hang and new ones get no answer."""
        os.kill(self._proc.pid, signal.SIGSTOP)

    def restore(self) -> None:
        os.kill(self._proc.pid, signal.SIGCONT)

    def wait_listening(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise

    def close(self) -> None:
        self.restore()
        self._proc.terminate()
        self._proc.wait(timeout=10)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], int(sys.argv[2])))
