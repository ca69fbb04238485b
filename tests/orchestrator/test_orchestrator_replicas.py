"""Orchestrator replicas on one PostgreSQL store: leases, and takeover after SIGKILL.

Real parts only: a PostgreSQL server (tests/support/postgres.py), `serve
orchestrator` processes, a role server on 127.0.0.1; the models are
scripted (the parent's from a file, the children's in the role server).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from support.messages import collect, user_message
from support.postgres import Postgres
from support.servers import a2a_client, role_server

from a2a_orchestrator.orchestrator.app import MODE_KEY
from a2a_orchestrator.runtime.events import Done
from a2a_orchestrator.storage.session_leases import Leases
from a2a_orchestrator.storage.store_pg import PgStore

pytestmark = pytest.mark.anyio

LEASE = 2.0
CHILDREN = ("alpha", "beta", "gamma")


def child_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The remote children's model: slow enough to be mid-turn at the kill."""
    prompt = next(m["content"] for m in messages if m["role"] == "user")
    return {"delay": 4.0, "text": f"done: {prompt.split()[-1]}"}


PARENT_SCRIPT = [
    {
        "tool_calls": [
            {
                "name": "agent",
                "arguments": {
                    "agents": [{"role": "coder", "prompt": f"work on {n}"} for n in CHILDREN]
                },
            }
        ]
    },
    # The parent's turn outlives replica A, which is killed while it waits.
    {"delay": 60.0, "text": "never"},
]


