"""FiloPy: a FiloDB-style time-series ingestion cluster on Kafka, Ray and Cassandra."""

from filopy.dataset import Dataset, DatasetRef

__all__ = ["Dataset", "DatasetRef"]
