"""The wire formats: pure functions from a body's bytes to a batch of samples (`ingest.batch`),
no HTTP, no Kafka. The HTTP endpoints (`filopy.ingest_http`) and the ingesters
(`ingest.records`) call them.

- `remote_write_v1`, `remote_write_v2`: Prometheus remote write 1.0 and 2.0 protobuf, over one
  protobuf walker (`protobuf`);
- `otlp`: OTLP metrics as Prometheus series, its names made by `otlp_names`;
- `line_protocol`: Influx line protocol;
- `binary_format`: FiloPy's own batch format, which the gateway writes to Kafka.

A body that cannot be read at all raises `core.errors.Invalid` (the HTTP layer answers 400);
anything less counts bad records per reason (`ingest.bad_records`). Each format has one
reference decoder and at most one compiled fast path beside it, tested to give what the
reference gives.
"""
