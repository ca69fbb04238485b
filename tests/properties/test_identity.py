"""Callers are identities: tokens per caller, OAuth2 JWTs, task ownership, quotas.

Everything runs against real servers on 127.0.0.1: role servers (uvicorn,
SQLite), an orchestrator, and a test identity provider (discovery, JWKS and
a client-credentials token endpoint) served from this file. Only the model
is scripted.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import anyio
import httpx
import jwt
import pytest
from a2a.types import SubscribeToTaskRequest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from support.servers import a2a_client

from a2a_orchestrator.cli.commands.serve import access_of
from a2a_orchestrator.cli.parser import build_parser
from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.errors import ConfigError
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.app import MODE_KEY, run_orchestrator_server
from a2a_orchestrator.protocol.wire import BATCH_KIND, CONTROL_KEY, EVENT_KEY
from a2a_orchestrator.runtime.events import Done, Failed, InputRequired
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import RunningServer, run_role_server
from a2a_orchestrator.server.auth.access import Access
from a2a_orchestrator.server.auth.callers import (
    CallerFile,
    add_caller,
    hash_token,
    new_token,
    token_matches,
)
from a2a_orchestrator.server.auth.issuer import Issuer
from a2a_orchestrator.server.auth.usage import UsageLog, today
from a2a_orchestrator.server.serving import bind_socket, serve
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

AUDIENCE = "coder-api"
USAGE = {"input_tokens": 20, "output_tokens": 5}


def script(messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A message saying "slow" keeps its task working for a minute; others end at once."""
    last = next(m for m in reversed(messages) if m["role"] == "user")
    if "slow" in str(last["content"]):
        return {"text": "still working", "delay": 60}
    if "ask" in str(last["content"]):
        # The turn ends waiting for its caller's answer: input required.
        question = {"name": "ask_parent", "arguments": {"question": "which one?"}}
        return {"tool_calls": [question], "usage": USAGE}
    return {"text": "ok", "usage": USAGE}


@contextlib.asynccontextmanager
async def role_server(
    workdir: Path, *, access: Access | None, db: Path | None = None
) -> AsyncIterator[RunningServer]:
    async with run_role_server(
        find_role("coder"),
        ScriptedModel(script),
        workdir,
        db=str(db or workdir / "tasks.db"),
        access=access,
    ) as server:
        yield server


def callers_file(path: Path, *names: str, extra: str = "") -> dict[str, str]:
    """A callers file with a token for each name, and `extra` TOML after them."""
    tokens = {name: add_caller(path, name) for name in names}
    if extra:
        path.write_text(path.read_text() + "\n" + extra)
    return tokens


