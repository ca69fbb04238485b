"""`a2a-orchestrator up`: the network as local processes, one per agent.

Processes, not tasks in this one: each server is what a container would run,
and stopping one does not stop the others.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx

from ..delegation.network import Network, override_var
from ..errors import OrchestratorError
from .commands.common import say, workdir_of

__all__ = ["up"]


def up(args: argparse.Namespace) -> int:
    """Start the network; block until Ctrl-C or SIGTERM, then stop it all."""
    workdir = workdir_of(args.workdir)
    network = Network.load()
    local = [spec for spec in network.agents.values() if not spec.remote]
    missing = [spec.name for spec in local if spec.port is None]
    if missing:
        raise OrchestratorError(f"agents without a port cannot be started by `up`: {missing}")
    cli = [sys.executable, "-m", "a2a_orchestrator.cli"]
    # Every server gets the operator's sandbox choice (the A2A_SANDBOX*
    # variables reach them through the inherited environment).
    sandbox_flags = [
        *(["--no-sandbox"] if args.no_sandbox else []),
        *(["--allow-network"] if args.allow_network else []),
    ]
    processes: list[tuple[str, subprocess.Popen[bytes]]] = []
    env = dict(os.environ)
    try:
        for spec in local:
            command = [
                *cli,
                "serve",
                spec.role,
                "--port",
                str(spec.port),
                "--workdir",
                str(workdir),
                *sandbox_flags,
            ]
            processes.append((spec.name, subprocess.Popen(command, stdout=subprocess.DEVNULL)))
            env[override_var(spec.name, "URL")] = f"http://127.0.0.1:{spec.port}"
            # The roles take the same token the orchestrator is given.
            env[override_var(spec.name, "TOKEN_ENV")] = "A2A_AUTH_TOKEN"
        for spec in local:
            _wait_for_card(f"http://127.0.0.1:{spec.port}", processes)
            say(f"  {spec.name:<12} http://127.0.0.1:{spec.port}")
        orchestrator = [
            *cli,
            "serve",
            "orchestrator",
            "--port",
            str(args.port),
            "--workdir",
            str(workdir),
            *sandbox_flags,
        ]
        processes.append(
            ("orchestrator", subprocess.Popen(orchestrator, env=env, stdout=subprocess.DEVNULL))
        )
        _wait_for_card(f"http://127.0.0.1:{args.port}", processes)
        say(f"  {'orchestrator':<12} http://127.0.0.1:{args.port}  (control API /api/sessions)")
        say(f"  {'web view':<12} http://127.0.0.1:{args.port}/ui")
        say("network up; Ctrl-C stops it")
        stop = {"now": False}

        def handle(signum: int, frame: Any) -> None:
            stop["now"] = True

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)
        while not stop["now"]:
            for name, process in processes:
                if process.poll() is not None:
                    raise OrchestratorError(f"{name} exited with {process.returncode}")
            time.sleep(0.2)
        return 0
    finally:
        for _name, process in processes:
            if process.poll() is None:
                process.terminate()
        for name, process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                say(f"  {name} did not stop in time; killed")
        say("network stopped")


def _wait_for_card(url: str, processes: list[tuple[str, subprocess.Popen[bytes]]]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for name, process in processes:
            if process.poll() is not None:
                raise OrchestratorError(f"{name} exited with {process.returncode} while starting")
        try:
            if httpx.get(url + "/.well-known/agent-card.json", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise OrchestratorError(f"no agent card at {url} after 30 s")
