"""docker-compose.yaml and the Dockerfile agree with the network in agents/.

No Docker here: the files are read as data and checked against the agent
files, so a new agent file without its service, or a port changed in one place
only, fails the suite.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.deploy import AGENTS, ROOT, command_of, environment, flag, interpolate
from support.servers import CARD_PATH

from a2a_orchestrator.delegation.network import Network, override_var

COMPOSE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
ORCHESTRATOR = "orchestrator"
ORCHESTRATOR_PORT = 9100


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services `docker compose up` starts: those of no profile (the
    `scale` profile's are checked by tests/project/test_deploy.py)."""
    found = compose["services"]
    assert isinstance(found, dict)
    return {name: service for name, service in found.items() if not service.get("profiles")}


def expected_port(name: str) -> int:
    if name == ORCHESTRATOR:
        return ORCHESTRATOR_PORT
    port = AGENTS[name].port
    assert port is not None, f"agents/{name}.toml has no port"
    return port


def volume_mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source for the service's volumes, short or long syntax."""
    mounts: dict[str, str] = {}
    for entry in service.get("volumes", []):
        if isinstance(entry, str):
            source, _, rest = entry.partition(":")
            mounts[rest.split(":")[0]] = source
        else:
            mounts[entry["target"]] = entry.get("source", "")
    return mounts


ALL_SERVICES = [*sorted(AGENTS), ORCHESTRATOR]


# --- the services ---------------------------------------------------------------


def test_the_shipped_agents_are_all_there() -> None:
    assert sorted(AGENTS) == ["architect", "coder", "observer", "reviewer"]


