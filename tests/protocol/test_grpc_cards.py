"""Which card lists gRPC: stock Google ADK clients and gRPC clients both served.

Google ADK's `RemoteA2aAgent` (2.13) refuses a card any of whose endpoints is
off the origin the card was fetched from (`_validate_card_rpc_targets`), so
it refuses the card of a server whose gRPC port is listed in it.
`serve --grpc-card separate` lists gRPC only in a second card
(`GRPC_CARD_PATH`); ADK takes the agent card and gets its answer, and a gRPC
client pointed at the second card (an agent file's `card_path`) speaks gRPC.

Real `serve coder` processes and role servers on 127.0.0.1; only the model
is scripted. ADK runs in this process on a2a-sdk 1.3, the version pinned
here; on a2a-sdk 0.3 it reads the card's v0.3 fields, whose endpoints are
checked to share the card's origin too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import pytest
from support.servers import CARD_PATH, role_server, serve_process

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network, load_agent_file
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.errors import ConfigError
from a2a_orchestrator.protocol.cards import GRPC_CARD_PATH, CardOptions
from a2a_orchestrator.runtime.events import Done
from a2a_orchestrator.storage.store import Store

pytestmark = [
    pytest.mark.anyio,
    # ADK marks its A2A support experimental, with a warning at each use.
    pytest.mark.filterwarnings("ignore:.*EXPERIMENTAL.*:UserWarning"),
]

SCRIPT_ENV = {
    "A2A_MODEL_BASE_URL": "",
    "A2A_MODEL_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "OPENAI_API_KEY": "",
}


@contextmanager
def served(tmp_path: Path, *args: str, role: str = "coder") -> Iterator[tuple[str, str]]:
    """`serve ROLE --grpc-port 0 ARGS` answering "the coder's answer"; its
    URL and gRPC address."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "the coder's answer"}]))
    (tmp_path / "w").mkdir()
    env = {**SCRIPT_ENV, "A2A_MODEL_SCRIPT": str(script)}
    with serve_process(tmp_path / "w", role, "--grpc-port", "0", *args, env=env) as (
        _,
        url,
        banner,
    ):
        address = re.search(r"gRPC: (\S+)", banner)
        assert address is not None, banner
        yield url, address.group(1)


async def ask_adk(card_url: str, text: str) -> tuple[list[str], list[str]]:
    """Ask ADK's `RemoteA2aAgent` reading the card at `card_url`, as the root
    agent of an in-memory runner: the texts it answers and its errors."""
    remote = pytest.importorskip(
        "google.adk.agents.remote_a2a_agent",
        reason="needs google-adk (in the test extra: pip install -e '.[test]')",
    )
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    agent = remote.RemoteA2aAgent(name="coder", agent_card=card_url, timeout=30)
    runner = InMemoryRunner(agent=agent, app_name="adk-client")
    session = await runner.session_service.create_session(app_name="adk-client", user_id="u")
    texts: list[str] = []
    errors: list[str] = []
    message = types.Content(role="user", parts=[types.Part(text=text)])
    async for event in runner.run_async(user_id="u", session_id=session.id, new_message=message):
        if event.error_message:
            errors.append(event.error_message)
        if event.content is not None:
            texts += [part.text for part in event.content.parts or () if part.text]
    await runner.close()
    return texts, errors


def origins(card: dict[str, Any]) -> set[tuple[str, str, int | None]]:
    """The origins of every endpoint a client may be sent to by `card`: its
    v1.0 interfaces and, as a v0.3 client reads it, `url` and
    `additionalInterfaces` (what ADK checks on either a2a-sdk)."""
    urls = [i["url"] for i in card["supportedInterfaces"]]
    urls += [card["url"]] if "url" in card else []
    urls += [i["url"] for i in card.get("additionalInterfaces", ())]
    # A gRPC address is host:port, no scheme: read as one with "//" before it.
    split = [urlsplit(u if "://" in u else "//" + u) for u in urls]
    return {(s.scheme, s.hostname or "", s.port) for s in split}


async def test_adk_refuses_a_card_that_lists_grpc(tmp_path: Path) -> None:
    """Why `separate` exists: the default card names the gRPC port."""
    with anyio.fail_after(60):
        with served(tmp_path) as (url, address):
            texts, errors = await ask_adk(url + CARD_PATH, "hello")
    assert texts == []
    # ADK's words (2.13): should a later ADK take this card, the docs'
    # "ADK refuses that card" (docs/operating.md, gRPC) is to be revised.
    assert len(errors) == 1, errors
    assert f"Agent card RPC URL must use https, or http on a loopback host: {address}" in errors[0]


