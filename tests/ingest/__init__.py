"""Tests of Kafka ingestion: record formats, gateway, topics, memstore."""
