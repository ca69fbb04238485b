"""Agent cards: the 1.0-only card (`--protocol 1.0`) and signed cards, with
real role servers on 127.0.0.1 and the orchestrator's real client."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx
import jwt
import pytest
from a2a.types import AgentCard
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from google.protobuf.json_format import ParseDict, ParseError
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from support.servers import role_server

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network, load_agent_file
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.errors import ConfigError, UntrustedCardError
from a2a_orchestrator.protocol.cards import (
    GRPC_CARD_PATH,
    CardOptions,
    card_signer,
    public_jwk,
    thumbprint,
    verify_card,
)
from a2a_orchestrator.runtime.events import Done
from a2a_orchestrator.server.serving import bind_socket, serve
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

CARD_PATH = "/.well-known/agent-card.json"
V0_3_FIELDS = ("url", "protocolVersion", "preferredTransport", "additionalInterfaces")
# Required by the A2A v1.0 AgentCard schema (a2a.proto, `REQUIRED` fields).
V1_0_REQUIRED = (
    "name",
    "description",
    "supportedInterfaces",
    "version",
    "capabilities",
    "defaultInputModes",
    "defaultOutputModes",
    "skills",
)
CLI = [sys.executable, "-m", "a2a_orchestrator.cli"]


async def fetch_card(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(url + CARD_PATH)
    response.raise_for_status()
    card = response.json()
    assert isinstance(card, dict)
    return card


def strict_v1_0(card: dict[str, Any]) -> AgentCard:
    """Parse as an A2A v1.0 AgentCard with no unknown field allowed."""
    parsed = ParseDict(card, AgentCard(), ignore_unknown_fields=False)
    assert not [field for field in V1_0_REQUIRED if field not in card]
    return parsed


async def delegate_once(tmp_path: Path, spec: AgentSpec) -> Any:
    async with Session(
        Store(tmp_path / "o.db"), workdir=tmp_path, network=Network.of(spec)
    ) as session:
        try:
            child = await session.spawn(ChildConfig(role=spec.name, prompt="x"))
        except UntrustedCardError as exc:
            return exc  # raised here, inside the session's task group
        return await child.result()


async def test_protocol_1_0_serves_a_v1_0_only_card(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with role_server(tmp_path / "a", lambda m: {"text": "both"}) as both:
            default = await fetch_card(both.url)
        async with role_server(
            tmp_path / "b", lambda m: {"text": "pure"}, card_options=CardOptions(protocol="1.0")
        ) as pure:
            card = await fetch_card(pure.url)
            # The orchestrator's client reads it and delegates through it.
            result = await delegate_once(
                tmp_path, AgentSpec(name="pure", role="coder", url=pure.url)
            )
    # The default keeps v0.3 peers working, and is not a strict v1.0 card.
    assert all(field in default for field in V0_3_FIELDS)
    with pytest.raises(ParseError):
        strict_v1_0(default)
    assert not [field for field in V0_3_FIELDS if field in card]
    parsed = strict_v1_0(card)
    assert {i.protocol_version for i in parsed.supported_interfaces} == {"1.0"}
    assert {i.protocol_binding for i in parsed.supported_interfaces} == {"JSONRPC", "HTTP+JSON"}
    assert isinstance(result, Done) and result.text == "pure"


def test_unknown_protocol_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"protocol '0\.2'"):
        CardOptions(protocol="0.2")


# -- signed cards --------------------------------------------------------------


def pem_private(key: Any) -> bytes:
    return key.private_bytes(  # type: ignore[no-any-return]
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def pem_public(key: Any) -> bytes:
    return key.public_key().public_bytes(  # type: ignore[no-any-return]
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """The operator's key pair (EC P-256) and an unrelated one, as files."""
    good, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    paths = {
        "private": tmp_path / "card.pem",
        "public": tmp_path / "card.pub.pem",
        "jwks": tmp_path / "jwks.json",
        "other": tmp_path / "other.pub.pem",
    }
    paths["private"].write_bytes(pem_private(good))
    paths["public"].write_bytes(pem_public(good))
    jwk = {**public_jwk(good.public_key()), "kid": thumbprint(good.public_key())}
    paths["jwks"].write_text(json.dumps({"keys": [jwk]}))
    paths["other"].write_bytes(pem_public(other))
    return paths


