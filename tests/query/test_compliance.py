"""FiloPy's PromQL answers against Prometheus 3's on the same samples (tests/compliance).

Prometheus 3 (built from its Go module source) serves promtool-built blocks of the demo series;
a real two-node FiloPy cluster receives the same samples through its remote-write endpoint and
Kafka. Every query of tests/compliance/queries.yml runs as a range and as an instant query on
both. What differs must be exactly what tests/compliance/known_differences.yml lists, with why:
a new difference fails this test, and so does a listed one that now passes.
"""

from __future__ import annotations

import pytest

from tests.compliance import harness

pytestmark = [pytest.mark.kafka, pytest.mark.ray]


def test_filopy_answers_as_prometheus_3_does_but_for_the_listed_differences(
    kafka_bootstrap: str,
) -> None:
    with harness.systems(kafka_bootstrap) as (reference, filopy):
        outcomes = harness.compare_all(reference, filopy)
    print(harness.summary(outcomes))
    broken = [f"[{o.mode}] {o.query}: {o.why}" for o in outcomes if o.verdict == "reference_error"]
    assert not broken, "the reference refused queries it should answer:\n" + "\n".join(broken)
    problems = harness.unexpected(outcomes, harness.load_known())
    assert not problems, "\n".join(problems)