@pytest.mark.parametrize("protocol", [[], ["--protocol", "1.0"]], ids=["default", "1.0"])
async def test_adk_gets_its_answer_with_grpc_in_a_separate_card(
    tmp_path: Path, protocol: list[str]
) -> None:
    with anyio.fail_after(60):
        with served(tmp_path, "--grpc-card", "separate", *protocol) as (url, address):
            async with httpx.AsyncClient(timeout=10) as http:
                main = (await http.get(url + CARD_PATH)).json()
                with_grpc = (await http.get(url + GRPC_CARD_PATH)).json()
            texts, errors = await ask_adk(url + CARD_PATH, "hello")
    assert errors == [] and "the coder's answer" in texts, (texts, errors)
    origin = urlsplit(url)
    assert origins(main) == {(origin.scheme, origin.hostname, origin.port)}
    # The second card is the first plus gRPC, listed first (preferred).
    grpc_first, *rest = with_grpc["supportedInterfaces"]
    assert grpc_first == {"url": address, "protocolBinding": "GRPC", "protocolVersion": "1.0"}
    assert [i for i in rest if i["protocolBinding"] != "GRPC"] == main["supportedInterfaces"]
    interfaces = ("supportedInterfaces", "additionalInterfaces")
    assert {k: v for k, v in with_grpc.items() if k not in interfaces} == {
        k: v for k, v in main.items() if k not in interfaces
    }
    if "url" in main:
        assert {"url": grpc_first["url"], "transport": "GRPC"} in with_grpc["additionalInterfaces"]
    else:
        assert "additionalInterfaces" not in with_grpc


async def test_the_orchestrator_serves_grpc_in_a_separate_card_from_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("A2A_GRPC_CARD", "separate")
    monkeypatch.setenv("A2A_AUTH_TOKEN", "s3cret-cards")
    with anyio.fail_after(60):
        with served(tmp_path, role="orchestrator") as (url, address):
            # Both cards are public: fetched without the token auth asks for.
            async with httpx.AsyncClient(timeout=10) as http:
                main = (await http.get(url + CARD_PATH)).raise_for_status().json()
                with_grpc = (await http.get(url + GRPC_CARD_PATH)).raise_for_status().json()
                refused = await http.post(url + "/", json={})
    origin = urlsplit(url)
    assert origins(main) == {(origin.scheme, origin.hostname, origin.port)}
    assert with_grpc["supportedInterfaces"][0]["url"] == address
    assert refused.status_code == 401


async def test_the_orchestrator_client_takes_grpc_from_the_card_at_card_path(
    tmp_path: Path,
) -> None:
    separate = CardOptions(grpc_card="separate")
    with anyio.fail_after(40):
        async with role_server(
            tmp_path, [{"text": "the answer"}], grpc_port=0, card_options=separate
        ) as server:
            answers = {}
            for name, path in (("plain", None), ("grpc", GRPC_CARD_PATH)):
                spec = AgentSpec(name=name, role="coder", url=server.url, card_path=path)
                async with Session(
                    Store(tmp_path / f"{name}.db"), workdir=tmp_path, network=Network.of(spec)
                ) as session:
                    child = await session.spawn(ChildConfig(role=name, prompt="x"))
                    answers[name] = (await child.result(), session.remote.grpc.targets)
    plain, plain_targets = answers["plain"]
    over_grpc, grpc_targets = answers["grpc"]
    assert isinstance(plain, Done) and plain.text == "the answer"
    assert plain_targets == []  # the agent card lists no gRPC: JSON-RPC
    assert isinstance(over_grpc, Done) and over_grpc.text == "the answer"
    assert grpc_targets == [server.grpc_address]


def test_agent_file_card_path(tmp_path: Path) -> None:
    good = tmp_path / "coder.toml"
    good.write_text(
        f'role = "coder"\nurl = "http://coder.example"\ncard_path = "{GRPC_CARD_PATH}"\n'
    )
    assert load_agent_file(good).card_path == GRPC_CARD_PATH
    for bad in ("agent-card.json", "https://elsewhere.example/card.json", "//host/card"):
        good.write_text(f'role = "coder"\nurl = "http://coder.example"\ncard_path = "{bad}"\n')
        with pytest.raises(ConfigError, match=r"card_path.*not a path on the agent's server"):
            load_agent_file(good)


def test_unknown_grpc_card_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="gRPC card 'both': one of main, separate"):
        CardOptions(grpc_card="both")
    assert CardOptions.from_settings(environ={"A2A_GRPC_CARD": "separate"}).grpc_card == "separate"
