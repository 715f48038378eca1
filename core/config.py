"""FiloPy settings: one typed object built from the default file, a user file and the environment.

Precedence, highest first: values passed in code, `FILOPY_<SECTION>__<KEY>` environment variables,
the user file named by `FILOPY_CONFIG`, then `config/filopy.toml` shipped with the project. Every
setting is documented in that default file, which is the single place defaults are written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from core.errors import Unavailable

DEFAULT_CONFIG_FILE = Path(__file__).resolve().parent.parent / "config" / "filopy.toml"


Consistency = Literal["ONE", "LOCAL_ONE", "QUORUM", "LOCAL_QUORUM", "ALL"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CredentialsUnreadable(Unavailable):
    """A password file or a TLS file the settings name cannot be read: no client can connect."""


def read_secret(value: SecretStr, file: str, name: str) -> str:
    """A secret given inline (the toml, or its environment variable) or by `<name>_file`.

    The file is read each time a client is made, so a rotated secret is picked up by the next
    connection without a restart; one trailing newline is dropped."""
    if not file:
        return value.get_secret_value()
    try:
        text = Path(file).read_text()
    except OSError as e:
        why = e.strerror or str(e)
        raise CredentialsUnreadable(f"cannot read {name}_file {file!r}: {why}") from None
    return text[:-1] if text.endswith("\n") else text


def check_readable(**files: str) -> None:
    """Raise `CredentialsUnreadable` naming the first setting whose file cannot be read (the
    clients would fail later, less clearly, or not at all until a connection is made)."""
    for name, path in files.items():
        if path and not os.access(path, os.R_OK):
            why = "does not exist" if not os.path.exists(path) else "is not readable"
            raise CredentialsUnreadable(f"{name} {path!r} {why}")


def _one_secret(value: SecretStr, file: str, name: str) -> None:
    if value.get_secret_value() and file:
        raise ValueError(f"{name} and {name}_file are two ways to give one secret: set one")


def _tls_files(enabled: bool, ca: str, cert: str, key: str, where: str) -> None:
    if bool(cert) != bool(key):
        raise ValueError(f"{where}.ssl_cert_file and {where}.ssl_key_file go together")
    if not enabled and (ca or cert):
        raise ValueError(f"{where}.ssl_* files are set but {where} does not use TLS")


class KafkaSettings(_Section):
    bootstrap_servers: str
    security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL"]
    sasl_mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]
    sasl_username: str
    sasl_password: SecretStr
    sasl_password_file: str
    ssl_ca_file: str
    ssl_cert_file: str
    ssl_key_file: str
    ssl_check_hostname: bool

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @model_validator(mode="after")
    def _complete(self) -> KafkaSettings:
        _one_secret(self.sasl_password, self.sasl_password_file, "kafka.sasl_password")
        if self.sasl and not self.sasl_username:
            raise ValueError(
                f"kafka.security_protocol {self.security_protocol} needs a sasl_username"
            )
        _tls_files(self.tls, self.ssl_ca_file, self.ssl_cert_file, self.ssl_key_file, "kafka")
        return self

    def password(self) -> str:
        """The SASL password, from the settings or its file."""
        return read_secret(self.sasl_password, self.sasl_password_file, "kafka.sasl_password")


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
    username: str
    password: SecretStr
    password_file: str
    ssl: bool
    ssl_ca_file: str
    ssl_cert_file: str
    ssl_key_file: str
    ssl_check_hostname: bool

    @model_validator(mode="after")
    def _complete(self) -> CassandraSettings:
        _one_secret(self.password, self.password_file, "cassandra.password")
        has_secret = bool(self.password.get_secret_value() or self.password_file)
        if has_secret and not self.username:
            raise ValueError("cassandra.password needs cassandra.username")
        _tls_files(self.ssl, self.ssl_ca_file, self.ssl_cert_file, self.ssl_key_file, "cassandra")
        return self

    def secret(self) -> str:
        """The password, from the settings or its file."""
        return read_secret(self.password, self.password_file, "cassandra.password")


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


class QuerySettings(_Section):
    """Per-tenant limits of PromQL queries (docs/security.md); 0 turns a limit off."""

    tenant_max_samples: int = Field(ge=0)
    tenant_max_series: int = Field(ge=0)


class DownsampleSettings(_Section):
    """Downsampling on the nodes (docs/lifecycle.md): resolutions, when a period is complete,
    how long each resolution is kept."""

    resolutions_ms: list[int]
    delay_s: float = Field(ge=0)
    interval_s: float = Field(gt=0)
    retention_days: list[float]

    @model_validator(mode="after")
    def _one_retention_each(self) -> DownsampleSettings:
        res = self.resolutions_ms
        if any(r < 1000 or r % 1000 for r in res) or len(set(res)) != len(res):
            raise ValueError("downsample.resolutions_ms: distinct whole seconds, in ms")
        if len(self.retention_days) != len(self.resolutions_ms) or any(
            d < 0 for d in self.retention_days
        ):
            raise ValueError(
                "downsample.retention_days: one value (days, 0: forever) per resolution"
            )
        return self

    def retention_ms(self, resolution_ms: int) -> int:
        """How long periods of the resolution are kept (0: forever)."""
        days = self.retention_days[self.resolutions_ms.index(resolution_ms)]
        return round(days * 86_400_000)


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
    query: QuerySettings
    downsample: DownsampleSettings
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
