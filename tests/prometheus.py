"""A real Prometheus server as a test's sender: started on a config, asked through its own query
API what it scraped and sent, stopped cleanly (its exit code is part of what a test checks)."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

# The queue settings every test sender uses: send within a second, retry soon after a refusal.
QUEUE = """    queue_config:
      batch_send_deadline: 1s
      min_backoff: 100ms
      max_backoff: 1s"""


def require(binary: str = PROMETHEUS) -> None:
    """The real sender is the point of these tests: fail, never skip, when it is missing."""
    if not Path(binary).exists():
        pytest.fail(f"{binary} not found: run scripts/system-deps.sh (Debian's prometheus)")


class Prometheus:
    """A running Prometheus and its query API."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.log_path = log_path
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def query(self, q: str, at: float | None = None) -> list[dict]:
        params = {"query": q} | ({"time": f"{at:.3f}"} if at is not None else {})
        resp = self.http.get("/api/v1/query", params=params)
        assert resp.status_code == 200, resp.text
        return resp.json()["data"]["result"]

    def scalar(self, q: str) -> float:
        """The sum of an instant query's values (0 for none)."""
        return sum(float(r["value"][1]) for r in self.query(q))

    def scrapes(self, jobs: str = "prometheus") -> int:
        """How many scrapes the least-scraped of the jobs (a regex) had; 0 while starting."""
        assert self.proc.poll() is None, self.log()[-3000:]
        try:
            result = self.query(f'min(count_over_time(up{{job=~"{jobs}"}}[1h]))')
        except (httpx.TransportError, AssertionError):  # not up, or 503 while starting
            return 0
        return int(float(result[0]["value"][1])) if result else 0

    def sent_past(self, t: float) -> bool:
        """Whether a sample later than `t` (seconds) was sent: samples reach the remote-write
        queues in WAL order, so every sample up to `t` is queued, and shutdown flushes them."""
        try:
            sent = self.query("prometheus_remote_storage_queue_highest_sent_timestamp_seconds")
        except (httpx.TransportError, AssertionError):
            return False
        return bool(sent) and float(sent[0]["value"][1]) > t

    def series_counts(self, selector: str, at: float) -> dict[str, int]:
        """Samples per series (labels as sorted JSON) of `selector[1h]` at `at`; float series
        only (native histogram series hold "histograms" instead of "values")."""
        return {
            json.dumps(s["metric"], sort_keys=True): len(s["values"])
            for s in self.query(f"{selector}[1h]", at=at)
            if "values" in s
        }

    def stop(self) -> int:
        """SIGTERM (Prometheus flushes its queues) and its exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(90)


@contextlib.contextmanager
def running(
    config: str,
    tmp_path: Path,
    port: int,
    binary: str = PROMETHEUS,
    flags: Sequence[str] = (),
) -> Iterator[Prometheus]:
    """Prometheus on 127.0.0.1:`port` with `config` (YAML text), data and log in `tmp_path`;
    killed on the way out if the test did not stop it."""
    require(binary)
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(config)
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                *flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    prom = Prometheus(proc, port, log_path)
    try:
        yield prom
    finally:
        prom.http.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
