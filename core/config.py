"""FiloPy settings: one typed object built from the default file, a user file and the environment.

Precedence, highest first: values passed in code, `FILOPY_<SECTION>__<KEY>` environment variables,
the user file named by `FILOPY_CONFIG`, then `config/filopy.toml` shipped with the project. Every
setting is documented in that default file, which is the single place defaults are written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

DEFAULT_CONFIG_FILE = Path(__file__).resolve().parent.parent / "config" / "filopy.toml"


Consistency = Literal["ONE", "LOCAL_ONE", "QUORUM", "LOCAL_QUORUM", "ALL"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaSettings(_Section):
    bootstrap_servers: str


class StoreSettings(_Section):
    backend: Literal["sqlite", "cassandra"]
    sqlite_path: Path
    sqlite_busy_timeout_s: float = Field(gt=0)
    max_chunk_span_ms: int = Field(gt=0)
    history_retention_days: float = Field(gt=0)
    retention_days: float = Field(ge=0)
    retention_sweep_interval_s: float = Field(gt=0)
    sqlite_bucket_ms: int = Field(gt=0)


class CassandraSettings(_Section):
    contact_points: tuple[str, ...]
    port: int = Field(gt=0, lt=65536)
    keyspace: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,47}$")
    replication: dict[str, str]
    consistency: Consistency
    data_consistency: Consistency | Literal[""]
    local_dc: str
    connect_timeout_s: float = Field(gt=0)
    request_timeout_s: float = Field(gt=0)
    write_concurrency: int = Field(gt=0)
    read_concurrency: int = Field(gt=0)


class RaySettings(_Section):
    address: str
    namespace: str


class ClusterSettings(_Section):
    node_resource: str = Field(min_length=1)
    membership_interval_s: float = Field(gt=0)
    ping_interval_s: float = Field(gt=0)
    ping_timeout_s: float = Field(gt=0)
    failure_timeout_s: float = Field(gt=0)
    resync_interval_s: float = Field(gt=0)
    reassignment_min_interval_s: float = Field(ge=0)
    node_version: str

    @model_validator(mode="after")
    def _detect_before_declaring(self) -> ClusterSettings:
        if self.failure_timeout_s <= self.ping_interval_s:
            raise ValueError(
                f"cluster.failure_timeout_s ({self.failure_timeout_s}) must be longer than "
                f"cluster.ping_interval_s ({self.ping_interval_s})"
            )
        return self


class RebalanceSettings(_Section):
    enabled: bool
    interval_s: float = Field(gt=0)
    max_concurrent_moves: int = Field(ge=1)
    drain_timeout_s: float = Field(gt=0)
    move_cooldown_s: float = Field(ge=0)
    by_load: bool


class IngestSettings(_Section):
    source: Literal["kafka", "none"]
    groups_per_shard: int = Field(ge=1)
    flush_interval_s: float = Field(gt=0)
    max_chunk_samples: int = Field(ge=1)
    chunk_span_ms: int = Field(ge=1)
    memory_retention_ms: int = Field(ge=0)
    max_samples_per_shard: int = Field(ge=1)
    consume_batch: int = Field(ge=1)
    consume_timeout_s: float = Field(gt=0)
    fetch_wait_max_ms: int = Field(ge=0)
    queued_min_messages: int = Field(ge=1)
    queued_max_messages_kbytes: int = Field(ge=1)
    fetch_queue_backoff_ms: int = Field(ge=0)
    bad_record_log_interval_s: float = Field(ge=0)
    kafka_retry_timeout_s: float = Field(gt=0)
    max_unflushed_samples: int = Field(ge=1)
    store_retry_initial_s: float = Field(gt=0)
    store_retry_max_s: float = Field(gt=0)
    start_max_attempts: int = Field(ge=1)


class GatewaySettings(_Section):
    """The HTTP ingestion endpoints (`filopy gateway`, and those `filopy serve` mounts)."""

    max_body_bytes: int = Field(ge=1024)
    max_decoded_bytes: int = Field(ge=1024)
    max_samples_per_request: int = Field(ge=1)
    max_series_per_request: int = Field(ge=1)
    ack_timeout_s: float = Field(gt=0)
    retry_after_s: int = Field(ge=1)
    definitions_ttl_s: float = Field(ge=0)
    kafka_compression: Literal["none", "gzip", "snappy", "lz4", "zstd"]
    tenant_samples_per_s: float = Field(ge=0)
    tenant_burst_s: float = Field(gt=0)
    tenant_active_series: int = Field(ge=0)
    tenant_active_window_s: float = Field(gt=0)


class AuthSettings(_Section):
    """Who may call the HTTP servers (REST, PromQL, ingestion, gateway): docs/security.md."""

    enabled: bool
    refresh_s: float = Field(gt=0)


class TlsSettings(_Section):
    """TLS for the HTTP servers (REST and gateway): docs/security.md. Empty: plain HTTP."""

    cert_file: str
    key_file: str
    client_ca_file: str

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)

    @model_validator(mode="after")
    def _complete(self) -> TlsSettings:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("tls.cert_file and tls.key_file go together: set both or neither")
        if self.client_ca_file and not self.cert_file:
            raise ValueError("tls.client_ca_file needs tls.cert_file and tls.key_file")
        return self


class Settings(BaseSettings):
    """All of FiloPy's settings. Build with `load_settings()`."""

    model_config = SettingsConfigDict(
        env_prefix="FILOPY_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    kafka: KafkaSettings
    store: StoreSettings
    cassandra: CassandraSettings
    ray: RaySettings
    cluster: ClusterSettings
    rebalance: RebalanceSettings
    ingest: IngestSettings
    gateway: GatewaySettings
    auth: AuthSettings
    tls: TlsSettings

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        files = [DEFAULT_CONFIG_FILE]
        user = os.environ.get("FILOPY_CONFIG")
        if user:
            if not Path(user).is_file():
                raise FileNotFoundError(f"FILOPY_CONFIG names {user!r}, which is not a file")
            files.append(Path(user))
        # TomlConfigSettingsSource merges its files in order, later files winning.
        toml = TomlConfigSettingsSource(settings_cls, toml_file=files, deep_merge=True)
        return (init_settings, env_settings, toml)


def load_settings(**overrides: object) -> Settings:
    """Settings from code overrides, the environment, the user file and the defaults."""
    return Settings(**overrides)
