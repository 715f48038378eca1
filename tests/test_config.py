"""Settings precedence: environment > user file > the shipped defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from core.config import DEFAULT_CONFIG_FILE, load_settings


def test_defaults_come_from_the_shipped_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FILOPY_CONFIG", raising=False)
    s = load_settings()
    text = DEFAULT_CONFIG_FILE.read_text()
    assert 'backend = "sqlite"' in text and s.store.backend == "sqlite"
    assert s.cassandra.port == 9042
    assert s.kafka.bootstrap_servers == "127.0.0.1:9092"


def test_user_file_overrides_one_key_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = tmp_path / "mine.toml"
    user.write_text('[cassandra]\nkeyspace = "prod_ts"\n[store]\nbackend = "cassandra"\n')
    monkeypatch.setenv("FILOPY_CONFIG", str(user))
    s = load_settings()
    assert s.cassandra.keyspace == "prod_ts"
    assert s.store.backend == "cassandra"
    assert s.cassandra.port == 9042  # untouched keys keep their defaults


def test_environment_beats_user_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "mine.toml"
    user.write_text("[cassandra]\nport = 9100\n")
    monkeypatch.setenv("FILOPY_CONFIG", str(user))
    monkeypatch.setenv("FILOPY_CASSANDRA__PORT", "9200")
    assert load_settings().cassandra.port == 9200


def test_bad_values_are_rejected_with_the_setting_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FILOPY_STORE__BACKEND", "postgres")
    with pytest.raises(ValidationError, match=r"store\.backend"):
        load_settings()


def test_missing_user_file_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FILOPY_CONFIG", "/nonexistent/filopy.toml")
    with pytest.raises(FileNotFoundError, match="FILOPY_CONFIG"):
        load_settings()


def test_configuration_reference_matches_the_code() -> None:
    from filopy.config_doc import documented_settings, model_settings, render

    documented = documented_settings()
    assert set(documented) == model_settings()
    undocumented = [name for name, (_, meaning) in documented.items() if not meaning]
    assert undocumented == [], f"settings without a comment in config/filopy.toml: {undocumented}"
    reference = DEFAULT_CONFIG_FILE.parent.parent / "docs" / "configuration.md"
    assert reference.read_text() == render(), (
        "docs/configuration.md is stale: run `python -m filopy.config_doc > docs/configuration.md`"
    )
