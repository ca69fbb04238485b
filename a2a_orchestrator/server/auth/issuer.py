"""`Issuer`: an OAuth2 / OpenID Connect identity provider the operator trusts,
and the bearer JWTs it signs.

A JWT is accepted when it is signed by one of the issuer's published keys
(its JWKS) with an asymmetric algorithm, names the issuer (`iss`) and this
server's audience (`aud`), has not expired (`exp`, with `leeway` seconds of
clock skew; `nbf` and `iat` likewise) and names its subject (`sub`, the
caller). Verification is PyJWT's (`pyjwt[crypto]`).

Refused outright, before any key is looked at: `alg: none`, and the HMAC
algorithms (HS256 ...): a verifier that let a token choose HS256 would check
it against the public key's bytes as a shared secret, which anyone can
forge. Symmetric (`oct`) keys in the JWKS are ignored for the same reason,
and a key whose own `alg` differs from the token's is not used.

Keys: the JWKS URL is given, or found in the issuer's
`/.well-known/openid-configuration` (whose `issuer` must be the configured
one). Keys are cached and fetched again when older than `max_age`, or when
a token names a key id (`kid`) not among them (the issuer rotated its keys);
fetches happen at most once per `min_refresh` seconds, so tokens with made-up
key ids cannot make the server hammer the issuer. Concurrent requests share
one fetch. When the issuer cannot be reached the keys already held are kept;
with none held, the token cannot be checked (`IssuerUnavailableError`).

The keys must come over https: over plain http anyone on the path could
hand the server their own keys. Plain http is allowed to a loopback address
(tests, a sidecar).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import jwt
from jwt import PyJWK

from ...errors import ConfigError, CredentialError, IssuerUnavailableError

__all__ = ["ASYMMETRIC_ALGORITHMS", "DEFAULT_LEEWAY", "Issuer", "discovery_url"]

logger = logging.getLogger(__name__)

ASYMMETRIC_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
"""The signature algorithms a token may use; nothing else is accepted."""

DEFAULT_LEEWAY = 60.0
"""Seconds of clock skew allowed on `exp`, `nbf` and `iat`."""

_KEY_TYPES = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}


def discovery_url(issuer: str) -> str:
    """The issuer's OpenID Connect discovery document."""
    return issuer.rstrip("/") + "/.well-known/openid-configuration"


def _check_transport(url: str, what: str) -> None:
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname:
        host = parts.hostname
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if loopback:
            return
    raise ConfigError(
        f"{what} {url!r} must be an https URL (plain http only to a loopback address): "
        "keys fetched over plain http could be anyone's"
    )


