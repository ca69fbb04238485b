"""How a server's agent card is served (protocol versions, signature) and
how the orchestrator checks the signature of a card it reads.

Protocol: by default a card lists each endpoint for A2A 1.0 and 0.3, and
a2a-sdk then adds the v0.3 top-level fields (`url`, `protocolVersion`,
`preferredTransport`, `additionalInterfaces`) that v0.3 clients need to
read it. A v1.0 AgentCard has no such fields, so a strict v1.0 validator
(the TCK's CARD-STRUCT-001) refuses that card; `protocol="1.0"` lists the
1.0 endpoints only, which makes a card without them.

gRPC: a server that serves it lists it first in its card (`grpc_card`
`main`), or, with `separate`, only in a second card at `GRPC_CARD_PATH`
(the first card plus the gRPC interfaces). Google ADK's `RemoteA2aAgent`
(2.13, on a2a-sdk 1.3 and 0.3) refuses a card any of whose endpoints is off
the origin the card was fetched from, and a gRPC port is one: a 1.3 client
reads `supportedInterfaces`, a 0.3 one `url` and `additionalInterfaces`,
so gRPC cannot hide in either. The well-known card of `separate` is one
ADK takes; a gRPC client is pointed at the second (an agent file's
`card_path`).

Signature: a JWS over the card's canonical JSON (RFC 8785) with a
detached payload, made with the operator's private key (PEM: RSA, EC
P-256/384/521 or Ed25519). It covers the card exactly as served, minus
`signatures`, which is what the spec tells a verifier to canonicalize.
In the default mode that JSON carries the v0.3 fields, which a2a-sdk 1.3's
verifier leaves out of what it checks (it canonicalizes the v1.0 view), so
such a card carries a second signature over that view (a2a-sdk's
`create_agent_card_signer`); a verifier needs one that holds. Its key id is the operator's, else the
key's RFC 7638 thumbprint, which a JWKS publishing the public key can use
as its `kid`.

The orchestrator checks it with a2a-sdk's verifier against the key the
agent file names (`card_key`: a PEM public key or a JWKS, a file or an
https URL). The card's own `jku` header is never followed: a key the card
points at proves nothing about who signed it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import AgentCard, AgentCardSignature

# a2a-sdk's RFC 8785 canonicalizer, the one its own signer uses; the module
# is private, but the bytes it makes are the standard's.
from a2a.utils._jcs import canonicalize
from a2a.utils.signing import (
    ProtectedHeader,
    SignatureVerificationError,
    create_agent_card_signer,
    create_signature_verifier,
)
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt import PyJWKSet, api_jws
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from jwt.exceptions import PyJWKError, PyJWKSetError

from ..errors import ConfigError, UntrustedCardError
from .versions import GRPC_CARD_PATH, GRPC_CARDS, PROTOCOLS

__all__ = [
    "CARD_KEY_ENV",
    "CARD_KEY_ID_ENV",
    "GRPC_CARDS",
    "GRPC_CARD_ENV",
    "GRPC_CARD_PATH",
    "PROTOCOLS",
    "PROTOCOL_ENV",
    "CardOptions",
    "card_signer",
    "verify_card",
]

PROTOCOL_ENV = "A2A_PROTOCOL"
CARD_KEY_ENV = "A2A_CARD_KEY"
"""A PEM private key (the key itself, or the path of a file holding it)."""
CARD_KEY_ID_ENV = "A2A_CARD_KEY_ID"
GRPC_CARD_ENV = "A2A_GRPC_CARD"

# Asymmetric algorithms only: a verifier accepting HS256 could be fooled by
# a "signature" keyed with the public key itself.
_ALGORITHMS = [
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
]
_EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}

Signer = Callable[[AgentCard], AgentCard]


@dataclass(frozen=True)
class CardOptions:
    """What a server's card carries beyond its role: the protocol versions
    it lists, with `signer` a signature, and which card lists gRPC
    (`grpc_card`: `versions.GRPC_CARDS`)."""

    protocol: str = "both"
    signer: Signer | None = None
    grpc_card: str = "main"

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol {self.protocol!r}: one of {', '.join(PROTOCOLS)}")
        if self.grpc_card not in GRPC_CARDS:
            raise ConfigError(f"gRPC card {self.grpc_card!r}: one of {', '.join(GRPC_CARDS)}")

    @property
    def legacy(self) -> bool:
        """Whether the card also lists the A2A 0.3 endpoints."""
        return self.protocol == "both"

    def finish(self, card: AgentCard) -> AgentCard:
        """The card as served: signed when there is a key."""
        return self.signer(card) if self.signer is not None else card

    def served(
        self, card: AgentCard, list_grpc: Callable[[AgentCard], None] | None = None
    ) -> tuple[AgentCard, dict[str, AgentCard]]:
        """The card to serve at the well-known path and the others to serve,
        by path, each finished (signed). `list_grpc` adds a server's gRPC
        interfaces to a card (None: the server has none): to `card` itself,
        or with `grpc_card="separate"` to a copy served at `GRPC_CARD_PATH`."""
        others: dict[str, AgentCard] = {}
        if list_grpc is not None:
            if self.grpc_card == "separate":
                with_grpc = AgentCard()
                with_grpc.CopyFrom(card)
                list_grpc(with_grpc)
                others[GRPC_CARD_PATH] = self.finish(with_grpc)
            else:
                list_grpc(card)
        return self.finish(card), others

    @classmethod
    def from_settings(
        cls,
        *,
        protocol: str | None = None,
        key_path: Path | None = None,
        key_id: str | None = None,
        grpc_card: str | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> CardOptions:
        """From the command line, else `A2A_PROTOCOL`, `A2A_CARD_KEY`,
        `A2A_CARD_KEY_ID`, `A2A_GRPC_CARD` (an empty variable counts as unset)."""
        protocol = protocol or environ.get(PROTOCOL_ENV) or "both"
        key_id = key_id or environ.get(CARD_KEY_ID_ENV) or None
        grpc_card = grpc_card or environ.get(GRPC_CARD_ENV) or "main"
        if key_path is not None:
            pem = _read_key_file(key_path, str(key_path))
        else:
            value = environ.get(CARD_KEY_ENV, "").strip()
            if not value:
                return cls(protocol=protocol, grpc_card=grpc_card)
            pem = (
                value.encode()
                if value.startswith("-----BEGIN")
                else _read_key_file(Path(value), f"{CARD_KEY_ENV} ({value})")
            )
        return cls(protocol=protocol, signer=card_signer(pem, key_id=key_id), grpc_card=grpc_card)


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        return path.expanduser().read_bytes()
    except OSError as exc:
        raise ConfigError(f"card key {what}: cannot read: {exc.strerror or exc}") from exc


def card_signer(pem: bytes, *, key_id: str | None = None) -> Signer:
    """A signer for cards with the PEM private key `pem`; the algorithm
    follows the key, the key id is `key_id` or the key's thumbprint."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        # The message never quotes the key.
        raise ConfigError(
            "card key: not an unencrypted PEM private key (RSA, EC or Ed25519)"
        ) from exc
    if isinstance(key, rsa.RSAPrivateKey):
        algorithm = "RS256"
    elif isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name in _EC_ALGORITHMS:
        algorithm = _EC_ALGORITHMS[key.curve.name]
    elif isinstance(key, ed25519.Ed25519PrivateKey):
        algorithm = "EdDSA"
    else:
        raise ConfigError("card key: use an RSA, EC (P-256, P-384, P-521) or Ed25519 key")
    header: ProtectedHeader = {
        "kid": key_id or thumbprint(key.public_key()),
        "alg": algorithm,
        "jku": None,
        "typ": "JOSE",
    }
    # PyJWT would write `"jku": null` into the protected header.
    protected = {k: v for k, v in header.items() if v is not None}
    sign_v1_0_view = create_agent_card_signer(key, protected)  # type: ignore[arg-type]

    def public_key(kid: str | None, jku: str | None) -> Any:
        return key.public_key()

    sdk_verifies = create_signature_verifier(public_key, [algorithm])

    def sign(card: AgentCard) -> AgentCard:
        served = agent_card_to_dict(card)  # the JSON a2a-sdk's card route sends
        served.pop("signatures", None)
        jws = api_jws.encode(
            canonicalize(served).encode(), key, algorithm=algorithm, headers=protected
        )
        encoded_header, _, signature = jws.split(".")  # detached: no payload
        card.signatures.append(AgentCardSignature(protected=encoded_header, signature=signature))
        try:
            sdk_verifies(card)
        except SignatureVerificationError:
            # The served JSON is not the v1.0 view (the default mode's v0.3
            # fields): sign that view too, for a2a-sdk 1.3's verifier.
            card = sign_v1_0_view(card)
        return card

    return sign


