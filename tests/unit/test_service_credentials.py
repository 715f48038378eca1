"""The `[kafka]` and `[cassandra]` credentials and TLS settings: what is refused at load, and
what each Kafka client is given (the secured services themselves: tests/services)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from core.config import CredentialsUnreadable, load_settings
from core.errors import Unavailable
from ingest.kafka_config import ConnectionErrors, kafka_client_config

SASL = {"security_protocol": "SASL_SSL", "sasl_username": "filopy", "sasl_password": "pw"}


@pytest.mark.parametrize(
    ("section", "values", "says"),
    [
        ("kafka", {"security_protocol": "SASL_SSL"}, "needs a sasl_username"),
        ("kafka", {**SASL, "sasl_password_file": "/x"}, "two ways to give one secret"),
        ("kafka", {"ssl_ca_file": "/ca.pem"}, "does not use TLS"),
        ("kafka", {**SASL, "ssl_cert_file": "/c.pem"}, "go together"),
        ("kafka", {"security_protocol": "TLS"}, "security_protocol"),
        ("cassandra", {"password": "pw"}, "needs cassandra.username"),
        ("cassandra", {"ssl_ca_file": "/ca.pem"}, "does not use TLS"),
        ("cassandra", {"ssl": True, "ssl_key_file": "/k.pem"}, "go together"),
    ],
)
def test_incomplete_or_contradictory_settings_are_refused_at_load(
    section: str, values: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValidationError, match=says):
        load_settings(**{section: values})


def test_plaintext_by_default() -> None:
    config = kafka_client_config(load_settings().kafka, "h:1")
    assert config == {"bootstrap.servers": "h:1", "security.protocol": "plaintext"}


def test_every_client_gets_sasl_and_tls_and_a_rotated_password_file(tmp_path: Path) -> None:
    secret, ca = tmp_path / "pw", tmp_path / "ca.pem"
    secret.write_text("first\n")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    kafka = load_settings(
        kafka={
            **SASL,
            "sasl_password": "",
            "sasl_password_file": str(secret),
            "ssl_ca_file": str(ca),
            "ssl_check_hostname": False,
        }
    ).kafka
    errors = ConnectionErrors()
    config = kafka_client_config(kafka, errors=errors)
    assert config == {
        "bootstrap.servers": kafka.bootstrap_servers,
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "filopy",
        "sasl.password": "first",
        "ssl.ca.location": str(ca),
        "ssl.endpoint.identification.algorithm": "none",
        "error_cb": errors,
    }
    secret.write_text("second")  # rotated: the next client reads the new one
    assert kafka_client_config(kafka)["sasl.password"] == "second"
    assert "first" not in repr(kafka) and "second" not in repr(kafka)


def test_unreadable_credentials_are_unavailable_errors_naming_the_setting(tmp_path: Path) -> None:
    kafka = load_settings(kafka={**SASL, "ssl_ca_file": str(tmp_path / "no.pem")}).kafka
    with pytest.raises(CredentialsUnreadable, match=r"kafka\.ssl_ca_file .* does not exist"):
        kafka_client_config(kafka)
    cassandra = load_settings(
        cassandra={"username": "u", "password_file": str(tmp_path / "none")}
    ).cassandra
    with pytest.raises(CredentialsUnreadable, match=r"cassandra\.password_file"):
        cassandra.secret()
    assert issubclass(CredentialsUnreadable, Unavailable)


def test_the_cause_of_refused_connections_is_named_once() -> None:
    from confluent_kafka import KafkaError

    errors = ConnectionErrors()
    errors(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert errors.explain("timed out") == "timed out"  # not a cause
    errors(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials"))
    said = errors.explain("timed out")
    assert said == "timed out (cause: SASL authentication error: invalid credentials)"
    assert errors.explain(said) == said
