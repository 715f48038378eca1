"""The Prometheus remote-write compliance suite (receiver tests) against a FiloPy gateway.

`scripts/rw-compliance.sh` builds `github.com/prometheus/compliance/remotewrite/receiver` from the
Go module proxy at a pinned version (cached under .services/); it sends hand-built remote write
1.0 and 2.0 requests (float samples with special values and odd label names, exemplars,
metadata, native histograms, bad content types and encodings, corrupt bodies) to a
`filopy gateway` app writing to the real Kafka, and checks each answer's status code and
X-Prometheus-Remote-Write-*-Written headers.

The suite accepts a 400 wherever it allows a partial write, even where it expects success: its
own verdict alone would hide a refusal. So besides "every test passes", this test pins the
status code FiloPy gives each of the suite's requests: 204 for everything FiloPy can store, the
suite's own invalid requests 400/415, and `NATIVE_HISTOGRAM_TESTS` (requests with native
histogram samples, which FiloPy does not store) 400 with a message saying so. Finally the
dataset's Kafka topic is read back: it holds exactly the samples the gateway counted as written,
odd label names intact.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.dataset import Dataset
from tests.rest.test_remote_write_kafka_outage import _counter
from tests.rest.test_remote_write_v2 import SCRIPT, gateway_on, topic_series

pytestmark = [pytest.mark.kafka]

RECEIVER = "filopy"  # the remote_write entry's name: the suite's innermost subtest

# Requests carrying native histogram samples: FiloPy stores float samples only, so it refuses
# them with 400 (the suite expects 2xx, but accepts a 4xx as a partial write). Each entry is a
# test name or a prefix of its subtests' names.
NATIVE_HISTOGRAM_TESTS = (
    "TestHistograms/basic_histogram",
    "TestHistograms/custom_buckets_histogram",
    "TestHistograms/positive_only_histogram",
    "TestHistograms/negative_only_histogram",
    "TestHistograms/minimal_histogram",
    "TestHistogramWithCreatedTimestamp",
    "TestMultipleHistograms/",
    "TestEmptyHistogram",
    "TestHistogramWithMetadata/",
    "TestHistogramWithExemplar",
    "TestHistogramWithMetadataAndExemplar/",
    "TestMultipleHistogramsWithMetadata",
    "TestHistogramsWithMetadataAndExemplars",
    "TestComplexHistogramsRequest",
    "TestMultipleMetricFamiliesHistograms",
    "TestManyHistograms",
    "TestCustomBucketsHistogramWithExemplar",
    "TestMetadata/histogram_metadata",
    "TestMetadataWithComplexLabels",
)
# The suite's own invalid requests (it expects a refusal): 415 for what is not snappy protobuf,
# 400 for a corrupt body, a series without a metric name, or a native histogram whose count
# disagrees with its buckets (refused here as any native histogram is).
UNSUPPORTED_MEDIA = ("TestBadContentTypes/", "TestBadContentEncodings/")
INVALID = re.compile(
    r"without_name_label|empty_metric|with_empty_name|^TestCorruptRequestBody$"
    r"|^TestRW1ErrorHandling$|^TestHistograms/bad_count_histogram$"
)
SUITE_TESTS = 205  # answered requests of the pinned suite version


def expected_status(test: str) -> int:
    if test.startswith(UNSUPPORTED_MEDIA):
        return 415
    if INVALID.search(test) or test.startswith(NATIVE_HISTOGRAM_TESTS):
        return 400
    return 204


def suite_binary() -> Path:
    """The suite, built (once, cached) by the project's script; a missing `go` fails here."""
    if shutil.which("go") is None:
        pytest.fail("`go` is not on PATH: the compliance suite is built from Go modules")
    done = subprocess.run(
        ["bash", str(SCRIPT), "suite"], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, f"{SCRIPT} suite failed:\n{done.stderr[-3000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str
) -> Iterator[tuple[str, Dataset]]:
    """A `filopy gateway` app (no Ray) on a fresh dataset of the real Kafka."""
    with gateway_on(tmp_path_factory.mktemp("rwc"), kafka_bootstrap) as (url, ds):
        yield url, ds


@pytest.mark.timeout(2400)
def test_the_receiver_compliance_suite(gateway: tuple[str, Dataset]) -> None:
    url, ds = gateway
    suite_binary()
    done = subprocess.run(
        ["bash", str(SCRIPT), "run", f"{url}/ingest/{ds.name}/api/v1/write"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    verdicts: dict[str, str] = {}
    status: dict[str, int] = {}
    body: dict[str, str] = {}
    for line in done.stdout.splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        test = event.get("Test")
        if not test:
            continue
        if event["Action"] in ("pass", "fail", "skip"):
            verdicts[test] = event["Action"]
        elif event["Action"] == "output":
            if m := re.search(r'Response code from "\w+": (\d+)', event["Output"]):
                status[test.removesuffix(f"/{RECEIVER}")] = int(m.group(1))
            elif m := re.search(r'Response body from "\w+": (".*")', event["Output"]):
                body[test.removesuffix(f"/{RECEIVER}")] = json.loads(m.group(1))
    failed = sorted(t for t, v in verdicts.items() if v != "pass")
    assert verdicts and not failed, f"suite failures: {failed}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, done.stderr[-3000:]

    # Every request answered as FiloPy should, the refusals with a reason.
    assert len(status) == SUITE_TESTS, sorted(status)
    wrong = {t: (code, expected_status(t)) for t, code in status.items()}
    wrong = {t: v for t, v in wrong.items() if v[0] != v[1]}
    assert not wrong, f"(got, expected) status per test: {wrong}"
    for test, code in status.items():
        if test.startswith(NATIVE_HISTOGRAM_TESTS):
            assert "native histogram samples (FiloPy stores float samples only)" in body[test]
        elif code == 400 and ("name_label" in test or "empty_name" in test):
            assert "no metric name" in body[test], body[test]
    assert Counter(status.values()) == {204: 136, 400: 65, 415: 4}

    # What the gateway counted as written is what Kafka holds, labels as sent.
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    written = sum(
        _counter(metrics, "filopy_http_ingest_samples_accepted_total", protocol=p)
        for p in ("prometheus_remote_write", "prometheus_remote_write_v2")
    )
    refused_histograms = _counter(
        metrics,
        "filopy_http_ingest_samples_rejected_total",
        protocol="prometheus_remote_write_v2",
        reason="unsupported",
    )
    # The suite's native histogram samples: 11 in TestHistograms, 100 in TestManyHistograms, 32
    # in the 14 other tests' requests (each sent twice: as a MUST and as a SHOULD test).
    assert refused_histograms == 11 + 100 + 32
    held = topic_series(ds)
    assert sum(n for _, n in held) == written > 0
    series = [labels for labels, _ in held]
    names = {labels["__name__"] for labels in series}
    assert {"resource cpu usage", "resource.cpu.usage", "test_metric", "up"} <= names
    assert {"__name__": "up", "job": "test\njob\n", "instance": "localhost:9090"} in series
    assert any(s.get("environment") == "test🚀" for s in series)