class Partition:
    """A TCP proxy on 127.0.0.1 between one replica and PostgreSQL that can
    cut the replica off: `refuse` closes its connections and its port (the
    database is gone), `stall` keeps them open and drops every byte (a
    network partition: calls hang)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.stalled = False
        self._serving = anyio.CancelScope()

    async def serve(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            task_status.started()
            with self._serving:  # cancelled: the relays end, their connections close
                await listener.serve(self._relay)

    async def _relay(self, client: Any) -> None:
        server = await anyio.connect_tcp("127.0.0.1", self.target_port)
        async with client, server, anyio.create_task_group() as tg:
            tg.start_soon(self._pump, client, server)
            tg.start_soon(self._pump, server, client)

    async def _pump(self, source: Any, sink: Any) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async for data in source:
                if not self.stalled:
                    await sink.send(data)

    def cut(self, how: str) -> None:
        if how == "stall":
            self.stalled = True
        else:
            self._serving.cancel()


@pytest.mark.parametrize("how", ["refuse", "stall"])
async def test_a_replica_cut_off_from_the_database_stops_its_sessions_before_the_lease_ends(
    postgres: Postgres, how: str
) -> None:
    database = postgres.database()
    lost: list[str] = []
    stopped = anyio.Event()

    def on_lost(session_id: str) -> None:
        lost.append(session_id)
        stopped.set()

    async def on_takeover(session_id: str) -> None:
        raise AssertionError(f"nothing to take over here ({session_id})")

    partition = Partition(postgres.port)
    other = PgStore(postgres.url(database))
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(partition.serve)
            store = PgStore(f"postgresql://a2a@127.0.0.1:{partition.port}/{database}")
            leases = Leases(
                store,
                url="http://a",
                seconds=LEASE,
                owner="A",
                on_takeover=on_takeover,
                on_lost=on_lost,
            )
            try:
                await leases.claim("s1")
                tg.start_soon(leases.run)
                # Renewed for three leases' time while the database answers.
                await anyio.sleep(3 * LEASE)
                assert lost == [] and leases.held == {"s1"}
                partition.cut(how)
                with anyio.fail_after(LEASE):
                    await stopped.wait()
                # Stopped before its lease ran out: no other replica could run it yet.
                lease = await other.leases.get("s1")
                assert lease is not None and lease.holder == "A" and lease.live
                assert lost == ["s1"] and leases.held == set()
            finally:
                tg.cancel_scope.cancel()
                store.close()
                other.close()


@contextmanager
def replica(
    tmp_path: Path,
    name: str,
    store: str,
    role_url: str,
    parent: list[dict[str, Any]] | None = None,
    token: str = "",
) -> Iterator[tuple[Any, str]]:
    """`a2a-orchestrator serve orchestrator --store postgresql://...` as its
    own process, its parent model playing `parent` (default `PARENT_SCRIPT`),
    callers needing `token` if one is given."""
    script = tmp_path / "parent.json"
    script.write_text(json.dumps(parent or PARENT_SCRIPT))
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "A2A_MODEL_SCRIPT": str(script),
        "A2A_MODEL_BASE_URL": "",
        "A2A_MODEL_API_KEY": "",
        "OPENAI_BASE_URL": "",
        "OPENAI_API_KEY": "",
        "A2A_AGENT_CODER_URL": role_url,
        "A2A_AUTH_TOKEN": token,
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "a2a_orchestrator.cli",
            "serve",
            "orchestrator",
            "--port",
            "0",
            "--store",
            store,
            "--lease",
            str(LEASE),
            "--db",
            str(tmp_path / f"tasks-{name}.db"),
            "--workdir",
            str(workdir),
            "--no-sandbox",
        ],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        lines = []
        match = None
        while match is None and process.poll() is None and len(lines) < 20:
            lines.append(process.stdout.readline())
            match = re.search(r"serving A2A at (http://\S+)", lines[-1])
        assert match, "".join(lines) + (process.stderr.read() if process.poll() is not None else "")
        # Drained, so a chatty replica never blocks on a full pipe.
        for stream in (process.stdout, process.stderr):
            threading.Thread(target=stream.read, daemon=True).start()
        yield process, match.group(1)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


async def test_the_store_on_postgresql_migrates_once_and_holds_leases(postgres: Postgres) -> None:
    url = postgres.url(postgres.database())
    # Two replicas starting at once: the advisory lock applies each migration once.
    a, b = PgStore(url), PgStore(url)
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.list_sessions)
        tg.start_soon(b.list_sessions)
    try:
        await a.create_session("s1", metadata={"owner": "x"})
        await a.set_session_metadata("s1", "k", [1])
        assert (await b.get_session("s1"))["metadata"] == {"owner": "x", "k": [1]}  # type: ignore[index]
        first = await a.append_event("s1", "note", {"n": 1}, uuid="u1")
        again = await b.append_event("s1", "note", {"n": 1}, uuid="u1")
        assert first is not None and again is None
        assert [e.uuid for e in await b.events("s1")] == ["u1"]
        # One live lease per session: the second replica is told who holds it.
        assert (await a.leases.claim("s1", "A", 30, url="http://a")).holder == "A"
        held = await b.leases.claim("s1", "B", 30, url="http://b")
        assert (held.holder, held.url) == ("A", "http://a")
        await a.leases.give_back("s1", "A", hand_off=True)
        assert [lease.key for lease in await b.leases.expired("B")] == ["s1"]
        assert (await b.leases.claim("s1", "B", 30, url="http://b")).holder == "B"
        assert await a.leases.renew("A", ["s1"], 30) == set()
    finally:
        a.close()
        b.close()


async def test_a_killed_replicas_session_is_taken_over_and_every_result_delivered_once(
    tmp_path: Path, postgres: Postgres
) -> None:
    url = postgres.url(postgres.database())
    store = PgStore(url)
    (tmp_path / "role").mkdir()
    with anyio.fail_after(90):
        async with role_server(tmp_path / "role", child_script, db=tmp_path / "role.db") as server:
            with (
                replica(tmp_path, "a", url, server.url) as (process_a, url_a),
                replica(tmp_path, "b", url, server.url) as (process_b, _),
            ):
                request = user_message("fan out")
                request.message.metadata.update({MODE_KEY: "delegate"})

                async def send_to_a() -> None:
                    # The stream breaks when replica A dies; that is the point.
                    try:
                        async with a2a_client(url_a) as client:
                            await collect(client, request)
                    except Exception:
                        pass

                async with anyio.create_task_group() as tg:
                    tg.start_soon(send_to_a)
                    with anyio.fail_after(30):
                        while True:
                            children = await store.list_children()
                            if len(children) == len(CHILDREN) and all(
                                c.a2a_task_id for c in children
                            ):
                                break
                            await anyio.sleep(0.1)
                    session_id = children[0].session_id
                    lease = await store.leases.get(session_id)
                    assert lease is not None and lease.url == url_a

                    process_a.send_signal(signal.SIGKILL)
                    await anyio.to_thread.run_sync(process_a.wait)
                    # Mid-turn at the kill: nothing of the children is finished yet.
                    assert {c.status for c in await store.list_children()} == {"running"}

                    with anyio.fail_after(LEASE * 3 + 20):
                        while {c.status for c in await store.list_children()} != {"completed"}:
                            await anyio.sleep(0.1)
                    tg.cancel_scope.cancel()

                runner = await store.get_runner(session_id)
                children = await store.list_children(session_id=session_id)
                events = await store.events(session_id)
                assert process_b.poll() is None
    store.close()
    # Replica B ran the session last: it took it over.
    assert runner is not None and runner.pid == process_b.pid
    assert sorted(c.result for c in children) == [f"done: {n}" for n in CHILDREN]
    # Every child's result is stored exactly once: no duplicate, none missing.
    for child in children:
        kinds = [e.kind for e in events if e.child_id == child.child_id]
        assert kinds.count("done") == 1, (child.child_id, kinds)
        assert kinds.count("started") == 1, (child.child_id, kinds)
    uuids = [e.uuid for e in events]
    assert len(uuids) == len(set(uuids))


TOKEN = "forwarding-test-token"

# The first turn spawns a slow child and ends; the session stays open on its
# replica (its lease held) while the child works. The second is the follow-up's.
FORWARDED_SCRIPT = [
    {
        "tool_calls": [
            {"name": "agent", "arguments": {"agents": [{"role": "coder", "prompt": "work on x"}]}}
        ]
    },
    {"text": "Spawned."},
    {"text": "Second turn, on the session's replica."},
]


async def test_a_follow_up_sent_to_the_other_replica_is_forwarded_to_the_sessions_owner(
    tmp_path: Path, postgres: Postgres
) -> None:
    url = postgres.url(postgres.database())
    store = PgStore(url)
    (tmp_path / "role").mkdir()
    with anyio.fail_after(60):
        async with role_server(tmp_path / "role", child_script, db=tmp_path / "role.db") as server:
            with (
                replica(tmp_path, "a", url, server.url, FORWARDED_SCRIPT, TOKEN) as (
                    process_a,
                    url_a,
                ),
                replica(tmp_path, "b", url, server.url, FORWARDED_SCRIPT, TOKEN) as (_, url_b),
            ):
                request = user_message("spawn one")
                request.message.metadata.update({MODE_KEY: "delegate"})
                async with a2a_client(url_a, token=TOKEN) as client:
                    responses, first = await collect(client, request)
                session_id = responses[0].task.context_id
                held = await store.leases.get(session_id)
                # A stock a2a-sdk client (SSE) talks to replica B only; its
                # credential goes on with the request (A checks it again).
                follow_up = user_message("and now?", context_id=session_id)
                follow_up.message.metadata.update({MODE_KEY: "delegate"})
                async with a2a_client(url_b, token=TOKEN) as client:
                    _, events = await collect(client, follow_up)
                runner = await store.get_runner(session_id)
    store.close()
    assert isinstance(first[-1], Done) and first[-1].text == "Spawned."
    # The session was replica A's (the child still ran) when B got the follow-up.
    assert held is not None and held.live and held.url == url_a
    assert isinstance(events[-1], Done), events[-1]
    assert events[-1].text == "Second turn, on the session's replica."
    assert runner is not None and runner.pid == process_a.pid