def test_every_agent_has_a_service_of_its_name(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {*AGENTS, ORCHESTRATOR}


@pytest.mark.parametrize("name", ALL_SERVICES)
def test_service_builds_the_one_dockerfile(services: dict[str, dict[str, Any]], name: str) -> None:
    build = services[name]["build"]
    if isinstance(build, dict):
        assert build.get("context", ".") == "."
        assert build.get("dockerfile", "Dockerfile") == "Dockerfile"
    else:
        assert build == "."


@pytest.mark.parametrize("name", ALL_SERVICES)
def test_service_serves_its_role_on_its_port(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    service = services[name]
    command = command_of(service)
    port = expected_port(name)
    role = name if name == ORCHESTRATOR else AGENTS[name].role
    assert command[:2] == ["serve", role]
    assert flag(command, "--host") == "0.0.0.0"
    assert flag(command, "--port") == str(port)
    if name == ORCHESTRATOR:
        # Called from outside the compose network: the card names a host URL,
        # and its store (beside its hooks and reactions) is on its own volume.
        assert flag(command, "--public-url") == "${A2A_PUBLIC_URL:-http://127.0.0.1:9100}"
        assert flag(command, "--store") == "/data/orchestrator.db"
    else:
        assert flag(command, "--public-url") == f"http://{name}:{port}"
    assert flag(command, "--workdir") == "/work"


@pytest.mark.parametrize("name", ALL_SERVICES)
def test_healthcheck_fetches_its_own_card(services: dict[str, dict[str, Any]], name: str) -> None:
    check = services[name]["healthcheck"]
    test = check["test"]
    assert isinstance(test, list) and test[0] in {"CMD", "CMD-SHELL"}
    text = " ".join(test[1:])
    port = expected_port(name)
    assert f"http://127.0.0.1:{port}{CARD_PATH}" in text
    # Only its own port: a copy-pasted check would watch another service.
    assert set(re.findall(r":(\d{4,5})/", text)) == {str(port)}
    assert "curl" not in text  # python:3.11-slim has no curl
    for key in ("interval", "timeout", "retries", "start_period"):
        assert key in check, f"{name}: healthcheck has no {key}"


def test_healthcheck_command_is_valid_python(services: dict[str, dict[str, Any]]) -> None:
    for name in ALL_SERVICES:
        test = services[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"]
        compile(test[3], f"{name} healthcheck", "exec")


@pytest.mark.parametrize("name", ALL_SERVICES)
def test_task_store_lives_on_its_own_data_volume(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    service = services[name]
    mounts = volume_mounts(service)
    assert "/data" in mounts
    assert mounts["/data"] == f"{name}-data"
    assert flag(command_of(service), "--db").startswith("/data/")
    # All roles work on the same project files.
    assert mounts["/work"] == "work"


def test_data_volumes_are_not_shared(services: dict[str, dict[str, Any]]) -> None:
    sources = [volume_mounts(services[name])["/data"] for name in ALL_SERVICES]
    assert len(set(sources)) == len(sources)


@pytest.mark.parametrize("name", ALL_SERVICES)
def test_model_and_token_come_from_the_host(services: dict[str, dict[str, Any]], name: str) -> None:
    env = environment(services[name])
    for var in (
        "A2A_MODEL_BASE_URL",
        "A2A_MODEL_API_KEY",
        "A2A_MODEL_DEFAULT",
        "A2A_MODEL_MINI",
        "A2A_MODEL_TIMEOUT",
        "A2A_MODEL_RETRIES",
    ):
        assert env.get(var) == f"${{{var}:-}}", f"{name}: {var}"
    # Required, not defaulted: compose refuses to start without a token.
    assert env["A2A_AUTH_TOKEN"].startswith("${A2A_AUTH_TOKEN:?")


@pytest.mark.parametrize("name", ALL_SERVICES)
def test_no_service_starts_without_a_token(services: dict[str, dict[str, Any]], name: str) -> None:
    token = environment(services[name])["A2A_AUTH_TOKEN"]
    with pytest.raises(ValueError, match="A2A_AUTH_TOKEN"):
        interpolate(token, {})
    with pytest.raises(ValueError, match="A2A_AUTH_TOKEN"):
        interpolate(token, {"A2A_AUTH_TOKEN": ""})
    assert interpolate(token, {"A2A_AUTH_TOKEN": "s3cret"}) == "s3cret"


def test_only_the_orchestrator_is_published_on_loopback(
    services: dict[str, dict[str, Any]],
) -> None:
    # Role servers run shell commands for their callers: only the
    # orchestrator reaches them, over the compose network.
    for name in AGENTS:
        assert "ports" not in services[name], f"{name} is published"
    (published,) = services[ORCHESTRATOR]["ports"]
    assert interpolate(published, {}) == f"127.0.0.1:{ORCHESTRATOR_PORT}:{ORCHESTRATOR_PORT}"
    assert (
        interpolate(published, {"A2A_BIND": "0.0.0.0"})
        == f"0.0.0.0:{ORCHESTRATOR_PORT}:{ORCHESTRATOR_PORT}"
    )


@pytest.mark.parametrize("name", ALL_SERVICES)
def test_the_sandbox_opt_out_is_explicit(services: dict[str, dict[str, Any]], name: str) -> None:
    # Docker's default profiles keep bubblewrap from making namespaces; the
    # file says so and opts out on purpose rather than loosening them.
    env = environment(services[name])
    assert interpolate(env["A2A_SANDBOX"], {}) == "off"
    assert interpolate(env["A2A_SANDBOX"], {"A2A_SANDBOX": "on"}) == "on"
    assert "security_opt" not in services[name]
    assert "privileged" not in services[name]


@pytest.mark.parametrize("name", ALL_SERVICES)
def test_the_card_protocol_comes_from_the_host(
    services: dict[str, dict[str, Any]], name: str
) -> None:
    # serve --protocol's variable: unset keeps 1.0 and 0.3 on the cards.
    env = environment(services[name])
    assert interpolate(env["A2A_PROTOCOL"], {}) == ""
    assert interpolate(env["A2A_PROTOCOL"], {"A2A_PROTOCOL": "1.0"}) == "1.0"


def test_orchestrator_reaches_every_agent_remotely(services: dict[str, dict[str, Any]]) -> None:
    env = environment(services[ORCHESTRATOR])
    for name, spec in AGENTS.items():
        assert env[override_var(name, "URL")] == f"http://{name}:{spec.port}"
        assert env[override_var(name, "TOKEN_ENV")] == "A2A_AUTH_TOKEN"


def test_orchestrator_overrides_load_as_remote_agents(
    services: dict[str, dict[str, Any]],
) -> None:
    """The orchestrator's environment, fed to the real loader, makes every agent remote."""
    env = environment(services[ORCHESTRATOR])
    network = Network.load(cwd=ROOT, home=ROOT / "no-such-home", environ=env)
    for name, spec in AGENTS.items():
        loaded = network.agents[name]
        assert loaded.url == f"http://{name}:{spec.port}"
        assert loaded.token_env == "A2A_AUTH_TOKEN"


def test_orchestrator_waits_for_every_agent_to_be_healthy(
    services: dict[str, dict[str, Any]],
) -> None:
    depends_on = services[ORCHESTRATOR]["depends_on"]
    assert isinstance(depends_on, dict)
    assert set(depends_on) == set(AGENTS)
    for name in AGENTS:
        assert depends_on[name] == {"condition": "service_healthy"}


def test_role_services_do_not_depend_on_the_orchestrator(
    services: dict[str, dict[str, Any]],
) -> None:
    for name in AGENTS:
        assert ORCHESTRATOR not in services[name].get("depends_on", {})


def test_named_volumes_are_declared(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    declared = set(compose.get("volumes") or {})
    used = {
        source
        for service in services.values()
        for source in volume_mounts(service).values()
        if source and not source.startswith((".", "/", "~"))
    }
    assert used
    assert used <= declared
    assert "work" in declared


# --- the Dockerfile -----------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, comments dropped, continuations joined."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    instructions = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_dockerfile_runs_the_cli_as_a_non_root_user() -> None:
    instructions = dockerfile_instructions()
    keywords = [keyword for keyword, _ in instructions]
    assert instructions[0] == ("FROM", "python:3.11-slim")
    assert ("ENTRYPOINT", '["a2a-orchestrator"]') in instructions
    cmd = [rest for keyword, rest in instructions if keyword == "CMD"]
    assert cmd == ['["serve", "orchestrator", "--host", "0.0.0.0"]']
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users and users[-1] not in {"root", "0"}
    # The user is switched after the install (pip needs root) and before the entrypoint.
    assert keywords.index("USER") > max(i for i, k in enumerate(keywords) if k == "RUN")
    workdirs = [rest for keyword, rest in instructions if keyword == "WORKDIR"]
    assert workdirs[-1] == "/work"
    assert "HEALTHCHECK" not in keywords


def test_dockerfile_installs_bubblewrap() -> None:
    runs = [rest for keyword, rest in dockerfile_instructions() if keyword == "RUN"]
    assert any("apt-get install" in run and "bubblewrap" in run for run in runs)


def test_dockerfile_installs_from_the_copied_source() -> None:
    instructions = dockerfile_instructions()
    sources = {
        source.rstrip("/")
        for keyword, rest in instructions
        if keyword == "COPY"
        for source in rest.split()[:-1]
    }
    assert {"pyproject.toml", "README.md", "a2a_orchestrator", "roles", "agents"} <= sources
    runs = [rest for keyword, rest in instructions if keyword == "RUN"]
    assert any("pip install --no-cache-dir ." in run for run in runs)
    # Everything the install reads is copied before it.
    keywords = [keyword for keyword, _ in instructions]
    install = next(
        i
        for i, (keyword, rest) in enumerate(instructions)
        if keyword == "RUN" and "pip install" in rest
    )
    assert max(i for i, k in enumerate(keywords) if k == "COPY") < install


def test_dockerignore_keeps_local_state_out() -> None:
    patterns = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "**/*.db", "**/.a2a", "**/__pycache__"} <= patterns
    # Nothing the image is built from may be ignored.
    for needed in ("pyproject.toml", "README.md", "a2a_orchestrator", "roles", "agents"):
        assert needed not in patterns


def test_servers_do_not_read_configuration_from_the_shared_work_volume() -> None:
    # Lookups read ./roles, ./agents and ./.a2a of the current directory;
    # /work is writable by every role's (unsandboxed) commands.
    compose = yaml.safe_load(COMPOSE.read_text())
    ours = {
        name: service
        for name, service in compose["services"].items()
        if service.get("image") == "a2a-orchestrator:local"  # not PostgreSQL or HAProxy
    }
    assert set(ours) >= {*AGENTS, ORCHESTRATOR}
    for name, service in ours.items():
        assert service.get("working_dir") == "/home/a2a", name
        assert "--workdir" in service["command"], name


# -- compose itself, with only the token set (issue 25) --------------------------------

COMPOSE_COMMANDS = {"v1": ["docker-compose"], "v2": ["docker", "compose"]}


def _compose_command(version: str) -> list[str]:
    command = COMPOSE_COMMANDS[version]
    try:
        found = subprocess.run(
            [*command, "version"], capture_output=True, text=True, timeout=60, check=False
        )
    except FileNotFoundError:
        found = None
    if found is None or found.returncode != 0:
        pytest.skip(f"compose {version} ({' '.join(command)}) is not installed here")
    return command


@pytest.mark.parametrize("version", sorted(COMPOSE_COMMANDS))
def test_compose_config_needs_only_the_token(version: str, tmp_path: Path) -> None:
    """The README's `A2A_AUTH_TOKEN=... docker compose up`: a variable only a
    profile that is off needs must not be required (compose v1 failed on the
    scale profile's password)."""
    command = _compose_command(version)
    clean = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}

    def config(**environ: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, "--file", str(COMPOSE), "config"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
            env={**clean, **environ},
        )

    done = config(A2A_AUTH_TOKEN="s3cret")
    assert done.returncode == 0, done.stderr
    assert "s3cret" in done.stdout
    refused = config()
    assert refused.returncode != 0 and "A2A_AUTH_TOKEN" in refused.stderr


def test_no_profile_service_requires_a_variable(compose: dict[str, Any]) -> None:
    """`${VAR:?}` in a profile's service is required even when the profile is
    off (compose interpolates every service): a profile's secret is checked
    when its service starts instead."""
    required = re.compile(r"\$\{(\w+):\?")
    for name, service in compose["services"].items():
        if service.get("profiles"):
            # The token is required anyway: the default services need it.
            found = set(required.findall(yaml.safe_dump(service))) - {"A2A_AUTH_TOKEN"}
            assert not found, (name, found)


def test_postgres_refuses_to_start_without_its_password(compose: dict[str, Any]) -> None:
    entrypoint = compose["services"]["postgres"]["entrypoint"]
    assert entrypoint[:2] == ["sh", "-c"]
    # As the container's shell gets it: compose turns `$$` into `$`.
    script = entrypoint[2].replace("$$", "$")
    empty = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, timeout=10, env={"PATH": "/bin"}
    )
    assert empty.returncode == 1
    assert "set A2A_POSTGRES_PASSWORD" in empty.stderr
    given = subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=10,
        env={"PATH": "/bin", "POSTGRES_PASSWORD": "pw"},
    )
    # Past the check: on to the image's own entrypoint (not on this machine).
    assert "A2A_POSTGRES_PASSWORD" not in given.stderr
    assert "docker-entrypoint.sh" in given.stderr