class Issuer:
    """Verifies bearer JWTs against one issuer's keys (see the module docstring).

    Owns an httpx client unless given one; close it with `aclose()`.
    """

    def __init__(
        self,
        issuer: str,
        audience: str,
        *,
        jwks_url: str | None = None,
        leeway: float = DEFAULT_LEEWAY,
        http: httpx.AsyncClient | None = None,
        max_age: float = 600.0,
        min_refresh: float = 30.0,
        timeout: float = 10.0,
    ) -> None:
        if not issuer:
            raise ConfigError("an issuer URL is needed to accept JWTs")
        if not audience:
            raise ConfigError(
                "an audience is needed to accept JWTs: without one, a token the issuer "
                "made for any other service would be accepted here"
            )
        if leeway < 0:
            raise ConfigError("the JWT clock-skew leeway must be >= 0 seconds")
        if jwks_url is not None:
            _check_transport(jwks_url, "JWKS URL")
        else:
            _check_transport(issuer, "issuer")
        self.issuer = issuer
        self.audience = audience
        self.jwks_url = jwks_url
        self.leeway = leeway
        self.max_age = max_age
        self.min_refresh = min_refresh
        self._own_http = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._keys: tuple[Mapping[str, Any], ...] = ()
        self._fetched_at: float | None = None
        self._attempted_at: float | None = None
        self._lock = anyio.Lock()
        self.fetches = 0
        """How many times the keys were fetched (successfully or not)."""

    @property
    def discovery_url(self) -> str | None:
        """Where the JWKS URL is found, when it is not given."""
        return None if self.jwks_url is not None else discovery_url(self.issuer)

    async def verify(self, token: str) -> dict[str, Any]:
        """The token's claims, once everything checks out.

        Raises `CredentialError` saying what is wrong (safe to show the
        caller), `IssuerUnavailableError` when no key can be had to check it.
        """
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise CredentialError("malformed token") from exc
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ASYMMETRIC_ALGORITHMS:
            shown = str(alg)[:16]  # the caller's text: echoed short
            raise CredentialError(f"signature algorithm {shown!r} is not accepted")
        kid = header.get("kid")
        keys = await self._candidates(kid, alg)
        if not keys:
            raise CredentialError("token signed by a key the issuer does not publish")
        for jwk in keys:
            try:
                key = PyJWK(dict(jwk), algorithm=alg)
            except (jwt.PyJWTError, ValueError, TypeError):
                continue  # a key of another type, or one PyJWT cannot load
            try:
                claims = jwt.decode(
                    token,
                    key=key,
                    algorithms=[alg],
                    audience=self.audience,
                    issuer=self.issuer,
                    leeway=self.leeway,
                    options={"require": ["exp", "iss", "aud", "sub"]},
                )
            except jwt.InvalidSignatureError:
                continue  # another key of the set may have signed it (no kid)
            except jwt.ExpiredSignatureError as exc:
                raise CredentialError("token expired") from exc
            except jwt.InvalidAudienceError as exc:
                raise CredentialError("token is not for this audience") from exc
            except jwt.InvalidIssuerError as exc:
                raise CredentialError("token is from another issuer") from exc
            except jwt.ImmatureSignatureError as exc:
                raise CredentialError("token is not valid yet") from exc
            except jwt.MissingRequiredClaimError as exc:
                raise CredentialError(f"token has no {exc.claim!r} claim") from exc
            except (jwt.PyJWTError, ValueError, TypeError) as exc:
                # A claim of the wrong type and the like: refused, never a 500.
                raise CredentialError("token is not valid") from exc
            subject = claims.get("sub")
            if not isinstance(subject, str) or not subject:
                raise CredentialError("token has no subject")
            return claims
        raise CredentialError("token signature does not verify")

    async def _candidates(self, kid: object, alg: str) -> list[Mapping[str, Any]]:
        """The published keys that may have signed a token with `kid` and `alg`."""
        now = anyio.current_time()
        stale = self._fetched_at is None or now - self._fetched_at > self.max_age
        if stale:
            await self._refresh()
        found = _matching(self._keys, kid, alg)
        if not found and kid is not None and not stale:
            # A key id we do not know: the issuer may have rotated its keys.
            await self._refresh()
            found = _matching(self._keys, kid, alg)
        if not found and self._fetched_at is None:
            raise IssuerUnavailableError(
                f"cannot check the token now: the keys of {self.issuer} are unavailable"
            )
        return found

    async def _refresh(self) -> None:
        """Fetch the keys, unless a fetch happened less than `min_refresh` ago."""
        async with self._lock:
            now = anyio.current_time()
            if self._attempted_at is not None and now - self._attempted_at < self.min_refresh:
                return  # fetched (or tried) a moment ago, maybe while we waited
            self._attempted_at = now
            self.fetches += 1
            try:
                keys = await self._fetch()
            except (httpx.HTTPError, ValueError) as exc:
                # Kept: the keys held before (if any) still check tokens.
                logger.warning("cannot fetch the keys of %s: %s", self.issuer, exc)
                return
            self._keys = keys
            self._fetched_at = anyio.current_time()

    async def _fetch(self) -> tuple[Mapping[str, Any], ...]:
        jwks_url = self.jwks_url
        if jwks_url is None:
            metadata = await self._json(discovery_url(self.issuer))
            if metadata.get("issuer") != self.issuer:
                raise ValueError(
                    f"the discovery document names issuer {metadata.get('issuer')!r}, "
                    f"not {self.issuer!r}"
                )
            jwks_url = metadata.get("jwks_uri")
            if not isinstance(jwks_url, str):
                raise ValueError("the discovery document has no jwks_uri")
            try:
                _check_transport(jwks_url, "jwks_uri")
            except ConfigError as exc:
                raise ValueError(str(exc)) from exc
            # Found once: later fetches go to the keys directly.
            self.jwks_url = jwks_url
        document = await self._json(jwks_url)
        keys = document.get("keys")
        if not isinstance(keys, list):
            raise ValueError(f"{jwks_url} is not a JWKS (no 'keys' list)")
        return tuple(key for key in keys if _usable(key))

    async def _json(self, url: str) -> dict[str, Any]:
        response = await self._http.get(url, headers={"Accept": "application/json"})
        response.raise_for_status()
        data = response.json()
        if not isinstance(data, dict):
            raise ValueError(f"{url} did not answer a JSON object")
        return data

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()


def _usable(key: object) -> bool:
    """A signature key of an asymmetric type (never `oct`)."""
    return (
        isinstance(key, dict)
        and key.get("kty") in ("RSA", "EC", "OKP")
        and key.get("use", "sig") == "sig"
    )


def _matching(
    keys: tuple[Mapping[str, Any], ...], kid: object, alg: str
) -> list[Mapping[str, Any]]:
    kty = _KEY_TYPES[alg[:2]]
    return [
        key
        for key in keys
        if key.get("kty") == kty
        and key.get("alg", alg) == alg
        and (kid is None or key.get("kid") == kid)
    ]
