"""What the orchestrator presents to an agent: a2a-sdk `CredentialService`s.

The SDK's `AuthInterceptor` asks a credential service for each call, for the
security schemes the agent's card declares, and sends the answer as
`Authorization: Bearer ...` (HTTP bearer, OAuth2 and OpenID Connect schemes
alike). Both services here answer for any scheme: one agent takes one
credential, and a role server accepts a caller token and a JWT in the same
header.

- `StaticToken`: a per-agent token (`token_env`).
- `ClientCredentials`: the OAuth2 client credentials grant (RFC 6749 section
  4.4) at the agent's `token_url`, the client authenticating with HTTP Basic.
  The token is kept and fetched again shortly before it expires (a minute
  before, or half its lifetime for short-lived ones), so no call goes out
  with a token about to lapse; concurrent calls share one fetch. A token
  endpoint that refuses is a `ProtocolError`, one that cannot be reached an
  `AgentUnavailableError` (retried like any unreachable agent).
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
from a2a.client import CredentialService

from ...errors import AgentUnavailableError, ConfigError, ProtocolError
from ..network import AgentSpec

__all__ = ["ClientCredentials", "StaticToken", "credential_service"]

_DEFAULT_LIFETIME = 300.0
"""Seconds a token is assumed to live when the endpoint does not say (`expires_in`)."""

_REFRESH_MARGIN = 60.0


class StaticToken(CredentialService):
    """The same token for every call."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def get_credentials(self, security_scheme_name: str, context: Any) -> str | None:
        return self._token


class ClientCredentials(CredentialService):
    """Tokens by the OAuth2 client credentials grant (see the module docstring)."""

    def __init__(
        self,
        token_url: str,
        client_id: str,
        client_secret: str,
        *,
        http: httpx.AsyncClient,
        scope: str | None = None,
        audience: str | None = None,
    ) -> None:
        self.token_url = token_url
        self.client_id = client_id
        self._secret = client_secret
        self._http = http
        self.scope = scope
        self.audience = audience
        self._token: str | None = None
        self._refresh_at = 0.0
        self._lock = anyio.Lock()
        self.fetches = 0
        """How many tokens were fetched."""

    async def get_credentials(self, security_scheme_name: str, context: Any) -> str | None:
        async with self._lock:
            if self._token is None or anyio.current_time() >= self._refresh_at:
                await self._fetch()
            return self._token

    async def _fetch(self) -> None:
        form = {"grant_type": "client_credentials"}
        if self.scope:
            form["scope"] = self.scope
        if self.audience:
            form["audience"] = self.audience
        started = anyio.current_time()
        try:
            response = await self._http.post(
                self.token_url,
                data=form,
                auth=httpx.BasicAuth(self.client_id, self._secret),
                headers={"Accept": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise AgentUnavailableError(
                f"token endpoint {self.token_url} is unreachable: {exc}"
            ) from exc
        if response.status_code != 200:
            raise ProtocolError(
                f"token endpoint {self.token_url} refused client {self.client_id!r} "
                f"({response.status_code}): {_oauth_error(response)}"
            )
        try:
            body = response.json()
        except ValueError:
            body = None
        token = body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise ProtocolError(f"token endpoint {self.token_url} answered without access_token")
        lifetime = body.get("expires_in", _DEFAULT_LIFETIME) if isinstance(body, dict) else None
        if isinstance(lifetime, bool) or not isinstance(lifetime, int | float) or lifetime <= 0:
            lifetime = _DEFAULT_LIFETIME
        self._token = token
        self._refresh_at = started + lifetime - min(_REFRESH_MARGIN, lifetime / 2)
        self.fetches += 1


def _oauth_error(response: httpx.Response) -> str:
    """The endpoint's `error` (and description) when it sent RFC 6749 JSON."""
    try:
        body = response.json()
    except ValueError:
        return response.reason_phrase
    if not isinstance(body, dict) or "error" not in body:
        return response.reason_phrase
    description = body.get("error_description")
    return f"{body['error']}" + (f": {description}" if description else "")


def credential_service(spec: AgentSpec, http: httpx.AsyncClient) -> CredentialService | None:
    """The credentials an agent's spec asks for (None: calls go without).

    Raises `ConfigError` when the client secret's variable is not set.
    """
    if spec.token_url is not None:
        secret = spec.client_secret()
        if secret is None:
            raise ConfigError(
                f"agent {spec.name!r}: ${spec.client_secret_env} (its OAuth2 client secret) "
                "is not set"
            )
        return ClientCredentials(
            spec.token_url,
            spec.client_id or "",
            secret,
            http=http,
            scope=spec.scope,
            audience=spec.audience,
        )
    token = spec.token()
    return StaticToken(token) if token else None
