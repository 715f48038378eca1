"""PromQL compliance: FiloPy's answers compared with Prometheus 3's on the same data.

`demo_data` generates `demo_*` series like those of the PromLabs demo service that the official
compliance suite scrapes (counters with resets, gauges, histograms, a metric with gaps);
`harness` loads them into a Prometheus 3 reference (promtool-built blocks) and into FiloPy
(remote write through its gateway, real Kafka, a real Ray cluster), runs every query of
`queries.yml` as a range query and as an instant query against both, and compares.
"""
