"""Token format, checksum, hashing, verification and log redaction."""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import math

import pytest

from inferd.control.endpoints import tokens
from inferd.control.endpoints.tokens import (
    ADMIN_KEY_PREFIX,
    ENDPOINT_TOKEN_PREFIX,
    TokenVerifier,
    hash_token,
    is_well_formed,
    new_admin_key,
    new_endpoint_token,
)
from inferd.control.model import Change, ChangeKind, ClientToken, Endpoint, utc_now
from inferd.control.stores.memory import MemoryStore
from inferd.redact import RedactingFilter, install_redaction, redact
from tests.support import eventually


class CountingSource:
    def __init__(self, hashes: dict[str, bytes]) -> None:
        self.hashes = hashes
        self.calls = 0

    async def active_token_hashes(self) -> dict[str, bytes]:
        self.calls += 1
        return dict(self.hashes)

    async def active_token_hash(self, endpoint_id: str) -> bytes | None:
        self.calls += 1
        return self.hashes.get(endpoint_id)

    async def client_tokens(self, endpoint_id: str | None = None) -> list[ClientToken]:
        return []  # the owner's tokens only (client tokens: test_client_requests)


def loaded(source: CountingSource) -> TokenVerifier:
    verifier = TokenVerifier(source)  # type: ignore[arg-type]  # the read half only
    asyncio.run(verifier.load())
    return verifier


def test_format_prefix_length_alphabet() -> None:
    token = new_endpoint_token()
    assert token.startswith(ENDPOINT_TOKEN_PREFIX)
    assert len(token) == len(ENDPOINT_TOKEN_PREFIX) + tokens.BODY_LEN + tokens.CHECKSUM_LEN
    assert token[len(ENDPOINT_TOKEN_PREFIX) :].isalnum()
    assert is_well_formed(token)
    key = new_admin_key()
    assert key.startswith(ADMIN_KEY_PREFIX)
    assert is_well_formed(key, ADMIN_KEY_PREFIX)


def test_at_least_128_bits_of_randomness() -> None:
    assert tokens.BODY_LEN * math.log2(62) >= 128
    assert len({new_endpoint_token() for _ in range(200)}) == 200


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-1],  # too short
        lambda t: t + "a",  # too long
        lambda t: "infd_xx_" + t[len("infd_ep_") :],  # other prefix
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # checksum digit changed
        lambda t: t[:10] + ("x" if t[10] != "x" else "y") + t[11:],  # body changed
        lambda t: t[:10] + "-" + t[11:],  # outside the alphabet
        lambda t: "",
        lambda t: "Bearer " + t,
    ],
)
def test_malformed_rejected(mangle: object) -> None:
    token = new_endpoint_token()
    assert callable(mangle)
    assert not is_well_formed(mangle(token))


def test_admin_key_is_not_an_endpoint_token() -> None:
    assert not is_well_formed(new_admin_key(), ENDPOINT_TOKEN_PREFIX)
    assert not is_well_formed(new_endpoint_token(), ADMIN_KEY_PREFIX)


def test_hash_is_sha256_digest() -> None:
    token = new_endpoint_token()
    assert hash_token(token) == hashlib.sha256(token.encode()).digest()


def test_verify_scoped_to_one_endpoint() -> None:
    a, b = new_endpoint_token(), new_endpoint_token()
    verifier = loaded(CountingSource({"ep-a": hash_token(a), "ep-b": hash_token(b)}))
    assert verifier.verify("ep-a", a)
    assert verifier.verify("ep-b", b)
    assert not verifier.verify("ep-a", b)
    assert not verifier.verify("ep-b", a)
    assert not verifier.verify("ep-unknown", a)


def test_malformed_token_rejected_without_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    token = new_endpoint_token()
    source = CountingSource({"ep": hash_token(token)})
    verifier = loaded(source)
    assert source.calls == 1  # the one load at start

    compared: list[object] = []
    monkeypatch.setattr(tokens.hmac, "compare_digest", lambda a, b: compared.append(1) or False)
    hashed: list[str] = []
    monkeypatch.setattr(tokens, "hash_token", lambda t: hashed.append(t) or b"")

    bad = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert not verifier.verify("ep", bad)
    assert source.calls == 1
    assert compared == [] and hashed == []


def test_verify_uses_constant_time_compare(monkeypatch: pytest.MonkeyPatch) -> None:
    token = new_endpoint_token()
    verifier = loaded(CountingSource({"ep": hash_token(token)}))
    real = tokens.hmac.compare_digest
    calls: list[tuple[bytes, bytes]] = []

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(tokens.hmac, "compare_digest", spy)
    assert verifier.verify("ep", token)
    assert calls == [(hash_token(token), hash_token(token))]


