"""`Access`: who may call a server, how a caller proves it, and what the card says.

Three kinds of credential, any of them together, all sent as
`Authorization: Bearer <credential>`:

- the server's single token (`A2A_AUTH_TOKEN`): the caller `default`;
- a callers file (`CallerFile`): a token per caller, reloaded when it changes;
- an issuer (`Issuer`): OAuth2 bearer JWTs; the caller is the token's `sub`.

A credential is compared with the tokens first (constant time); one that is
no token and has the shape of a JWT is then checked as one. The agent card
declares every scheme accepted, each an alternative: `bearer` (tokens),
`oidc` (an issuer found by discovery) or `jwt` (an issuer with a given JWKS
URL).

Each caller has an owner key (`Caller.owner`): a2a-sdk's task stores scope
tasks by it (the `ServerCallContext` user's `user_name`), the orchestrator
its sessions, the quotas their usage.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from pathlib import Path

from a2a.types import (
    HTTPAuthSecurityScheme,
    OpenIdConnectSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)

from ...errors import ConfigError, CredentialError
from .callers import DEFAULT_CALLER, Caller, CallerFile, CallerKind, Limits
from .issuer import DEFAULT_LEEWAY, Issuer

__all__ = ["BEARER_SCHEME", "JWT_SCHEME", "OIDC_SCHEME", "Access"]

BEARER_SCHEME = "bearer"
OIDC_SCHEME = "oidc"
JWT_SCHEME = "jwt"


class Access:
    """A server's callers (see the module docstring). Close with `aclose()`."""

    def __init__(
        self,
        *,
        token: str | None = None,
        callers: CallerFile | None = None,
        issuer: Issuer | None = None,
    ) -> None:
        if token is not None and not token:
            raise ConfigError("an empty token would accept anyone")
        if token is None and callers is None and issuer is None:
            raise ConfigError("no way for a caller to authenticate: give a token, file or issuer")
        # Kept as a digest: comparing digests takes the same time whatever
        # the length of the credential tried.
        self._token = hashlib.sha256(token.encode()).digest() if token else None
        self.callers = callers
        self.issuer = issuer

    @classmethod
    def configure(
        cls,
        *,
        token: str | None = None,
        callers_file: str | Path | None = None,
        issuer: str | None = None,
        audience: str | None = None,
        jwks_url: str | None = None,
        leeway: float = DEFAULT_LEEWAY,
    ) -> Access | None:
        """The access of a server's settings; `None` when none is set (no auth).

        Raises `ConfigError` for a missing callers file, or an incomplete
        issuer (the audience is required).
        """
        if (audience or jwks_url) and not issuer:
            raise ConfigError("a JWT audience or JWKS URL needs the issuer too")
        callers = CallerFile(callers_file) if callers_file else None
        verifier = (
            Issuer(issuer, audience or "", jwks_url=jwks_url, leeway=leeway) if issuer else None
        )
        if not (token or callers or verifier):
            return None
        return cls(token=token or None, callers=callers, issuer=verifier)

    async def authenticate(self, credential: str) -> Caller:
        """The caller `credential` (a bearer token or JWT) belongs to.

        Raises `CredentialError` (or `IssuerUnavailableError`, from the
        issuer) when it cannot be accepted.
        """
        if not credential:
            raise CredentialError("missing bearer token")
        found: Caller | None = None
        if self._token is not None:
            digest = hashlib.sha256(credential.encode()).digest()
            if hmac.compare_digest(digest, self._token):
                # The server's own token: its operator's.
                found = Caller(name=DEFAULT_CALLER, kind=CallerKind.TOKEN, operator=True)
        if self.callers is not None:
            # Looked at even after a match, so the time says nothing about which.
            matched = self.callers.match(credential)
            found = found or matched
        if found is not None:
            return found
        if self.issuer is not None and credential.count(".") == 2:
            claims = await self.issuer.verify(credential)
            return Caller(name=str(claims["sub"]), kind=CallerKind.JWT)
        raise CredentialError("invalid bearer token")

    def limits(self, owner: str) -> Limits:
        """The limits of the caller with owner key `owner` (none without a callers file)."""
        if self.callers is None:
            return Limits()
        return self.callers.limits(Caller.from_owner(owner))

    def security(self) -> tuple[dict[str, SecurityScheme], list[SecurityRequirement]]:
        """The card's security schemes and requirements (any one of them will do)."""
        schemes: dict[str, SecurityScheme] = {}
        if self._token is not None or self.callers is not None:
            schemes[BEARER_SCHEME] = SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="bearer", description="A caller token issued by the server's operator"
                )
            )
        issuer = self.issuer
        if issuer is not None:
            about = f"A JWT from {issuer.issuer} for audience {issuer.audience!r}"
            if issuer.discovery_url is not None:
                schemes[OIDC_SCHEME] = SecurityScheme(
                    open_id_connect_security_scheme=OpenIdConnectSecurityScheme(
                        open_id_connect_url=issuer.discovery_url, description=about
                    )
                )
            else:
                schemes[JWT_SCHEME] = SecurityScheme(
                    http_auth_security_scheme=HTTPAuthSecurityScheme(
                        scheme="bearer", bearer_format="JWT", description=about
                    )
                )
        return schemes, _alternatives(list(schemes))

    def describe(self) -> str:
        """One line for the server's start-up banner."""
        ways = []
        if self._token is not None:
            ways.append(f"the {DEFAULT_CALLER!r} token")
        if self.callers is not None:
            ways.append(f"caller tokens from {self.callers.path}")
        if self.issuer is not None:
            ways.append(f"JWTs from {self.issuer.issuer} (audience {self.issuer.audience!r})")
        return ", ".join(ways)

    async def aclose(self) -> None:
        if self.issuer is not None:
            await self.issuer.aclose()


def _alternatives(names: Sequence[str]) -> list[SecurityRequirement]:
    return [SecurityRequirement(schemes={name: StringList()}) for name in names]
