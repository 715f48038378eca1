"""TLS on `filopy gateway` (the REST server starts through the same `filopy.serving` options),
with a CA made here by openssl and real clients: curl, httpx, and Prometheus remote-writing with
`tls_config` and a token; then mutual TLS, where a client without a certificate the CA signed
is refused during the handshake. Plain HTTP to the TLS port gets no answer."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.config import load_settings
from core.dataset import Dataset, SourceSettings
from ingest.topics import ensure_topic
from store import open_stores
from tests import prometheus
from tests.rest.conftest import topic_batches
from tests.rest.test_remote_write import free_port
from tests.waiting import wait_for

pytestmark = [pytest.mark.kafka]


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=FiloPy test CA", "-keyout", "ca.key", "-out", "ca.pem", cwd=d)  # fmt: skip
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("client", [])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", *ext, cwd=d)  # fmt: skip
    return d


@contextlib.contextmanager
def _gateway(tmp: Path, env: dict[str, str]) -> Iterator[str]:
    """`filopy gateway` as its own process with `env`; its https URL once it listens."""
    port = free_port()
    cmd = [sys.executable, "-m", "filopy.cli", "gateway", "--port", str(port)]
    log = (tmp / f"gateway-{port}.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:

        def listening() -> bool:
            assert proc.poll() is None, (tmp / f"gateway-{port}.log").read_text()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                return False

        wait_for("the gateway listening", listening)
        yield f"https://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory, pki: Path, kafka_bootstrap: str
) -> dict[str, object]:
    """A store with a dataset (its topic made) and a write token, and the gateway's env."""
    tmp = tmp_path_factory.mktemp("tls")
    env = {
        **os.environ,
        "FILOPY_STATE_DIR": str(tmp / "state"),
        "FILOPY_STORE__SQLITE_PATH": str(tmp / "filopy.db"),
        "FILOPY_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "FILOPY_TLS__CERT_FILE": str(pki / "server.pem"),
        "FILOPY_TLS__KEY_FILE": str(pki / "server.key"),
    }
    made = subprocess.run(
        [sys.executable, "-m", "filopy.cli", "token", "create", "tls", "--scope", "write"],
        cwd=tmp, env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    ds = Dataset(
        name=f"tls{uuid.uuid4().hex[:8]}",
        num_shards=2,
        source=SourceSettings(bootstrap_servers=kafka_bootstrap),
    )
    ensure_topic(ds)
    settings = load_settings()
    store = settings.store.model_copy(update={"sqlite_path": tmp / "filopy.db"})
    meta, columns = open_stores(settings.model_copy(update={"store": store}))
    meta.create_dataset(ds)
    meta.close()
    columns.close()
    return {"tmp": tmp, "env": env, "token": made.stdout.strip(), "ds": ds}


def test_tls_with_curl_httpx_and_prometheus(setup: dict, pki: Path, tmp_path: Path) -> None:
    tmp, env, token, ds = setup["tmp"], setup["env"], setup["token"], setup["ds"]
    with _gateway(tmp, env) as url:  # type: ignore[arg-type]
        ca = str(pki / "ca.pem")
        ok = subprocess.run(["curl", "-sS", "--fail", "--cacert", ca, f"{url}/__liveness"],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
        assert ok.returncode == 0 and '"ok"' in ok.stdout, ok.stderr
        # Without the CA, curl does not trust the server; plain HTTP gets no HTTP answer.
        untrusted = subprocess.run(["curl", "-sS", f"{url}/__liveness"],
                                   capture_output=True, text=True, timeout=30)  # fmt: skip
        assert untrusted.returncode == 60, untrusted.stderr  # peer certificate not verified
        with pytest.raises(httpx.HTTPError):
            httpx.get(url.replace("https", "http") + "/__liveness", timeout=10)
        trust = ssl.create_default_context(cafile=ca)
        r = httpx.get(f"{url}/__liveness", verify=trust, timeout=10)
        assert r.status_code == 200
        # Auth is on over TLS as over plain HTTP.
        assert httpx.post(f"{url}/ingest/{ds.name}/write", verify=trust).status_code == 401

        # Prometheus remote-writes over TLS (tls_config.ca_file) with its token.
        (tmp_path / "token").write_text(token)
        port = free_port()
        config = f"""
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ["127.0.0.1:{port}"]
remote_write:
  - url: {url}/ingest/{ds.name}/api/v1/write
    authorization:
      credentials_file: {tmp_path / "token"}
    tls_config:
      ca_file: {ca}
{prometheus.QUEUE}
"""
        with prometheus.running(config, tmp_path, port) as prom:
            wait_for(
                "Prometheus' samples in Kafka through the TLS gateway",
                lambda: sum(len(b) for b in topic_batches(ds)) > 500,
            )
            assert prom.stop() == 0
        said = prom.log()
        # What Prometheus logs for a refused certificate or token (a bare "401" also occurs in
        # its durations, e.g. "1.401056ms").
        assert not re.search(r"x509: |HTTP status 401", said), said[-2000:]


def test_mutual_tls_refuses_a_client_without_a_certificate(setup: dict, pki: Path) -> None:
    tmp, env = setup["tmp"], dict(setup["env"])  # type: ignore[call-overload]
    env["FILOPY_TLS__CLIENT_CA_FILE"] = str(pki / "ca.pem")
    ca = str(pki / "ca.pem")
    with _gateway(tmp, env) as url:  # type: ignore[arg-type]
        with pytest.raises(httpx.HTTPError):  # the handshake fails: no certificate
            httpx.get(f"{url}/__liveness", verify=ssl.create_default_context(cafile=ca), timeout=10)
        bare = subprocess.run(["curl", "-sS", "--cacert", ca, f"{url}/__liveness"],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert bare.returncode != 0
        signed = subprocess.run(
            ["curl", "-sS", "--fail", "--cacert", ca, "--cert", str(pki / "client.pem"),
             "--key", str(pki / "client.key"), f"{url}/__liveness"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert signed.returncode == 0 and '"ok"' in signed.stdout, signed.stderr
        context = ssl.create_default_context(cafile=ca)
        context.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
        assert httpx.get(f"{url}/__liveness", verify=context, timeout=10).status_code == 200


def test_a_half_configured_tls_is_refused_at_start(tmp_path: Path) -> None:
    env = {**os.environ, "FILOPY_TLS__CERT_FILE": "/nonexistent.pem"}
    argv = [sys.executable, "-m", "filopy.cli", "gateway", "--port", "1"]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "tls.cert_file and tls.key_file go together" in proc.stderr
    assert "Traceback" not in proc.stderr
