"""Every FiloPy Kafka client's connection settings: servers, TLS and SASL, in one place.

The admin clients (topics, metrics), the gateway's producer and the ingesters' consumers all
start from `kafka_client_config`, so a setting of `[kafka]` reaches each of them and none can
forget it. The secured settings apply to every Kafka FiloPy dials, datasets' own servers too.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError

from core.config import KafkaSettings, check_readable, load_settings


def kafka_client_config(
    kafka: KafkaSettings | None = None,
    bootstrap_servers: str | None = None,
    errors: ConnectionErrors | None = None,
) -> dict[str, Any]:
    """librdkafka's connection settings from `[kafka]` (this process's settings if None), for
    `bootstrap_servers` (default: `kafka.bootstrap_servers`), with `errors` as the error
    callback if given. The SASL password is read here, from the settings or its file, so each
    new client sees a rotated one."""
    k = kafka if kafka is not None else load_settings().kafka
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers or k.bootstrap_servers,
        "security.protocol": k.security_protocol.lower(),
    }
    if errors is not None:
        config["error_cb"] = errors
    if k.sasl:
        config["sasl.mechanism"] = k.sasl_mechanism
        config["sasl.username"] = k.sasl_username
        config["sasl.password"] = k.password()
    if k.tls:
        check_readable(
            **{
                "kafka.ssl_ca_file": k.ssl_ca_file,
                "kafka.ssl_cert_file": k.ssl_cert_file,
                "kafka.ssl_key_file": k.ssl_key_file,
            }
        )
        # "probe": the system's CA bundle, wherever this OS keeps it (the wheel's OpenSSL
        # does not know where that is).
        config["ssl.ca.location"] = k.ssl_ca_file or "probe"
        if k.ssl_cert_file:
            config["ssl.certificate.location"] = k.ssl_cert_file
            config["ssl.key.location"] = k.ssl_key_file
        config["ssl.endpoint.identification.algorithm"] = (
            "https" if k.ssl_check_hostname else "none"
        )
    return config


# What librdkafka reports through its error callback when a connection is refused for a reason a
# failed request does not repeat: a password refused, a certificate not trusted.
_TELLING = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.ILLEGAL_SASL_STATE,
        KafkaError.UNSUPPORTED_SASL_MECHANISM,
    }
)


class ConnectionErrors:
    """A client's error callback (`error_cb`): remembers why its connections fail, so an error
    after a timeout can name the cause ("SASL authentication error: ... invalid credentials")
    rather than only "broker transport failure". librdkafka calls it from `poll`/`consume`."""

    def __init__(self) -> None:
        self.cause: str | None = None

    def __call__(self, err: KafkaError) -> None:
        if err.code() in _TELLING:
            self.cause = err.str()

    def explain(self, message: str) -> str:
        """The message, with the cause of the failed connections if one is known."""
        if self.cause is None or self.cause in message:
            return message
        return f"{message} (cause: {self.cause})"