def signed(key: Path, *, protocol: str = "both") -> CardOptions:
    return CardOptions.from_settings(protocol=protocol, key_path=key, environ={})


@asynccontextmanager
async def jwks_server(document: dict[str, Any]) -> AsyncIterator[str]:
    """A JWKS served over HTTP on 127.0.0.1, as an identity provider would."""

    async def jwks(request: Any) -> JSONResponse:
        return JSONResponse(document)

    app = Starlette(routes=[Route("/jwks.json", jwks)])
    sock = bind_socket("127.0.0.1", 0)
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve, app, sock)
        yield f"http://127.0.0.1:{port}/jwks.json"
        tg.cancel_scope.cancel()


async def test_a_signed_card_is_accepted_with_its_key(
    tmp_path: Path, keys: dict[str, Path]
) -> None:
    jwks = json.loads(keys["jwks"].read_text())
    with anyio.fail_after(40):
        async with (
            role_server(
                tmp_path / "s", lambda m: {"text": "signed"}, card_options=signed(keys["private"])
            ) as server,
            jwks_server(jwks) as jwks_url,
        ):
            card = await fetch_card(server.url)
            results = [
                await delegate_once(
                    tmp_path / str(n),
                    AgentSpec(
                        name="signer",
                        role="coder",
                        url=server.url,
                        card_key=source,
                        require_signature=True,
                    ),
                )
                for n, source in enumerate((str(keys["public"]), str(keys["jwks"]), jwks_url))
            ]
    # One signature over the card as served (v0.3 fields included), one over
    # the v1.0 view a2a-sdk 1.3 checks; our client accepted it above.
    assert "url" in card
    assert len(card["signatures"]) == 2
    spec_verify(card, serialization.load_pem_public_key(keys["public"].read_bytes()))
    assert all(isinstance(r, Done) and r.text == "signed" for r in results), results


def tampering(inner: Callable[[AgentCard], AgentCard]) -> Callable[[AgentCard], AgentCard]:
    """Signs, then changes the card: what a proxy rewriting the card does."""

    def sign_then_change(card: AgentCard) -> AgentCard:
        card = inner(card)
        card.description = "I am not who signed this"
        return card

    return sign_then_change


async def test_bad_or_missing_signatures_are_refused_naming_the_agent(
    tmp_path: Path, keys: dict[str, Path]
) -> None:
    good = signed(keys["private"])
    assert good.signer is not None
    tampered = CardOptions(signer=tampering(good.signer))
    with anyio.fail_after(40):
        async with (
            role_server(tmp_path / "t", lambda m: {"text": "x"}, card_options=tampered) as forged,
            role_server(tmp_path / "s", lambda m: {"text": "x"}, card_options=good) as real,
            role_server(tmp_path / "u", lambda m: {"text": "unsigned ok"}) as unsigned,
        ):
            refusals = {}
            for name, url, key in (
                ("forged", forged.url, keys["public"]),
                ("wrongkey", real.url, keys["other"]),
                ("unsigned", unsigned.url, keys["public"]),
            ):
                spec = AgentSpec(
                    name=name, role="coder", url=url, card_key=str(key), require_signature=True
                )
                refused = await delegate_once(tmp_path / name, spec)
                assert isinstance(refused, UntrustedCardError), refused
                refusals[name] = str(refused)
            # With the key but no requirement, an unsigned card passes ...
            lenient = await delegate_once(
                tmp_path / "lenient",
                AgentSpec(
                    name="lenient", role="coder", url=unsigned.url, card_key=str(keys["public"])
                ),
            )
            # ... and a signed one must still verify.
            lenient_forged = await delegate_once(
                tmp_path / "lenient-forged",
                AgentSpec(
                    name="lenient-forged",
                    role="coder",
                    url=forged.url,
                    card_key=str(keys["public"]),
                ),
            )
    assert isinstance(lenient_forged, UntrustedCardError)
    assert "agent 'lenient-forged'" in str(lenient_forged)
    for name in ("forged", "wrongkey"):
        assert f"agent {name!r}" in refusals[name]
        assert "signature does not verify" in refusals[name]
    assert "agent 'unsigned'" in refusals["unsigned"] and "not signed" in refusals["unsigned"]
    assert isinstance(lenient, Done) and lenient.text == "unsigned ok"


