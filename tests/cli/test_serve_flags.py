"""Every `serve` option works for both kinds of server, or the kind that does
not read it refuses it: no option is silently ignored (issue 25, point 5)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
from pathlib import Path

import anyio
import pytest
from support.cli import OFFLINE, subcommands
from support.messages import user_message
from support.servers import a2a_client, serve_process

from a2a_orchestrator.cli import main
from a2a_orchestrator.cli.commands.serve import ORCHESTRATOR_ONLY, ROLE_ONLY
from a2a_orchestrator.cli.parser import build_parser
from a2a_orchestrator.orchestrator.app import MODE_KEY

# The options both kinds read, each checked to reach both where it is not
# obvious (below, and in test_cli / test_wire_trust / test_orchestrator_server).
# A new option fails `test_every_serve_option_is_read_or_refused` until it is
# put here (tested on both) or in ROLE_ONLY / ORCHESTRATOR_ONLY (refused).
BOTH = {
    "role", "host", "port", "db", "workdir", "public_url", "grpc_port", "grpc_card", "token_env",
    "models", "body_timeout", "lease", "lease_seconds", "protocol", "card_key",
    "card_key_id", "push_allow", "push_max_per_task", "push_max_per_owner",
    "no_sandbox", "allow_network", "callers", "jwt_issuer", "jwt_audience",
    "jwt_jwks_url", "jwt_leeway", "metrics_public", "no_metrics", "max_streams",
    "max_streams_per_caller",
}  # fmt: skip


def serve_options() -> dict[str, argparse.Action]:
    """`serve`'s options by destination, read from the parser itself."""
    serve = subcommands(build_parser())["serve"]
    return {a.dest: a for a in serve._actions if a.dest != "help"}


def a_value(action: argparse.Action) -> list[str]:
    """Arguments that give `action` a value other than its default."""
    flag = action.option_strings[0]
    if action.nargs == 0:
        return [flag]
    if action.choices:
        return [flag, next(c for c in action.choices if c != action.default)]
    return [flag, "1"]


def test_every_serve_option_is_read_or_refused() -> None:
    options = serve_options()
    classified = BOTH | set(ROLE_ONLY) | set(ORCHESTRATOR_ONLY)
    assert set(options) == classified, "classify the new serve option(s) here"
    assert not BOTH & (set(ROLE_ONLY) | set(ORCHESTRATOR_ONLY))


@pytest.mark.parametrize(
    ("kind", "dest"),
    [("orchestrator", d) for d in ROLE_ONLY] + [("coder", d) for d in ORCHESTRATOR_ONLY],
)
def test_an_option_the_other_kind_reads_is_refused(
    kind: str, dest: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    action = serve_options()[dest]
    code = main(["serve", kind, "--port", "0", "--workdir", str(tmp_path), *a_value(action)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"does not take {action.option_strings[0]}:" in err, err
    assert not (tmp_path / ".a2a").exists()  # refused before anything was made


def test_lease_and_lease_seconds_are_one_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--workdir", str(tmp_path), "--lease", "5", "--lease-seconds", "6"]
    for kind in ("orchestrator", "coder"):
        assert main(["serve", kind, *argv]) == 2
        assert "name the same setting" in capsys.readouterr().err


async def _trickled(url: str) -> tuple[bytes, float]:
    """A POST whose body never arrives whole: the reply, and when it came."""
    host, port = url.removeprefix("http://").split(":")
    stream = await anyio.connect_tcp(host, int(port))
    reply = b""
    async with stream, anyio.create_task_group() as tg:

        async def trickle() -> None:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                for _ in range(100):
                    await stream.send(b" ")
                    await anyio.sleep(0.2)

        await stream.send(
            b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        started = anyio.current_time()
        tg.start_soon(trickle)
        with anyio.move_on_after(10):
            while True:
                try:
                    reply += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
        elapsed = anyio.current_time() - started
        tg.cancel_scope.cancel()
    return reply, elapsed


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["orchestrator", "coder"])
async def test_body_timeout_holds_on_both_kinds(kind: str, tmp_path: Path) -> None:
    with anyio.fail_after(60):
        with serve_process(tmp_path, kind, "--body-timeout", "1", env=OFFLINE) as (_, url, _b):
            reply, elapsed = await _trickled(url)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert 0.8 <= elapsed < 5


@pytest.mark.anyio
async def test_models_offers_a_name_to_the_orchestrators_parent(tmp_path: Path) -> None:
    """`serve orchestrator --models fast`: the parent agent may spawn a child
    on `fast` (before, only $A2A_MODELS reached it: "not offered")."""
    parent = tmp_path / "parent.json"
    parent.write_text(
        json.dumps(
            [
                {
                    "tool_calls": [
                        {
                            "name": "agent",
                            "arguments": {
                                "agents": [{"role": "coder", "prompt": "hi", "model": "fast"}]
                            },
                        }
                    ]
                },
                {"text": "spawned. TASK_DONE"},
            ]
        )
    )
    child = tmp_path / "child.json"
    child.write_text(json.dumps([{"text": "child done"}]))
    env = {**OFFLINE, "A2A_MODEL_DEFAULT": f"scripted:{parent}", "A2A_MODEL_SCRIPT": str(child)}
    env["A2A_MODELS"] = ""
    with anyio.fail_after(60):
        with serve_process(tmp_path, "orchestrator", "--models", "fast", env=env) as (_, url, _b):
            async with a2a_client(url, streaming=False) as client:
                request = user_message("spawn one")
                request.message.metadata.update({MODE_KEY: "delegate"})
                async for _response in client.send_message(request):
                    pass
    with sqlite3.connect(tmp_path / ".a2a" / "orchestrator.db") as db:
        rows = db.execute("SELECT config FROM children").fetchall()
    assert [json.loads(config)["model"] for (config,) in rows] == ["fast"]