def public_jwk(public_key: Any) -> dict[str, Any]:
    """The JWK of a public key (RSA, EC or Ed25519)."""
    if isinstance(public_key, rsa.RSAPublicKey):
        return RSAAlgorithm.to_jwk(public_key, as_dict=True)
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        return ECAlgorithm.to_jwk(public_key, as_dict=True)
    return OKPAlgorithm.to_jwk(public_key, as_dict=True)


def thumbprint(public_key: Any) -> str:
    """The RFC 7638 SHA-256 thumbprint of a public key, base64url."""
    jwk = public_jwk(public_key)
    required = {
        "RSA": ("e", "kty", "n"),
        "EC": ("crv", "kty", "x", "y"),
        "OKP": ("crv", "kty", "x"),
    }[jwk["kty"]]
    canonical = json.dumps({k: jwk[k] for k in required}, separators=(",", ":"), sort_keys=True)
    digest = hashlib.sha256(canonical.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


# -- the orchestrator's side --------------------------------------------------


async def verify_card(
    card: AgentCard,
    *,
    agent: str,
    key_source: str | None,
    required: bool,
    http: httpx.AsyncClient,
) -> None:
    """Check `card`'s signature for agent `agent`: a card carrying one is
    checked against `key_source` (a PEM public key or JWKS; a path or an
    https URL); `required`: a card without one is refused too. Raises
    `UntrustedCardError` naming the agent."""
    if key_source is None:
        return
    if not card.signatures:
        if required:
            raise UntrustedCardError(
                f"agent {agent!r}: its agent card is not signed, and the network "
                "requires a signed card (require_signature)"
            )
        return
    keys = await _load_keys(key_source, agent, http)

    def key_for(kid: str | None, jku: str | None) -> Any:
        if isinstance(keys, PyJWKSet):
            for jwk in keys.keys:
                if kid is None or jwk.key_id == kid:
                    return jwk
            # The verifier treats a key error as one bad signature and
            # tries the next; none left is "no valid signature".
            raise PyJWKError(f"no key with id {kid!r}")
        return keys

    try:
        create_signature_verifier(key_for, _ALGORITHMS)(card)
    except SignatureVerificationError as exc:
        raise UntrustedCardError(
            f"agent {agent!r}: its agent card's signature does not verify with {key_source} ({exc})"
        ) from exc


async def _load_keys(source: str, agent: str, http: httpx.AsyncClient) -> PyJWKSet | Any:
    """The verification key(s) at `source`: a JWKS (or single JWK) as a key
    set, a PEM public key as a key object."""
    if source.startswith(("https://", "http://")):
        try:
            response = await http.get(source)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise UntrustedCardError(
                f"agent {agent!r}: its card key cannot be fetched from {source}: {exc}"
            ) from exc
        data = response.content
    else:
        try:
            data = await anyio.Path(source).read_bytes()
        except OSError as exc:
            raise UntrustedCardError(
                f"agent {agent!r}: its card key {source} cannot be read: {exc.strerror or exc}"
            ) from exc
    if data.lstrip().startswith(b"-----BEGIN"):
        try:
            return serialization.load_pem_public_key(data)
        except (ValueError, TypeError) as exc:
            raise UntrustedCardError(
                f"agent {agent!r}: its card key {source} is not a PEM public key"
            ) from exc
    try:
        parsed = json.loads(data)
        if isinstance(parsed, dict) and "keys" not in parsed:
            return PyJWKSet([parsed])  # one JWK
        return PyJWKSet.from_dict(parsed)
    except (ValueError, TypeError, KeyError, PyJWKError, PyJWKSetError) as exc:
        raise UntrustedCardError(
            f"agent {agent!r}: its card key {source} is neither a PEM public key nor a JWKS"
        ) from exc
