"""The console's sessions, CSRF tokens and failed-login limit (pure, on a manual clock)."""

from __future__ import annotations

import hashlib
import hmac

from fleet.clock import ManualClock
from gateway.http.console.login_limit import LoginLimiter
from gateway.http.console.session import SessionSigner

KEYS = {"admin": "root-key", "alice": "alice-key"}


def signer(clock: ManualClock, keys: dict[str, str] | None = None, ttl_s: float = 900.0) -> SessionSigner:
    current = keys if keys is not None else dict(KEYS)
    return SessionSigner(lambda: current, clock=clock, ttl_s=ttl_s)


def test_an_admin_key_opens_a_session_as_its_id_until_it_expires() -> None:
    clock = ManualClock()
    s = signer(clock)
    assert s.login("wrong") is None
    assert s.login("") is None
    issued = s.login("alice-key")
    assert issued is not None
    token, session = issued
    assert session.admin_id == "alice"
    assert s.verify(token) == session
    clock.advance(899)
    assert s.verify(token) is not None
    clock.advance(2)
    assert s.verify(token) is None


def test_a_tampered_token_or_a_changed_admin_key_ends_the_session() -> None:
    clock = ManualClock()
    keys = dict(KEYS)
    s = signer(clock, keys)
    token, _ = s.login("alice-key") or ("", None)
    admin_id, expiry, nonce, mac = token.split(".")
    assert s.verify(f"admin.{expiry}.{nonce}.{mac}") is None  # another id, same MAC
    assert s.verify(f"{admin_id}.{int(expiry) + 3600}.{nonce}.{mac}") is None  # a longer life
    assert s.verify(token + "0") is None
    assert s.verify(None) is None
    assert s.verify("a.b.c") is None
    keys["alice"] = "rotated"
    assert s.verify(token) is None


def test_logout_revokes_the_token_and_csrf_tokens_are_bound_to_the_session() -> None:
    clock = ManualClock()
    s = signer(clock)
    token, session = s.login("root-key") or ("", None)
    assert session is not None
    other_token, other = s.login("root-key") or ("", None)
    assert other is not None
    assert s.csrf_ok(session, session.csrf)
    assert not s.csrf_ok(session, other.csrf)
    assert not s.csrf_ok(session, None)
    assert not s.csrf_ok(session, "")
    s.revoke(session)
    assert s.verify(token) is None
    assert s.verify(other_token) is not None


def test_failed_logins_are_limited_per_address_within_the_window() -> None:
    clock = ManualClock()
    limiter = LoginLimiter(clock=clock, max_failures=3, window_s=60.0)
    for _ in range(3):
        assert limiter.retry_after("10.0.0.1") == 0.0
        limiter.failed("10.0.0.1")
        clock.advance(1)
    wait = limiter.retry_after("10.0.0.1")
    assert 0 < wait <= 60 - 3 + 1
    assert limiter.retry_after("10.0.0.2") == 0.0
    clock.advance(wait)
    assert limiter.retry_after("10.0.0.1") == 0.0


def test_the_limiter_tracks_a_bounded_number_of_addresses() -> None:
    clock = ManualClock()
    limiter = LoginLimiter(clock=clock, max_failures=2, window_s=60.0, max_clients=10)
    for i in range(100):
        limiter.failed(f"10.0.{i}.1")
        limiter.failed(f"10.0.{i}.1")
    assert limiter.tracked <= 10
    assert limiter.retry_after("10.0.99.1") > 0


def test_an_admin_id_without_a_key_signs_no_session() -> None:
    """An empty admin key (``GEARSHIFT_ADMIN_KEY=''`` beside named keys) would make a MAC anyone can compute."""
    clock = ManualClock()
    keys = {"admin": "", "alice": "alice-key"}
    s = signer(clock, keys)
    assert s.login("") is None
    expiry = str(int(clock.wall()) + 60)
    payload = f"admin.{expiry}.nonce"
    mac = hmac.new(b"gearshift-console-session\0", payload.encode(), hashlib.sha256).hexdigest()
    forged = f"{payload}.{mac}"
    assert s.verify(forged) is None
    assert s.login("alice-key") is not None
