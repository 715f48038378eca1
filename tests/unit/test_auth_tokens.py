"""core/auth.py: a token's text, its secret check, scopes and what a principal may do. Pure: the
store side (put, list, revoke on both backends) is tests/stores/test_contract.py's."""

from __future__ import annotations

import dataclasses
import hashlib
import re

import pytest

from core.auth import PREFIX, SCOPES, Principal, Token, check_scopes, new_token, split
from core.errors import Invalid

T0 = 1_700_000_000_000


def _secret(text: str) -> str:
    """The secret of a token's text, cut by hand (it may hold `_` itself)."""
    prefix, _token_id, secret = text.split("_", 2)
    assert prefix == PREFIX
    return secret


def test_a_token_text_is_prefix_id_and_secret_and_splits_back() -> None:
    token, text = new_token("grafana", ["read"], T0)
    assert re.fullmatch(rf"{PREFIX}_[0-9a-f]{{12}}_[A-Za-z0-9_-]{{43}}", text)
    parts = split(text)
    assert parts is not None
    token_id, secret = parts
    assert token_id == token.id and text == f"{PREFIX}_{token_id}_{secret}"
    assert split(f"  {text}\n") == parts  # pasted with whitespace around it


def test_new_tokens_have_distinct_ids_and_secrets() -> None:
    made = [new_token("n", ["read"], T0) for _ in range(200)]
    assert len({t.id for t, _ in made}) == len({text for _, text in made}) == 200
    for token, text in made:  # the secret's alphabet has `_`: split finds it all the same
        assert split(text) == (token.id, _secret(text))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "fpy",
        "fpy__",
        "xyz_0123456789ab_" + "a" * 43,  # another prefix
        "FPY_0123456789ab_" + "a" * 43,
        "fpy_0123456789AB_" + "a" * 43,  # ids are lowercase hex
        "fpy_0123456789a_" + "a" * 43,  # an id too short
        "fpy_0123456789abc_" + "a" * 43,
        "fpy_0123456789ab_" + "a" * 42,  # a secret too short
        "fpy_0123456789ab_" + "a" * 44,
        "fpy_0123456789ab_" + "a" * 42 + "=",  # not URL-safe base64
        "fpy_0123456789ab_" + "a" * 42 + "/",
        "Bearer fpy_0123456789ab_" + "a" * 43,
        "fpy_0123456789ab_" + "a" * 43 + " extra",
    ],
)
def test_split_refuses_what_is_not_a_token(text: str) -> None:
    assert split(text) is None


def test_a_token_matches_only_its_own_secret() -> None:
    token, text = new_token("ci", ["write"], T0)
    other, other_text = new_token("ci", ["write"], T0)
    secret = _secret(text)
    assert split(text) == (token.id, secret)
    assert token.matches(secret)
    assert not token.matches(_secret(other_text))
    assert not other.matches(secret)
    assert not token.matches("")
    assert not token.matches(text)  # the whole text is not the secret
    assert not token.matches(secret[:-1] + ("A" if secret[-1] != "A" else "B"))
    assert not token.matches(token.secret_sha256)  # nor is its stored digest


def test_only_the_secrets_sha256_is_kept() -> None:
    token, text = new_token("ci", ["write"], T0)
    secret = _secret(text)
    assert token.secret_sha256 == hashlib.sha256(secret.encode()).hexdigest()
    fields = dataclasses.asdict(token)
    assert all(secret not in str(v) for v in fields.values())


def test_new_token_normalises_and_checks_what_it_is_given() -> None:
    token, _ = new_token(
        "  edge gateway ", ["write", "write"], T0, datasets=["b", "a", "b"], tenant=""
    )
    assert token.name == "edge gateway"
    assert token.scopes == frozenset({"write"})
    assert token.datasets == ("a", "b")  # sorted, once each
    assert token.tenant is None  # "" is no tenant: any
    assert token.created_ms == T0 and token.revoked_ms is None and not token.revoked
    assert new_token("w", ["write"], T0, tenant="team-a")[0].tenant == "team-a"
    with pytest.raises(Invalid, match="name"):
        new_token("  ", ["read"], T0)
    with pytest.raises(Invalid, match="scopes"):
        new_token("x", ["root"], T0)


def test_check_scopes_takes_some_known_scopes() -> None:
    assert check_scopes(["read"]) == frozenset({"read"})
    assert check_scopes(iter(["admin", "read", "admin"])) == frozenset({"admin", "read"})
    assert check_scopes(SCOPES) == frozenset(SCOPES) == frozenset({"read", "write", "admin"})
    with pytest.raises(Invalid, match="scopes must be some of"):
        check_scopes([])
    with pytest.raises(Invalid, match="root"):
        check_scopes(["read", "root"])
    with pytest.raises(Invalid):
        check_scopes(["Read"])  # exact names
    with pytest.raises(Invalid):
        check_scopes("read")  # a str is not a list of scopes
    with pytest.raises(ValueError):  # Invalid is a ValueError, as callers expect of bad input
        check_scopes(["nope"])


@pytest.mark.parametrize(
    ("scopes", "has"),
    [
        (["read"], {"read"}),
        (["write"], {"write"}),
        (["read", "write"], {"read", "write"}),
        (["admin"], {"read", "write", "admin"}),  # admin includes read and write
    ],
)
def test_a_principal_has_its_scopes_and_admin_has_all(scopes: list[str], has: set[str]) -> None:
    principal = new_token("p", scopes, T0)[0].principal()
    assert {s for s in SCOPES if principal.has(s)} == has


def test_a_principal_without_datasets_may_use_every_dataset() -> None:
    principal = new_token("all", ["read"], T0)[0].principal()
    assert principal.may_use("metrics") and principal.may_use("anything")


def test_a_principal_with_datasets_may_use_only_those() -> None:
    principal = new_token("some", ["admin"], T0, datasets=["metrics", "logs"])[0].principal()
    assert principal.may_use("metrics") and principal.may_use("logs")
    assert not principal.may_use("billing")
    assert not principal.may_use("metric")  # whole names, not prefixes
    assert not principal.may_use("")


def test_a_tokens_principal_carries_who_and_what() -> None:
    token, _ = new_token("edge", ["write"], T0, datasets=["m"], tenant="t1")
    assert token.principal() == Principal(token.id, "edge", frozenset({"write"}), ("m",), "t1")


def test_secrets_never_show_in_repr() -> None:
    token, text = new_token("ci", ["admin"], T0, datasets=["m"])
    secret = _secret(text)
    revoked = dataclasses.replace(token, revoked_ms=T0 + 1)
    for shown in (repr(token), str(token), repr(revoked), repr(token.principal())):
        assert secret not in shown
        assert token.secret_sha256 not in shown  # the digest is not shown either
        assert "secret" not in shown
    assert token.id in repr(token) and "ci" in repr(token)  # what names it is shown
    assert repr([token]).count(token.id) == 1


def test_tokens_are_frozen_values() -> None:
    token, _ = new_token("ci", ["read"], T0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        token.revoked_ms = T0  # type: ignore[misc]
    assert token == Token(**{f.name: getattr(token, f.name) for f in dataclasses.fields(token)})