def test_set_active_and_forget_take_effect_at_once() -> None:
    old, new = new_endpoint_token(), new_endpoint_token()
    verifier = loaded(CountingSource({"ep": hash_token(old)}))
    verifier.set_active("ep", hash_token(new))
    assert not verifier.verify("ep", old)
    assert verifier.verify("ep", new)
    verifier.forget("ep")
    assert not verifier.verify("ep", new)
    assert len(verifier) == 0


def test_redact_replaces_tokens_and_bearer_values() -> None:
    token, key = new_endpoint_token(), new_admin_key()
    text = f"got {token} and {key}; header Authorization: Bearer operator-secret-123"
    out = redact(text)
    assert token not in out and key not in out and "operator-secret-123" not in out
    assert "infd_ep_***" in out and "infd_admin_***" in out
    # A truncated token is still redacted.
    assert token[:20] not in redact(f"prefix {token[:20]}")


def test_filter_redacts_args_and_tracebacks() -> None:
    token = new_endpoint_token()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("inferd.test.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("token=%s", token)
        try:
            raise ValueError(f"bad token {token}")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    output = stream.getvalue()
    assert token not in output
    assert "token=infd_ep_***" in output
    assert "bad token infd_ep_***" in output


def test_filter_keeps_argument_tuples_for_uvicorn_access_log() -> None:
    from uvicorn.logging import AccessFormatter

    token = new_endpoint_token()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(AccessFormatter('%(client_addr)s "%(request_line)s" %(status_code)s'))
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("inferd.test.access")
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:1", "GET", f"/x?token={token}", "1.1", 200
        )
    finally:
        logger.removeHandler(handler)
    output = stream.getvalue()
    assert token not in output
    assert '"GET /x?token=infd_ep_*** HTTP/1.1" 200' in output


def test_install_redaction_on_root_handlers() -> None:
    root = logging.getLogger()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root.addHandler(handler)
    try:
        install_redaction()
        install_redaction()  # idempotent
        assert sum(isinstance(f, RedactingFilter) for f in handler.filters) == 1
        token = new_endpoint_token()
        logging.getLogger("inferd.test.child").warning("leaked %s", token)
    finally:
        root.removeHandler(handler)
    assert token not in stream.getvalue()


_settle = eventually


def test_follows_another_writers_token_changes() -> None:
    """A token re-issued or an endpoint deleted by another control plane on
    the same database: the change feed brings it into this cache."""

    async def body() -> None:
        store = MemoryStore()
        await store.insert_endpoint(_endpoint("ep"), hash_token(first := new_endpoint_token()))
        verifier = TokenVerifier(store)
        feed = store.changes()
        await verifier.load()
        task = asyncio.ensure_future(verifier.follow(feed))
        assert verifier.verify("ep", first)

        second = new_endpoint_token()
        await store.replace_token("ep", hash_token(second), utc_now())
        await _settle(lambda: verifier.verify("ep", second))
        assert not verifier.verify("ep", first)

        await store.mark_deleting("ep", utc_now())
        await _settle(lambda: len(verifier) == 0)
        await store.close()
        await task  # the feed ends with the store

    asyncio.run(body())


def test_a_stale_read_does_not_undo_a_local_update() -> None:
    """The feed's read of a digest may predate this process's own commit
    that followed it; the local update wins."""

    async def body() -> None:
        old, new = new_endpoint_token(), new_endpoint_token()
        source = CountingSource({"ep": hash_token(old)})
        verifier = TokenVerifier(source)  # type: ignore[arg-type]
        await verifier.load()
        gate = asyncio.Event()
        real = source.active_token_hash

        async def slow(endpoint_id: str) -> bytes | None:
            digest = await real(endpoint_id)  # read now, answer later
            await gate.wait()
            return digest

        source.active_token_hash = slow  # type: ignore[method-assign]
        applying = asyncio.ensure_future(verifier._apply(Change(ChangeKind.TOKEN, "ep")))
        await asyncio.sleep(0)
        verifier.set_active("ep", hash_token(new))  # committed meanwhile
        gate.set()
        await applying
        assert verifier.verify("ep", new) and not verifier.verify("ep", old)

    asyncio.run(body())


def _endpoint(endpoint_id: str) -> Endpoint:
    now = utc_now()
    return Endpoint(
        endpoint_id, endpoint_id, "tiny-chat", "chat", "cpu", 1, "local", 0, 1, 60, 0.0, "USD",
        now, now,
    )  # fmt: skip