@pytest.mark.parametrize(
    "make_key",
    [
        lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
        lambda: ec.generate_private_key(ec.SECP384R1()),
        lambda: ed25519.Ed25519PrivateKey.generate(),
    ],
    ids=["rsa", "p384", "ed25519"],
)
async def test_each_key_type_signs_and_verifies(
    tmp_path: Path, make_key: Callable[[], Any]
) -> None:
    key = make_key()
    (tmp_path / "pub.pem").write_bytes(pem_public(key))
    card = card_signer(pem_private(key), key_id="k1")(AgentCard(name="a", description="b"))
    async with httpx.AsyncClient() as http:
        await verify_card(
            card, agent="a", key_source=str(tmp_path / "pub.pem"), required=True, http=http
        )


def test_agent_file_card_key_fields(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    good = tmp_path / "coder.toml"
    good.write_text(
        'role = "coder"\nurl = "http://127.0.0.1:9"\n'
        'card_key = "keys/coder.pub.pem"\nrequire_signature = true\n'
    )
    spec = load_agent_file(good, environ={})
    assert spec.card_key == str(tmp_path / "keys" / "coder.pub.pem")
    assert spec.require_signature is True
    bare = tmp_path / "bare.toml"
    bare.write_text('role = "coder"\nrequire_signature = true\n')
    with pytest.raises(ConfigError, match=r"require_signature.*card_key"):
        load_agent_file(bare, environ={})
    typo = tmp_path / "typo.toml"
    typo.write_text('role = "coder"\ncard_key = "k.pem"\nrequire_signature = "yes"\n')
    with pytest.raises(ConfigError, match="require_signature"):
        load_agent_file(typo, environ={})


def test_a_bad_card_key_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "k.pem").write_text("not a key")
    with pytest.raises(ConfigError, match="not an unencrypted PEM private key"):
        CardOptions.from_settings(key_path=tmp_path / "k.pem", environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        CardOptions.from_settings(environ={"A2A_CARD_KEY": str(tmp_path / "missing.pem")})


# -- a verifier written from the spec ------------------------------------------


def jcs(value: Any) -> str:
    """RFC 8785 canonical JSON, written here from the RFC rather than taken
    from a2a-sdk so the check is independent of the signer. Covers what a
    card holds: strings, integers, booleans, null, arrays, objects."""
    if isinstance(value, dict):
        # Keys sorted by their UTF-16 code units (RFC 8785 3.2.3).
        items = sorted(value.items(), key=lambda kv: kv[0].encode("utf-16-be"))
        return "{" + ",".join(f"{jcs(k)}:{jcs(v)}" for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(jcs(v) for v in value) + "]"
    if isinstance(value, float):
        assert value.is_integer(), f"a non-integral number in a card: {value}"
        return str(int(value))
    # Strings: JSON escapes only where required, non-ASCII as itself.
    return json.dumps(value, ensure_ascii=False)


def spec_verify(card: dict[str, Any], public_key: Any) -> None:
    """The A2A spec's check (8.4): canonicalize the card received minus
    `signatures`, and verify a JWS with that as its detached payload; one
    signature that holds is enough."""
    payload = base64.urlsafe_b64encode(
        jcs({k: v for k, v in card.items() if k != "signatures"}).encode()
    ).rstrip(b"=")
    failures = []
    for signature in card["signatures"]:
        token = f"{signature['protected']}.{payload.decode()}.{signature['signature']}"
        try:
            jwt.api_jws.decode_complete(token, public_key, algorithms=["ES256"])
            return
        except jwt.PyJWTError as exc:
            failures.append(exc)
    raise AssertionError(f"no signature covers the card as served: {failures}")


# -- the command line ------------------------------------------------------------


def served_card(tmp_path: Path, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The card `serve ...` serves, from a real subprocess stopped by SIGTERM."""
    process = subprocess.Popen(
        [*CLI, "serve", *args, "--port", "0", "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "A2A_MODEL_BASE_URL": "", "OPENAI_BASE_URL": "", **env},
        cwd=tmp_path,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert "serving A2A at " in first, first + (process.stderr.read() if process.stderr else "")
        url = first.split("serving A2A at ")[1].strip()
        card = httpx.get(url + CARD_PATH, timeout=10).json()
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
    assert isinstance(card, dict)
    return card


@pytest.mark.parametrize("protocol", [[], ["--protocol", "1.0"]], ids=["default", "1.0"])
def test_a_served_signed_card_verifies_as_the_spec_says(
    tmp_path: Path, keys: dict[str, Path], protocol: list[str]
) -> None:
    (tmp_path / "w").mkdir()  # the key stays outside the work directory
    card = served_card(tmp_path / "w", ["coder", *protocol, "--card-key", str(keys["private"])], {})
    # The default mode serves the v0.3 fields, so a2a-sdk 1.3's view differs
    # and needs its own signature; a 1.0 card is that view.
    assert ("url" in card) is not protocol
    assert len(card["signatures"]) == (1 if protocol else 2)
    spec_verify(card, serialization.load_pem_public_key(keys["public"].read_bytes()))


@pytest.mark.parametrize("protocol", ["both", "1.0"])
async def test_with_grpc_in_a_separate_card_both_cards_are_signed_as_served(
    tmp_path: Path, keys: dict[str, Path], protocol: str
) -> None:
    options = CardOptions.from_settings(
        protocol=protocol, key_path=keys["private"], grpc_card="separate", environ={}
    )
    spec = AgentSpec(
        name="signer",
        role="coder",
        card_path=GRPC_CARD_PATH,
        card_key=str(keys["jwks"]),
        require_signature=True,
    )
    with anyio.fail_after(40):
        async with role_server(
            tmp_path / "s", lambda m: {"text": "signed"}, card_options=options, grpc_port=0
        ) as server:
            main = await fetch_card(server.url)
            async with httpx.AsyncClient(timeout=10) as http:
                with_grpc = (await http.get(server.url + GRPC_CARD_PATH)).json()
            # Our client reads the second card, checks its signature with
            # a2a-sdk's verifier, and delegates through it.
            result = await delegate_once(tmp_path, replace(spec, url=server.url))
    public = serialization.load_pem_public_key(keys["public"].read_bytes())
    for card in (main, with_grpc):
        spec_verify(card, public)
    assert with_grpc["supportedInterfaces"][0]["url"] == server.grpc_address
    assert isinstance(result, Done) and result.text == "signed"


async def test_serve_protocol_and_card_key_from_flags_and_environment(
    tmp_path: Path, keys: dict[str, Path]
) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "o").mkdir()
    role = served_card(
        tmp_path / "r", ["coder", "--protocol", "1.0", "--card-key", str(keys["private"])], {}
    )
    # The orchestrator (and compose) take both from the environment; the
    # key as PEM text, as a secret store hands it over.
    orchestrator = served_card(
        tmp_path / "o",
        ["orchestrator"],
        {"A2A_PROTOCOL": "1.0", "A2A_CARD_KEY": keys["private"].read_text()},
    )
    async with httpx.AsyncClient() as http:
        for card in (role, orchestrator):
            assert not [field for field in V0_3_FIELDS if field in card]
            await verify_card(
                strict_v1_0(card),
                agent=card["name"],
                key_source=str(keys["jwks"]),
                required=True,
                http=http,
            )