def message(text: str, **ids: str) -> dict[str, Any]:
    """A v1.0 message in JSON (`taskId`, `contextId` and `metadata` as given)."""
    return {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": text}], **ids}


def message_v03(text: str, **ids: str) -> dict[str, Any]:
    return {
        "kind": "message",
        "messageId": uuid.uuid4().hex,
        "role": "user",
        "parts": [{"kind": "text", "text": text}],
        **ids,
    }


@dataclass
class Peer:
    """Raw HTTP as one caller: JSON-RPC (v1.0 and v0.3 names) and REST."""

    http: httpx.AsyncClient
    token: str

    def headers(self, *, v03: bool = False) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"}
        if not v03:
            headers["A2A-Version"] = "1.0"
        return headers

    async def rpc(self, method: str, params: dict[str, Any], *, v03: bool = False) -> Any:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        response = await self.http.post("/", json=body, headers=self.headers(v03=v03))
        assert response.status_code == 200, (method, response.text)
        if response.headers["content-type"].startswith("text/event-stream"):
            # The v0.3 layer answers a stream's error as its one event.
            return json.loads(response.text.partition("data: ")[2].strip())
        return response.json()

    async def rest(
        self, method: str, path: str, body: Any = None, *, v03: bool = False
    ) -> httpx.Response:
        return await self.http.request(method, path, json=body, headers=self.headers(v03=v03))

    async def stream(self, path: str, *, v03: bool = False) -> tuple[int, bytes, str]:
        """An SSE GET's status, the bytes it sent, and how it ended."""
        async with self.http.stream("GET", path, headers=self.headers(v03=v03)) as response:
            received, ending = b"", "complete"
            try:
                async for chunk in response.aiter_bytes():
                    received += chunk
            except httpx.RemoteProtocolError:
                ending = "cut"
            return response.status_code, received, ending


def same_answer(theirs: Any, none: Any, task_id: str, missing: str) -> bool:
    """Whether two answers are the same once the ids asked about are set aside."""
    return json.dumps(theirs).replace(task_id, "ID") == json.dumps(none).replace(missing, "ID")


async def start_slow(caller: Peer, **ids: str) -> dict[str, Any]:
    """Start a task that stays working; return it as the server answered."""
    answer = await caller.rpc(
        "SendMessage",
        {"message": message("slow job", **ids), "configuration": {"returnImmediately": True}},
    )
    assert "result" in answer, answer
    return answer["result"]["task"]


async def test_two_callers_cannot_see_or_touch_each_others_tasks(tmp_path: Path) -> None:
    tokens = callers_file(tmp_path / "callers.toml", "alice", "bob")
    access = Access(callers=CallerFile(tmp_path / "callers.toml"))
    with anyio.fail_after(45):
        async with (
            role_server(tmp_path, access=access) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            alice, bob = Peer(http, tokens["alice"]), Peer(http, tokens["bob"])
            task = await start_slow(alice)
            task_id, context_id = task["id"], task["contextId"]
            missing = uuid.uuid4().hex
            by_id: list[tuple[str, Callable[[str], Any]]] = [
                ("GetTask", lambda i: bob.rpc("GetTask", {"id": i})),
                ("CancelTask", lambda i: bob.rpc("CancelTask", {"id": i})),
                ("SubscribeToTask", lambda i: bob.rpc("SubscribeToTask", {"id": i})),
                (
                    "SendMessage (continue)",
                    lambda i: bob.rpc("SendMessage", {"message": message("more", taskId=i)}),
                ),
                (
                    "SendStreamingMessage (continue)",
                    lambda i: bob.rpc(
                        "SendStreamingMessage", {"message": message("more", taskId=i)}
                    ),
                ),
                (
                    "control extension: pause",
                    lambda i: bob.rpc(
                        "SendMessage",
                        {"message": message("", taskId=i, metadata={CONTROL_KEY: "pause"})},
                    ),
                ),
                (
                    "control extension: steer",
                    lambda i: bob.rpc(
                        "SendMessage",
                        {"message": message("turn", taskId=i, metadata={CONTROL_KEY: "steer"})},
                    ),
                ),
                ("v0.3 tasks/get", lambda i: bob.rpc("tasks/get", {"id": i}, v03=True)),
                ("v0.3 tasks/cancel", lambda i: bob.rpc("tasks/cancel", {"id": i}, v03=True)),
                (
                    "v0.3 tasks/resubscribe",
                    lambda i: bob.rpc("tasks/resubscribe", {"id": i}, v03=True),
                ),
                (
                    "v0.3 message/send (continue)",
                    lambda i: bob.rpc(
                        "message/send", {"message": message_v03("more", taskId=i)}, v03=True
                    ),
                ),
            ]
            for name, ask in by_id:
                theirs, none = await ask(task_id), await ask(missing)
                assert theirs["error"]["code"] == -32001, (name, theirs)
                assert same_answer(theirs, none, task_id, missing), (name, theirs, none)

            rest: list[tuple[str, Callable[[str], Any]]] = [
                ("GET task", lambda i: bob.rest("GET", f"/rest/tasks/{i}")),
                ("cancel", lambda i: bob.rest("POST", f"/rest/tasks/{i}:cancel")),
                ("subscribe (SSE)", lambda i: bob.rest("GET", f"/rest/tasks/{i}:subscribe")),
                (
                    "continue",
                    lambda i: bob.rest(
                        "POST", "/rest/message:send", {"message": message("x", taskId=i)}
                    ),
                ),
                ("v0.3 GET task", lambda i: bob.rest("GET", f"/rest/v1/tasks/{i}", v03=True)),
                (
                    "v0.3 cancel",
                    lambda i: bob.rest("POST", f"/rest/v1/tasks/{i}:cancel", v03=True),
                ),
            ]
            for name, ask in rest:
                theirs, none = await ask(task_id), await ask(missing)
                assert theirs.status_code == 404, (name, theirs.status_code, theirs.text)
                assert same_answer(theirs.json(), none.json(), task_id, missing), name
            # a2a-sdk 1.3's v0.3 REST subscribe opens its stream before it
            # looks the task up, then cuts it for any task it cannot find:
            # Alice's task and no task at all end the same way for Bob.
            v03_subscribe = [
                await bob.stream(f"/rest/v1/tasks/{i}:subscribe", v03=True)
                for i in (task_id, missing)
            ]

            bob_rpc_list = await bob.rpc("ListTasks", {})
            bob_rest_list = (await bob.rest("GET", "/rest/tasks")).json()
            # Bob cannot open a task in Alice's context either (it would
            # continue her conversation).
            foreign_context = await bob.rpc(
                "SendMessage", {"message": message("hello", contextId=context_id)}
            )
            # Nothing Bob did reached the task: it still works, for Alice only.
            alice_list = await alice.rpc("ListTasks", {})
            still = await alice.rpc("GetTask", {"id": task_id})
            async with a2a_client(server.url, token=tokens["alice"]) as client:
                subscription = client.subscribe(SubscribeToTaskRequest(id=task_id))
                first = await anext(subscription)
                await subscription.aclose()  # type: ignore[attr-defined]
            paused = await alice.rpc(
                "SendMessage",
                {"message": message("", taskId=task_id, metadata={CONTROL_KEY: "pause"})},
            )
            canceled = await alice.rest("POST", f"/rest/tasks/{task_id}:cancel")

    assert v03_subscribe[0] == v03_subscribe[1]
    assert task_id.encode() not in v03_subscribe[0][1]
    assert bob_rpc_list["result"].get("tasks", []) == []
    assert bob_rest_list.get("tasks", []) == []
    assert foreign_context["error"]["code"] == -32602
    assert "cannot be used by this caller" in foreign_context["error"]["message"]
    assert [t["id"] for t in alice_list["result"]["tasks"]] == [task_id]
    assert still["result"]["status"]["state"] == "TASK_STATE_WORKING"
    assert first.task.id == task_id
    assert paused["result"]["task"]["id"] == task_id
    assert canceled.status_code == 200
    assert canceled.json()["status"]["state"] == "TASK_STATE_CANCELED"


# -- OAuth2 JWTs ----------------------------------------------------------------------


@dataclass
class IdentityProvider:
    """A test OAuth2 / OpenID Connect provider on 127.0.0.1."""

    url: str = ""
    keys: dict[str, ec.EllipticCurvePrivateKey] = field(default_factory=dict)
    """Published signing keys by key id."""
    clients: dict[str, str] = field(default_factory=dict)
    """Client id -> secret, for the client credentials grant."""
    lifetime: int = 300
    jwks_fetches: int = 0
    tokens_issued: int = 0
    issued_at: float = 0.0
    """When the last token was issued (monotonic clock, the event loop's)."""

    def sign(
        self,
        *,
        kid: str = "k1",
        key: ec.EllipticCurvePrivateKey | None = None,
        sub: str = "svc-reports",
        **claims: Any,
    ) -> str:
        now = int(time.time())
        payload = {"iss": self.url, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 300}
        payload.update(claims)
        return jwt.encode(payload, key or self.keys[kid], algorithm="ES256", headers={"kid": kid})

    def jwks(self) -> dict[str, Any]:
        keys = []
        for kid, key in self.keys.items():
            jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
            keys.append({**jwk, "kid": kid, "use": "sig", "alg": "ES256"})
        return {"keys": keys}

    def app(self) -> Starlette:
        async def discovery(request: Request) -> JSONResponse:
            return JSONResponse(
                {
                    "issuer": self.url,
                    "jwks_uri": f"{self.url}/jwks",
                    "token_endpoint": f"{self.url}/token",
                }
            )

        async def jwks(request: Request) -> JSONResponse:
            self.jwks_fetches += 1
            return JSONResponse(self.jwks())

        async def token(request: Request) -> JSONResponse:
            scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
            client_id, _, secret = base64.b64decode(encoded).decode().partition(":")
            # Parsed by hand: Starlette's form parser needs python-multipart.
            form = {k: v[0] for k, v in parse_qs((await request.body()).decode()).items()}
            if scheme != "Basic" or self.clients.get(client_id) != secret:
                return JSONResponse({"error": "invalid_client"}, status_code=401)
            if form.get("grant_type") != "client_credentials":
                return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
            self.tokens_issued += 1
            self.issued_at = time.monotonic()
            now = int(time.time())
            access_token = self.sign(
                sub=client_id, aud=str(form.get("audience")), exp=now + self.lifetime
            )
            return JSONResponse(
                {"access_token": access_token, "token_type": "Bearer", "expires_in": self.lifetime}
            )

        return Starlette(
            routes=[
                Route("/.well-known/openid-configuration", discovery),
                Route("/jwks", jwks),
                Route("/token", token, methods=["POST"]),
            ]
        )


@contextlib.asynccontextmanager
async def identity_provider() -> AsyncIterator[IdentityProvider]:
    provider = IdentityProvider(keys={"k1": ec.generate_private_key(ec.SECP256R1())})
    sock = bind_socket("127.0.0.1", 0)
    provider.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with anyio.create_task_group() as tg:
        await tg.start(serve, provider.app(), sock)
        yield provider
        tg.cancel_scope.cancel()


def unsigned(header: dict[str, Any], claims: dict[str, Any], secret: bytes | None = None) -> str:
    """A JWT built by hand: no signature, or an HMAC one with `secret`."""

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = f"{part(json.dumps(header).encode())}.{part(json.dumps(claims).encode())}"
    signature = (
        part(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()) if secret else ""
    )
    return f"{signing_input}.{signature}"


async def test_jwts_from_the_issuer_are_accepted_and_bad_ones_refused(tmp_path: Path) -> None:
    tokens = callers_file(tmp_path / "callers.toml", "alice")
    with anyio.fail_after(45):
        async with identity_provider() as idp:
            issuer = Issuer(idp.url, AUDIENCE, min_refresh=0.3)
            access = Access(callers=CallerFile(tmp_path / "callers.toml"), issuer=issuer)
            now = int(time.time())
            public_pem = (
                idp.keys["k1"]
                .public_key()
                .public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )
            claims = {"iss": idp.url, "aud": AUDIENCE, "sub": "mallory", "exp": now + 300}
            cases = {
                "valid": idp.sign(),
                "expired an hour ago": idp.sign(exp=now - 3600),
                "expired within the leeway": idp.sign(exp=now - 10),
                "another audience": idp.sign(aud="someone-else"),
                "another issuer": idp.sign(iss="https://evil.example"),
                "no subject": idp.sign(sub=""),
                "wrong key, same kid": idp.sign(key=ec.generate_private_key(ec.SECP256R1())),
                "alg none": unsigned({"alg": "none", "typ": "JWT"}, claims),
                "HS256 keyed with the public key": unsigned(
                    {"alg": "HS256", "typ": "JWT", "kid": "k1"}, claims, public_pem
                ),
                "unknown kid": idp.sign(kid="k2", key=ec.generate_private_key(ec.SECP256R1())),
                "three dots of garbage": "not.a.jwt",
                "a word": "hello",
                "non-ASCII header": unsigned({"alg": "\u00e9\u00e9\u00e9"}, claims),
                "alg is a list": unsigned({"alg": ["ES256"], "kid": {}}, claims),
                "exp is text": idp.sign(exp="tomorrow"),
            }
            async with (
                role_server(tmp_path, access=access) as server,
                httpx.AsyncClient(base_url=server.url, timeout=10) as http,
            ):
                card = (await http.get("/.well-known/agent-card.json")).json()
                answers = {
                    name: await Peer(http, token).rest("GET", "/rest/tasks")
                    for name, token in cases.items()
                }
                missing = await http.get("/rest/tasks", headers={"A2A-Version": "1.0"})
                # The issuer rotates: a token with the new key id makes the
                # server fetch the keys again (once), and then it verifies.
                fetches_before = idp.jwks_fetches
                idp.keys["k2"] = ec.generate_private_key(ec.SECP256R1())
                await anyio.sleep(0.35)  # past min_refresh since the last fetch
                rotated = await Peer(http, idp.sign(kid="k2")).rest("GET", "/rest/tasks")
                again = await Peer(http, idp.sign(kid="k3", key=idp.keys["k2"])).rest(
                    "GET", "/rest/tasks"
                )
                fetches_after = idp.jwks_fetches
                # A JWT caller's tasks are its own, apart from the token callers'.
                service = Peer(http, idp.sign())
                task = await start_slow(service)
                service_list = (await service.rest("GET", "/rest/tasks")).json()
                alice_list = (await Peer(http, tokens["alice"]).rest("GET", "/rest/tasks")).json()
                alice_get = await Peer(http, tokens["alice"]).rest(
                    "GET", f"/rest/tasks/{task['id']}"
                )

    accepted = {name for name, answer in answers.items() if answer.status_code == 200}
    assert accepted == {"valid", "expired within the leeway"}
    for name, answer in answers.items():
        if name in accepted:
            continue
        assert answer.status_code == 401, (name, answer.status_code, answer.text)
        challenge = answer.headers["www-authenticate"]
        assert challenge.startswith('Bearer realm="a2a"') and 'error="invalid_token"' in challenge
    assert "expired" in answers["expired an hour ago"].headers["www-authenticate"]
    assert "audience" in answers["another audience"].headers["www-authenticate"]
    assert "'none' is not accepted" in answers["alg none"].json()["detail"]
    assert "'HS256' is not accepted" in answers["HS256 keyed with the public key"].json()["detail"]
    # No credential at all: a bare challenge (RFC 6750 3.1), no error code.
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == 'Bearer realm="a2a"'
    assert rotated.status_code == 200
    assert again.status_code == 401  # an unknown kid right after a fetch: no new fetch
    assert fetches_after == fetches_before + 1
    schemes = card["securitySchemes"]
    assert schemes["bearer"]["httpAuthSecurityScheme"]["scheme"] == "bearer"
    assert schemes["oidc"]["openIdConnectSecurityScheme"]["openIdConnectUrl"] == (
        f"{idp.url}/.well-known/openid-configuration"
    )
    assert [list(r["schemes"]) for r in card["securityRequirements"]] == [["bearer"], ["oidc"]]
    assert [t["id"] for t in service_list["tasks"]] == [task["id"]]
    assert alice_list.get("tasks", []) == []
    assert alice_get.status_code == 404


async def test_an_unreachable_issuer_is_a_503_and_tokens_still_work(tmp_path: Path) -> None:
    tokens = callers_file(tmp_path / "callers.toml", "alice")
    closed = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()  # nothing listens there
    access = Access(callers=CallerFile(tmp_path / "callers.toml"), issuer=Issuer(url, AUDIENCE))
    key = ec.generate_private_key(ec.SECP256R1())
    token = jwt.encode(
        {"iss": url, "aud": AUDIENCE, "sub": "svc", "exp": int(time.time()) + 60},
        key,
        algorithm="ES256",
        headers={"kid": "k1"},
    )
    with anyio.fail_after(30):
        async with (
            role_server(tmp_path, access=access) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            jwt_answer = await Peer(http, token).rest("GET", "/rest/tasks")
            token_answer = await Peer(http, tokens["alice"]).rest("GET", "/rest/tasks")
    assert jwt_answer.status_code == 503 and jwt_answer.headers["retry-after"] == "30"
    assert "unavailable" in jwt_answer.json()["detail"]
    assert token_answer.status_code == 200


# -- quotas ---------------------------------------------------------------------------


def refusal_of(error: dict[str, Any]) -> dict[str, Any]:
    """A quota refusal's data (a2a-sdk carries it as a google.rpc.ErrorInfo's metadata)."""
    [info] = error["data"]
    assert info["reason"] == "INVALID_REQUEST"
    return dict(info["metadata"])


async def test_a_caller_over_its_quota_is_refused_while_another_proceeds(tmp_path: Path) -> None:
    path = tmp_path / "callers.toml"
    tokens = {name: new_token() for name in ("alice", "bob", "carol")}
    path.write_text(
        f'[callers.alice]\ntoken_hash = "{hash_token(tokens["alice"])}"\n'
        "concurrent_tasks = 1\ntasks_per_minute = 2\n\n"
        f'[callers.bob]\ntoken_hash = "{hash_token(tokens["bob"])}"\n\n'
        f'[callers.carol]\ntoken_hash = "{hash_token(tokens["carol"])}"\ntokens_per_day = 10\n'
    )
    db = tmp_path / "tasks.db"
    with anyio.fail_after(45):
        async with (
            role_server(tmp_path, access=Access(callers=CallerFile(path)), db=db) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            alice, bob, carol = (Peer(http, tokens[n]) for n in ("alice", "bob", "carol"))
            running = await start_slow(alice)
            # At her one concurrent task, Alice is refused on every binding.
            rpc_refusal = await http.post(
                "/",
                json={
                    "jsonrpc": "2.0",
                    "id": 7,
                    "method": "SendMessage",
                    "params": {"message": message("quick")},
                },
                headers=alice.headers(),
            )
            rest_refusal = await alice.rest(
                "POST", "/rest/message:send", {"message": message("quick")}
            )
            stream_refusal = await alice.rest(
                "POST", "/rest/message:stream", {"message": message("quick")}
            )
            # Bob has no limits: his tasks run beside hers.
            bob_tasks = [await start_slow(bob), await start_slow(bob)]
            bob_quick = await bob.rpc("SendMessage", {"message": message("quick")})
            # Alice's own task can still be controlled and canceled.
            paused = await alice.rpc(
                "SendMessage",
                {"message": message("", taskId=running["id"], metadata={CONTROL_KEY: "pause"})},
            )
            await alice.rest("POST", f"/rest/tasks/{running['id']}:cancel")
            second = await alice.rpc("SendMessage", {"message": message("quick")})
            third = await alice.rpc("SendMessage", {"message": message("quick")})
            # Carol's one task uses 25 tokens of her 10 a day; the next is refused.
            carol_first = await carol.rpc("SendMessage", {"message": message("quick")})
            carol_second = await carol.rest(
                "POST", "/rest/message:send", {"message": message("quick")}
            )
        usage = UsageLog(db)
        rows = {row.owner: row for row in await usage.rows(day=today())}
        usage.close()
        # A restart does not hand Carol a new daily budget.
        async with (
            role_server(tmp_path, access=Access(callers=CallerFile(path)), db=db) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            carol_after_restart = await Peer(http, tokens["carol"]).rpc(
                "SendMessage", {"message": message("quick")}
            )
            bob_after_restart = await Peer(http, tokens["bob"]).rpc(
                "SendMessage", {"message": message("quick")}
            )

    error = rpc_refusal.json()["error"]
    assert rpc_refusal.status_code == 200 and error["code"] == -32600
    assert "quota exceeded: concurrent_tasks is 1" in error["message"]
    assert refusal_of(error) == {"quota": "concurrent_tasks", "limit": 1, "retry_after": 5}
    assert rpc_refusal.headers["retry-after"] == "5"
    for refusal in (rest_refusal, stream_refusal):
        assert refusal.status_code == 429, refusal.text
        assert refusal.headers["retry-after"] == "5"
        body = refusal.json()["error"]
        assert body["code"] == 429 and body["status"] == "RESOURCE_EXHAUSTED"
        assert "concurrent_tasks" in body["message"]
    assert all(
        t["status"]["state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING") for t in bob_tasks
    )
    assert bob_quick["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert paused["result"]["task"]["id"] == running["id"]
    assert second["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert refusal_of(third["error"])["quota"] == "tasks_per_minute"
    assert 1 <= refusal_of(third["error"])["retry_after"] <= 60
    assert carol_first["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert carol_second.status_code == 429
    assert carol_second.json()["error"]["message"].startswith(
        "quota exceeded: tokens_per_day is 10"
    )
    assert 0 < int(carol_second.headers["retry-after"]) <= 86400
    assert refusal_of(carol_after_restart["error"])["quota"] == "tokens_per_day"
    assert "result" in bob_after_restart
    # Usage per caller: tasks started, refusals, and the tokens of finished turns.
    assert (rows["alice"].tasks, rows["alice"].refused) == (2, 4)
    assert (rows["carol"].tasks, rows["carol"].refused, rows["carol"].tokens) == (1, 1, 25)
    assert (rows["bob"].tasks, rows["bob"].input_tokens, rows["bob"].output_tokens) == (3, 20, 5)


# -- the callers file -------------------------------------------------------------------


async def test_the_callers_file_is_reloaded_without_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "callers.toml"
    tokens = callers_file(path, "alice")
    with anyio.fail_after(30):
        async with (
            role_server(tmp_path, access=Access(callers=CallerFile(path))) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):

            async def status(token: str) -> int:
                return (await Peer(http, token).rest("GET", "/rest/tasks")).status_code

            before = await status(tokens["alice"])
            carol = add_caller(path, "carol")
            carol_added = await status(carol)
            old_alice = tokens["alice"]
            new_alice = add_caller(path, "alice", replace=True)
            rotated = (await status(old_alice), await status(new_alice))
            # A file that stops parsing keeps the callers read before it.
            path.write_text(path.read_text() + "\n[callers.broken\n")
            broken = await status(carol)
            path.unlink()
            gone = await status(carol)
    assert before == 200
    assert carol_added == 200
    assert rotated == (401, 200)
    assert broken == 200
    assert gone == 401


def test_token_hashes_and_bad_callers_files(tmp_path: Path) -> None:
    stored = hash_token("a2a_secret", salt="00112233445566778899aabbccddeeff")
    # The format the README documents: sha256 of "SALT:TOKEN".
    digest = hashlib.sha256(b"00112233445566778899aabbccddeeff:a2a_secret").hexdigest()
    assert stored == f"sha256:00112233445566778899aabbccddeeff:{digest}"
    assert token_matches("a2a_secret", stored) and not token_matches("a2a_secreT", stored)
    path = tmp_path / "callers.toml"
    problems = {
        '[callers.x]\ntoken_hash = "plain"\n': "token_hash': must be 'sha256:SALT:DIGEST'",
        f'[callers.x]\ntoken_hash = "{stored}"\nconcurent_tasks = 1\n': "unknown field",
        f'[callers.default]\ntoken_hash = "{stored}"\n': "A2A_AUTH_TOKEN",
        # The owner of tasks stored before callers had names: taking the name
        # would hand those tasks over.
        f'[callers.a2a-client]\ntoken_hash = "{stored}"\n': "stored before callers had names",
        "[limits]\ntokens_per_day = -1\n": "must be an integer >= 0",
        "[admins]\n": "'admins': unknown field",
    }
    for text, expected in problems.items():
        path.write_text(text)
        with pytest.raises(ConfigError, match=expected):
            CallerFile(path)
    with pytest.raises(ConfigError, match="does not exist"):
        CallerFile(tmp_path / "missing.toml")
    assert "a2a_secret" not in path.read_text()


# -- the orchestrator -----------------------------------------------------------------


async def test_orchestrator_sessions_belong_to_their_caller(tmp_path: Path) -> None:
    tokens = callers_file(tmp_path / "callers.toml", "alice", "bob")
    access = Access(callers=CallerFile(tmp_path / "callers.toml"))
    parent = ScriptedModel([{"text": "Nothing to delegate.\nTASK_DONE"}] * 4)
    with anyio.fail_after(45):
        async with (
            run_orchestrator_server(
                store_path=tmp_path / "orchestrator.db",
                workdir=tmp_path,
                network=Network.of(),
                models=lambda name: parent,
                db=str(tmp_path / "orchestrator-tasks.db"),
                access=access,
            ) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            alice, bob = Peer(http, tokens["alice"]), Peer(http, tokens["bob"])
            delegate = {MODE_KEY: "delegate"}
            done = await alice.rpc("SendMessage", {"message": message("hi", metadata=delegate)})
            session = done["result"]["task"]["contextId"]
            # A session the CLI ran in the same store has no caller.
            cli_store = Store(tmp_path / "orchestrator.db")
            await cli_store.create_session("cli-session")
            cli_store.close()
            alice_sessions = (await alice.rest("GET", "/api/sessions")).json()["sessions"]
            bob_sessions = (await bob.rest("GET", "/api/sessions")).json()["sessions"]
            missing = uuid.uuid4().hex
            bob_answers = {}
            for method, route in (
                ("GET", "/api/sessions/{}/children"),
                ("GET", "/api/sessions/{}/events"),
                ("POST", "/api/sessions/{}/subagents/stop"),
            ):
                theirs = await bob.rest(method, route.format(session))
                none = await bob.rest(method, route.format(missing))
                bob_answers[route] = (
                    theirs.status_code,
                    same_answer(theirs.json(), none.json(), session, missing),
                )
            alice_events = await alice.rest("GET", f"/api/sessions/{session}/events")
            # Bob's message in Alice's context is refused: it would join her session.
            joined = await bob.rpc(
                "SendMessage", {"message": message("hi", contextId=session, metadata=delegate)}
            )
    assert done["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert [s["id"] for s in alice_sessions] == [session]
    assert alice_sessions[0]["metadata"]["owner"] == "alice"
    assert bob_sessions == []
    assert bob_answers == {route: (404, True) for route in bob_answers}
    assert alice_events.status_code == 200 and alice_events.json()["events"]
    assert joined["error"]["code"] == -32602


@pytest.mark.parametrize("prompts", [("quick", "quick"), ("ask", "quick")])
async def test_an_orchestrators_turns_count_against_its_quota_though_they_end_in_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prompts: tuple[str, str]
) -> None:
    """The orchestrator reads batched frames (the batch extension's v2), so
    its child's answer and the turn's end come in one status update, with
    the usage (an input-required turn: its spend) in that update's last
    part: the quota still counts it."""
    path = tmp_path / "callers.toml"
    token = new_token()
    path.write_text(f'[callers.carol]\ntoken_hash = "{hash_token(token)}"\ntokens_per_day = 10\n')
    monkeypatch.setenv("CAROL_TOKEN", token)
    db = tmp_path / "tasks.db"
    with anyio.fail_after(45):
        async with role_server(tmp_path, access=Access(callers=CallerFile(path)), db=db) as server:
            network = Network.of(
                AgentSpec(name="coder", role="coder", url=server.url, token_env="CAROL_TOKEN")
            )
            store = Store(tmp_path / "orchestrator.db")
            try:
                async with Session(store, workdir=tmp_path, network=network) as session:
                    results = []
                    for prompt in prompts:
                        handle = await session.spawn(ChildConfig(role="coder", prompt=prompt))
                        results.append(await handle.result())
            finally:
                store.close()
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
                listing = await Peer(http, token).rpc("ListTasks", {})
        usage = UsageLog(db)
        rows = {row.owner: row for row in await usage.rows(day=today())}
        usage.close()
    first, second = results
    assert isinstance(second, Failed) and "tokens_per_day is 10" in second.message
    assert (rows["carol"].tasks, rows["carol"].refused, rows["carol"].tokens) == (1, 1, 25)
    (task,) = listing["result"]["tasks"]
    status = task["status"]
    if prompts[0] == "ask":
        # An input-required turn reports its spend (it has no usage): counted all the same.
        assert isinstance(first, InputRequired) and first.question == "which one?"
        assert status["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert status["message"]["metadata"][EVENT_KEY] == BATCH_KIND
        ending = status["message"]["parts"][-1]
        assert ending["metadata"][EVENT_KEY] == "input_required"
        assert ending["metadata"]["spent"]["inputTokens"] == 20
        return
    assert isinstance(first, Done) and first.text == "ok"
    # The first turn ended in a batch: its answer, then the done with its usage.
    assert status["state"] == "TASK_STATE_COMPLETED"
    assert status["message"]["metadata"][EVENT_KEY] == BATCH_KIND
    ending = status["message"]["parts"][-1]
    assert ending["metadata"][EVENT_KEY] == "done"
    assert ending["metadata"]["usage"] == {"inputTokens": 20, "outputTokens": 5}


# -- the orchestrator as a client: OAuth2 client credentials ----------------------------


async def test_client_credentials_get_and_refresh_the_orchestrators_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CODER_CLIENT_SECRET", "s3cret")
    monkeypatch.setenv("WRONG_SECRET", "guess")
    with anyio.fail_after(45):
        async with identity_provider() as idp:
            idp.clients["orchestrator"] = "s3cret"
            idp.lifetime = 4  # refreshed once half of it is gone
            access = Access(issuer=Issuer(idp.url, AUDIENCE))
            async with role_server(tmp_path, access=access) as server:

                def agent(name: str, secret_env: str) -> AgentSpec:
                    return AgentSpec(
                        name=name,
                        role="coder",
                        url=server.url,
                        token_url=f"{idp.url}/token",
                        client_id="orchestrator",
                        client_secret_env=secret_env,
                        audience=AUDIENCE,
                    )

                network = Network.of(
                    agent("coder", "CODER_CLIENT_SECRET"), agent("bad", "WRONG_SECRET")
                )
                async with Session(
                    Store(tmp_path / "orchestrator.db"), workdir=tmp_path, network=network
                ) as session:
                    results = []
                    for _ in range(2):
                        handle = await session.spawn(ChildConfig(role="coder", prompt="quick"))
                        results.append(await handle.result())
                    issued_for_two = idp.tokens_issued
                    # Past the refresh point: half the token's lifetime after it came.
                    await anyio.sleep(idp.issued_at + idp.lifetime / 2 + 0.05 - time.monotonic())
                    handle = await session.spawn(ChildConfig(role="coder", prompt="quick"))
                    results.append(await handle.result())
                    issued_for_three = idp.tokens_issued
                    refused = await (
                        await session.spawn(ChildConfig(role="bad", prompt="quick"))
                    ).result()
    assert all(isinstance(r, Done) and r.text == "ok" for r in results), results
    assert issued_for_two == 1
    assert issued_for_three == 2
    assert isinstance(refused, Failed)
    assert "refused client 'orchestrator' (401): invalid_client" in refused.message


def test_agent_files_take_client_credentials(tmp_path: Path) -> None:
    path = tmp_path / "coder.toml"
    path.write_text(
        'role = "coder"\nurl = "https://coder.example"\n'
        'token_url = "https://idp.example/token"\nclient_id = "orchestrator"\n'
        'client_secret_env = "CODER_SECRET"\nscope = "a2a"\n'
    )
    from a2a_orchestrator.delegation.network import load_agent_file

    spec = load_agent_file(path)
    assert (spec.token_url, spec.client_id, spec.scope) == (
        "https://idp.example/token",
        "orchestrator",
        "a2a",
    )
    assert spec.client_secret({"CODER_SECRET": "x"}) == "x"
    with pytest.raises(ConfigError, match=r"client_secret_env.*required with token_url"):
        AgentSpec(name="a", role="coder", token_url="https://idp.example/t", client_id="c")
    with pytest.raises(ConfigError, match="either token_env or token_url"):
        AgentSpec(
            name="a",
            role="coder",
            token_env="T",
            token_url="https://idp.example/t",
            client_id="c",
            client_secret_env="S",
        )
    with pytest.raises(ConfigError, match="needs token_url"):
        AgentSpec(name="a", role="coder", client_id="c")
    with pytest.raises(ConfigError, match="not an environment variable name"):
        AgentSpec(
            name="a",
            role="coder",
            token_url="https://idp.example/t",
            client_id="c",
            client_secret_env="s3cr3t-value",
        )


# -- the command line -------------------------------------------------------------------


def test_token_add_prints_the_token_once_and_the_file_keeps_its_hash(tmp_path: Path) -> None:
    path = tmp_path / "callers.toml"
    cli = [sys.executable, "-m", "a2a_orchestrator.cli", "token", "add"]
    added = subprocess.run([*cli, "reports", "--file", str(path)], capture_output=True, text=True)
    again = subprocess.run([*cli, "reports", "--file", str(path)], capture_output=True, text=True)
    token = added.stdout.strip()
    assert added.returncode == 0 and token.startswith("a2a_") and len(token) > 40
    assert "shown this once" in added.stderr
    assert token not in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    assert CallerFile(path).match(token) is not None
    assert again.returncode == 2 and "--replace" in again.stderr


def test_serve_flags_and_variables_configure_access(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "callers.toml"
    add_caller(path, "reports")
    monkeypatch.delenv("A2A_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("A2A_JWT_AUDIENCE", "coder-api")
    argv = ["serve", "coder", "--callers", str(path), "--jwt-issuer", "https://idp.example"]
    access = access_of(build_parser().parse_args(argv))
    assert access is not None and access.callers is not None and access.issuer is not None
    assert (access.issuer.audience, access.issuer.leeway) == ("coder-api", 60.0)
    assert access.describe() == (
        f"caller tokens from {path}, JWTs from https://idp.example (audience 'coder-api')"
    )
    monkeypatch.delenv("A2A_JWT_AUDIENCE")
    with pytest.raises(ConfigError, match="audience is needed"):
        access_of(build_parser().parse_args(argv))
    with pytest.raises(ConfigError, match="https"):
        access_of(
            build_parser().parse_args(
                ["serve", "coder", "--jwt-issuer", "http://idp.example", "--jwt-audience", "x"]
            )
        )
    assert access_of(build_parser().parse_args(["serve", "coder"])) is None


async def test_context_owners_on_both_kinds_of_task_store(tmp_path: Path) -> None:
    """The context check works on a2a-sdk's SQL store (PostgreSQL replicas) as on ours."""
    from a2a.server.context import ServerCallContext
    from a2a.types import Task, TaskState, TaskStatus

    from a2a_orchestrator.server.app import open_task_store
    from a2a_orchestrator.storage.tasks.observed import observed as observing
    from a2a_orchestrator.storage.tasks.sqlite import SQLiteTaskStore, TaskOwner, context_owners

    async def ignore(task: Task, context: ServerCallContext) -> None:
        return None

    with anyio.fail_after(20):
        for db in (str(tmp_path / "ours.db"), f"sqlite+aiosqlite:///{tmp_path / 'sdk.db'}"):
            store = open_task_store(db)
            if not isinstance(store, SQLiteTaskStore):
                await store.initialize()  # type: ignore[attr-defined]
            for number, (owner, context_id) in enumerate(
                [("alice", "c1"), ("bob", "c1"), ("alice", "c2")]
            ):
                task = Task(
                    id=f"t{number}",
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_WORKING),
                )
                await store.save(task, ServerCallContext(user=TaskOwner(owner)))
            observed = observing(store, ignore)
            found = [await context_owners(observed, c) for c in ("c1", "c2", "c3")]
            if isinstance(store, SQLiteTaskStore):
                store.close()
            else:
                await store.engine.dispose()  # type: ignore[attr-defined]
            assert found == [{"alice", "bob"}, {"alice"}, set()], db
