"""Metrics of the HTTP ingestion endpoints, per protocol: requests by status code, samples
accepted and refused (by reason), body bytes, request latency and Kafka failures.

Each app has its own registry (`filopy gateway` serves it at /metrics; `filopy serve` adds it to
the cluster's /metrics), so several apps in one process never collide.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram

if TYPE_CHECKING:
    from filopy.ingest_http.core import WriteResult

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class IngestMetrics:
    """The counters; `observe` records one finished request."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "filopy_http_ingest_requests",
            "HTTP ingestion requests answered, by protocol and status code.",
            ["protocol", "code"],
            registry=r,
        )
        self.samples_accepted = Counter(
            "filopy_http_ingest_samples_accepted",
            "Samples acknowledged by Kafka (acks=all) before the request was answered.",
            ["protocol"],
            registry=r,
        )
        self.samples_rejected = Counter(
            "filopy_http_ingest_samples_rejected",
            "Samples refused and not written, by protocol and reason.",
            ["protocol", "reason"],
            registry=r,
        )
        self.bytes = Counter(
            "filopy_http_ingest_request_bytes",
            "Request body bytes as received, by protocol and outcome (accepted: a 2xx answer).",
            ["protocol", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            "filopy_http_ingest_request_duration_seconds",
            "Time from the request to its answer (a 2xx waits for Kafka's acks).",
            ["protocol"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tenant_samples = Counter(
            "filopy_http_ingest_tenant_samples",
            "Samples let in by the tenants' limits, by tenant (only with a tenant limit set).",
            ["tenant"],
            registry=r,
        )
        self.tenant_refused = Counter(
            "filopy_http_ingest_tenant_refused_samples",
            "Samples refused with 429 because their tenant was over a limit, by tenant and limit.",
            ["tenant", "limit"],
            registry=r,
        )
        self.kafka_errors = Counter(
            "filopy_http_ingest_kafka_errors",
            "Requests answered 503 because Kafka did not acknowledge in time or was unreachable.",
            ["protocol"],
            registry=r,
        )

    def observe(
        self,
        protocol: str,
        code: int,
        size: int,
        result: WriteResult | None,
        started: float,
    ) -> None:
        self.requests.labels(protocol, str(code)).inc()
        self.bytes.labels(protocol, "accepted" if code < 300 else "rejected").inc(size)
        self.latency.labels(protocol).observe(time.perf_counter() - started)
        if result is not None:
            if result.accepted:
                self.samples_accepted.labels(protocol).inc(result.accepted)
            for reason, n in result.rejected.items():
                self.samples_rejected.labels(protocol, reason).inc(n)
