"""The deployment artifacts: the compose `scale` profile, deploy/haproxy.cfg
and the Kubernetes manifests in deploy/kubernetes/.

The manifests are checked against the Kubernetes schemas that
kubernetes-validate ships (offline, no cluster). HAProxy is Debian's, run for
real in front of three role servers on 127.0.0.1; its tests skip, naming the
package, where it is not installed. No Docker here: the compose file is read
as data, like tests/project/test_compose.py does.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import kubernetes_validate
import pytest
import yaml
from anyio.abc import TaskStatus
from support.deploy import (
    AGENTS,
    HAPROXY,
    HAPROXY_CFG,
    REPLICAS,
    ROOT,
    command_of,
    environment,
    flag,
    haproxy,
    interpolate,
    local_config,
    needs_haproxy,
    sections,
    show_stat,
    wait_for_states,
)
from support.ports import free_port
from support.servers import CARD_PATH

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network, override_var
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.events import Done, ToolCalled
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import RunningServer, run_role_server
from a2a_orchestrator.storage.store import Store

COMPOSE = ROOT / "docker-compose.yaml"
KUBERNETES = ROOT / "deploy" / "kubernetes"
# The oldest Kubernetes the manifests are written for, and the newest
# kubernetes-validate knows: both must accept them.
KUBERNETES_VERSIONS = ["1.30.0", kubernetes_validate.utils.latest_version()]
BALANCER = "coder-lb"
CODER_PORT = 9102


# --- the compose `scale` profile ----------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def scale(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services the `scale` profile adds."""
    return {
        name: service
        for name, service in compose["services"].items()
        if "scale" in service.get("profiles", [])
    }


def test_the_scale_profile_adds_replicas_a_balancer_postgres_and_an_orchestrator(
    compose: dict[str, Any], scale: dict[str, dict[str, Any]]
) -> None:
    assert set(scale) == {"postgres", *REPLICAS, BALANCER, "orchestrator-scale"}
    # Only the profile's own services have profiles: `docker compose up` is unchanged.
    for name, service in compose["services"].items():
        assert service.get("profiles", ["scale"]) == ["scale"], name
    assert scale["postgres"]["image"].split(":")[0] == "postgres"
    assert scale[BALANCER]["image"].split(":")[0] == "haproxy"


@pytest.mark.parametrize("name", REPLICAS)
def test_replicas_share_one_postgres_task_store_and_advertise_the_balancer(
    scale: dict[str, dict[str, Any]], name: str
) -> None:
    command = command_of(scale[name])
    assert command[:2] == ["serve", "coder"]
    assert flag(command, "--host") == "0.0.0.0"
    assert flag(command, "--port") == str(CODER_PORT)
    # A client that read the card calls the balancer, never one replica.
    assert flag(command, "--public-url") == f"http://{BALANCER}:{CODER_PORT}"
    url = interpolate(flag(command, "--db"), {"A2A_POSTGRES_PASSWORD": "pw"})
    assert url == "postgresql+asyncpg://a2a:pw@postgres:5432/a2a_coder"
    assert flag(command, "--workdir") == "/work"
    mounts = [volume.split(":")[1] for volume in scale[name]["volumes"]]
    assert mounts == ["/work"]  # no /data: the store is PostgreSQL
    assert scale[name]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    test = scale[name]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    assert f"http://127.0.0.1:{CODER_PORT}{CARD_PATH}" in test[3]


def test_the_balancer_runs_deploy_haproxy_cfg_over_exactly_the_replicas(
    scale: dict[str, dict[str, Any]],
) -> None:
    balancer = scale[BALANCER]
    assert "./deploy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in balancer["volumes"]
    servers = [line.split()[1:3] for line in backend_lines("server")]
    assert servers == [[name, f"{name}:{CODER_PORT}"] for name in REPLICAS]
    assert balancer["depends_on"] == {name: {"condition": "service_healthy"} for name in REPLICAS}
    # Healthy while a replica answers for its card through the balancer.
    check = " ".join(balancer["healthcheck"]["test"])
    assert f"/dev/tcp/127.0.0.1/{CODER_PORT}" in check and CARD_PATH in check


def test_the_scaled_orchestrator_calls_the_balancer_and_stores_in_postgres(
    scale: dict[str, dict[str, Any]],
) -> None:
    service = scale["orchestrator-scale"]
    command = command_of(service)
    assert command[:2] == ["serve", "orchestrator"]
    url = interpolate(flag(command, "--store"), {"A2A_POSTGRES_PASSWORD": "pw"})
    assert url == "postgresql://a2a:pw@postgres:5432/a2a_orchestrator"
    env = environment(service)
    network = Network.load(cwd=ROOT, home=ROOT / "no-such-home", environ=env)
    for name, spec in AGENTS.items():
        expected = (
            f"http://{BALANCER}:{CODER_PORT}" if name == "coder" else f"http://{name}:{spec.port}"
        )
        assert network.agents[name].url == expected, name
        assert network.agents[name].token_env == "A2A_AUTH_TOKEN"
    assert set(service["depends_on"]) == {"postgres", BALANCER, *(set(AGENTS) - {"coder"})}
    assert all(dep == {"condition": "service_healthy"} for dep in service["depends_on"].values())


def test_every_scale_service_has_a_healthcheck_and_restarts(
    scale: dict[str, dict[str, Any]],
) -> None:
    for name, service in scale.items():
        assert service.get("restart") == "unless-stopped", name
        check = service["healthcheck"]
        for key in ("test", "interval", "timeout", "retries", "start_period"):
            assert key in check, f"{name}: healthcheck has no {key}"


def test_only_the_scaled_orchestrator_is_published_on_loopback(
    scale: dict[str, dict[str, Any]],
) -> None:
    for name, service in scale.items():
        if name != "orchestrator-scale":
            assert "ports" not in service, f"{name} is published"
    (published,) = scale["orchestrator-scale"]["ports"]
    assert interpolate(published, {}) == "127.0.0.1:9200:9100"


def test_the_token_and_the_postgres_password_are_required(
    scale: dict[str, dict[str, Any]],
) -> None:
    # The password is not required by compose (a profile that is off would
    # need it too): postgres refuses to start without it, and everything
    # that uses it waits for postgres to be healthy
    # (tests/project/test_compose.py runs that refusal).
    password = scale["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert interpolate(password, {"A2A_POSTGRES_PASSWORD": "s3cret"}) == "s3cret"
    assert "A2A_POSTGRES_PASSWORD" in scale["postgres"]["entrypoint"][-1]
    for name in [*REPLICAS, "orchestrator-scale"]:
        with pytest.raises(ValueError, match="A2A_AUTH_TOKEN"):
            interpolate(environment(scale[name])["A2A_AUTH_TOKEN"], {})
        for part in command_of(scale[name]):
            if "postgres" in part and "://" in part:
                assert ":pw@" in interpolate(part, {"A2A_POSTGRES_PASSWORD": "pw"})
        assert scale[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}
        assert interpolate(environment(scale[name])["A2A_SANDBOX"], {}) == "off"
    assert "pg_isready" in scale["postgres"]["healthcheck"]["test"]


def test_postgres_creates_the_databases_the_urls_name(scale: dict[str, dict[str, Any]]) -> None:
    mounts = dict(volume.rsplit(":", 2)[:2][::-1] for volume in scale["postgres"]["volumes"])
    script = mounts["/docker-entrypoint-initdb.d/10-a2a.sql"]
    created = re.findall(r"CREATE DATABASE (\w+);", (ROOT / script).read_text(encoding="utf-8"))
    named = {
        part.rsplit("/", 1)[1]
        for name in [*REPLICAS, "orchestrator-scale"]
        for part in command_of(scale[name])
        if part.startswith("postgres")
    }
    assert named == set(created) == {"a2a_coder", "a2a_orchestrator"}


def compose_command() -> list[str] | None:
    """Docker's Compose plugin, else Debian's `docker-compose` (both check a
    file with `config` without a Docker daemon)."""
    docker = shutil.which("docker")
    if docker is not None and not (
        subprocess.run([docker, "compose", "version"], capture_output=True).returncode
    ):
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy is not None else None


def test_docker_compose_accepts_the_scale_profile() -> None:
    """`docker compose config` on the scale profile."""
    compose = compose_command()
    if compose is None:
        pytest.skip("needs Docker Compose (Debian package docker-compose)")
    env = {"PATH": "/usr/bin:/bin", "A2A_AUTH_TOKEN": "t", "A2A_POSTGRES_PASSWORD": "p"}
    done = subprocess.run(
        [*compose, "--profile", "scale", "config", "--quiet"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


# --- deploy/haproxy.cfg ---------------------------------------------------------------


def backend_lines(keyword: str) -> list[str]:
    (body,) = [
        body
        for header, body in sections(HAPROXY_CFG.read_text(encoding="utf-8"))
        if header.startswith("backend ")
    ]
    return [line for line in body if line.split()[0] == keyword]


def haproxy_check(path: Path) -> subprocess.CompletedProcess[str]:
    assert HAPROXY is not None
    return subprocess.run([HAPROXY, "-c", "-f", str(path)], capture_output=True, text=True)


@needs_haproxy
def test_haproxy_accepts_the_shipped_config() -> None:
    done = haproxy_check(HAPROXY_CFG)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_haproxy
def test_haproxy_accepts_the_local_config(tmp_path: Path) -> None:
    config = tmp_path / "haproxy.cfg"
    config.write_text(local_config(9, {"a": 1, "b": 2, "c": 3}, tmp_path / "stats.sock"))
    done = haproxy_check(config)
    assert done.returncode == 0, done.stdout + done.stderr


def test_haproxy_config_is_stream_friendly() -> None:
    text = HAPROXY_CFG.read_text(encoding="utf-8")
    (defaults,) = [body for header, body in sections(text) if header == "defaults"]
    settings = {" ".join(line.split()[:-1]): line.split()[-1] for line in defaults}
    assert settings["mode"] == "http"
    for timeout in ("timeout tunnel", "timeout client", "timeout server"):
        # An A2A stream is quiet while a command runs (SSE pings every 15 s).
        assert settings[timeout] in {"1h", "30m", "5m"}, timeout
    assert settings["option"] == "redispatch" or "option redispatch" in defaults
    # Nothing that holds a response back until it is complete.
    for line in (line for _, body in sections(text) for line in body):
        assert not line.startswith(("compression", "option http-buffer-request")), line
    checks = backend_lines("http-check")
    assert f"http-check send meth GET uri {CARD_PATH}" in checks
    assert "http-check expect status 200" in checks
    assert "check" in backend_lines("default-server")[0].split()


# --- HAProxy in front of three real role servers ------------------------------------


async def serve_replica(
    workdir: Path,
    db: Path,
    public_url: str,
    token: str,
    stop: anyio.Event,
    *,
    task_status: TaskStatus[RunningServer] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """One coder replica (scripted model, the only fake) until `stop` is set.

    Each runs in its own task so any one can stop while the others serve."""

    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if not any(message["role"] == "tool" for message in messages):
            # Ends only once the caller has seen this call's event: a
            # balancer that held the stream back until the turn ended would
            # leave it waiting forever.
            command = "while [ ! -e go ]; do sleep 0.05; done; echo went"
            return {
                "text": "Waiting.",
                "tool_calls": [{"name": "run_command", "arguments": {"command": command}}],
            }
        return {"text": "Went.\nTASK_DONE"}

    async with run_role_server(
        find_role("coder"),
        ScriptedModel(script),
        workdir,
        db=str(db),
        token=token,
        public_url=public_url,
    ) as server:
        task_status.started(server)
        await stop.wait()


async def answered(stats: Path) -> dict[str, int]:
    """How many 2xx responses each server gave (health checks not counted)."""
    return {row["svname"]: int(row["hrsp_2xx"] or 0) for row in await show_stat(stats)}


@asynccontextmanager
async def balanced_replicas(
    tmp_path: Path, token: str
) -> AsyncIterator[tuple[str, Path, list[RunningServer], list[anyio.Event]]]:
    """Three coder servers behind HAProxy: (balancer URL, admin socket, servers, stop events)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    work = tmp_path / "work"  # shared, like the compose file's `work` volume
    work.mkdir()
    stops = [anyio.Event() for _ in REPLICAS]
    async with anyio.create_task_group() as tg:
        servers: list[RunningServer] = []
        for name, stop in zip(REPLICAS, stops, strict=True):
            # Separate SQLite stores: only stateless requests spread here
            # (sharing one PostgreSQL store is the replicas' own tests').
            db = tmp_path / f"{name}.db"
            servers.append(await tg.start(serve_replica, work, db, url, token, stop))
        stats = tmp_path / "stats.sock"
        config = tmp_path / "haproxy.cfg"
        config.write_text(
            local_config(port, {n: s.port for n, s in zip(REPLICAS, servers, strict=True)}, stats)
        )
        with haproxy(config, tmp_path / "haproxy.log"):
            await wait_for_states(stats, dict.fromkeys(REPLICAS, "UP"))
            try:
                yield url, stats, servers, stops
            finally:
                for stop in stops:
                    stop.set()


async def delegate_through(url: str, work: Path, tmp_path: Path) -> tuple[list[str], Done]:
    """The orchestrator's remote transport delegates to the coder at `url`;
    the child's events as they arrive, and its result."""
    network = Network.of(AgentSpec(name="coder", role="coder", url=url, token_env="CODER_TOKEN"))
    kinds: list[str] = []
    async with Session(
        Store(tmp_path / "orchestrator.db"), workdir=work, network=network
    ) as session:
        handle = await session.spawn(ChildConfig(role="coder", prompt="wait for go"))
        async for event in handle.events():
            kinds.append(event.kind)
            if isinstance(event, ToolCalled):
                # Seen while the command still runs: the stream is not buffered.
                (work / "go").touch()
        result = await handle.result()
    assert isinstance(result, Done), result
    return [kind for kind in kinds if kind != "message_delta"], result


@needs_haproxy
@pytest.mark.anyio
async def test_haproxy_spreads_cards_and_streams_a_delegation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "balanced-" + "x" * 24
    monkeypatch.setenv("CODER_TOKEN", token)
    with anyio.fail_after(45):
        async with balanced_replicas(tmp_path, token) as (url, stats, _, _):
            async with httpx.AsyncClient(timeout=10) as http:
                cards = [(await http.get(url + CARD_PATH)) for _ in range(9)]
            assert all(card.status_code == 200 for card in cards)
            # Every replica advertises the balancer, so clients stay on it.
            assert {card.json()["supportedInterfaces"][0]["url"] for card in cards} == {url}
            # ... and each replica answered some of them.
            served = await answered(stats)
            assert set(served) == set(REPLICAS) and all(n >= 1 for n in served.values()), served
            kinds, result = await delegate_through(url, tmp_path / "work", tmp_path)
    assert kinds[0] == "started" and "tool_called" in kinds and kinds[-1] == "done"
    assert result.text.endswith("TASK_DONE")


@needs_haproxy
@pytest.mark.anyio
async def test_a_stopped_replica_is_taken_out_and_requests_still_succeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "balanced-" + "y" * 24
    monkeypatch.setenv("CODER_TOKEN", token)
    with anyio.fail_after(50):
        async with balanced_replicas(tmp_path, token) as (url, stats, servers, stops):
            stops[1].set()
            await servers[1].stopped.wait()
            # The agent-card health check marks it down (fall 2, inter 2s).
            await wait_for_states(stats, {"coder-1": "UP", "coder-2": "DOWN", "coder-3": "UP"})
            before = await answered(stats)
            async with httpx.AsyncClient(timeout=10) as http:
                cards = [(await http.get(url + CARD_PATH)) for _ in range(6)]
            assert [card.status_code for card in cards] == [200] * 6
            kinds, _ = await delegate_through(url, tmp_path / "work", tmp_path)
            after = await answered(stats)
    assert kinds[-1] == "done"
    # The stopped replica got none of them; the two others shared them.
    assert after["coder-2"] == before["coder-2"]
    assert after["coder-1"] > before["coder-1"] and after["coder-3"] > before["coder-3"]


# --- the Kubernetes manifests -----------------------------------------------------------


def kustomization() -> dict[str, Any]:
    data = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def manifests() -> list[dict[str, Any]]:
    """Every resource kustomization.yaml applies."""
    found = []
    for name in kustomization()["resources"]:
        text = (KUBERNETES / name).read_text(encoding="utf-8")
        found.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return found


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in manifests() if doc["kind"] == kind}


COMPONENTS = [*sorted(AGENTS), "orchestrator"]


def test_the_kustomization_applies_every_manifest_file() -> None:
    files = {path.name for path in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization()["resources"]) == sorted(files)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(version: str) -> None:
    resources = manifests()
    assert resources
    for resource in resources:
        # Strict: an unknown (e.g. misspelt) field is an error, not ignored.
        kubernetes_validate.validate(resource, version, strict=True)


def test_the_validator_rejects_a_misspelt_field() -> None:
    """The check above can fail: a probe under a wrong name is refused."""
    deployment = of_kind("Deployment")["coder"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinessprobe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinessprobe"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def container_of(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def port_of(name: str) -> int:
    if name == "orchestrator":
        return 9100
    port = AGENTS[name].port
    assert port is not None
    return port


def test_one_deployment_service_and_budget_per_role_and_the_orchestrator() -> None:
    assert sorted(of_kind("Deployment")) == sorted(COMPONENTS)
    assert sorted(of_kind("Service")) == sorted(COMPONENTS)
    assert sorted(of_kind("PodDisruptionBudget")) == sorted(COMPONENTS)
    for name, deployment in of_kind("Deployment").items():
        assert deployment["spec"]["replicas"] >= 2, name
    assert of_kind("Deployment")["coder"]["spec"]["replicas"] >= 3


@pytest.mark.parametrize("name", COMPONENTS)
def test_the_service_selects_the_deployments_pods_on_its_port(name: str) -> None:
    deployment = of_kind("Deployment")[name]
    service = of_kind("Service")[name]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    # No other Deployment's pods match this Service.
    for other, found in of_kind("Deployment").items():
        if other != name:
            assert (
                not service["spec"]["selector"].items()
                <= found["spec"]["template"]["metadata"]["labels"].items()
            )
    (port,) = service["spec"]["ports"]
    assert port["port"] == port_of(name)
    (container_port,) = container_of(deployment)["ports"]
    assert container_port == {"name": port["targetPort"], "containerPort": port_of(name)}
    budget = of_kind("PodDisruptionBudget")[name]
    assert (
        budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    )


@pytest.mark.parametrize("name", COMPONENTS)
def test_the_pod_serves_its_role_with_a_shared_postgres_store(name: str) -> None:
    container = container_of(of_kind("Deployment")[name])
    args = container["args"]
    assert args[:2] == ["serve", name]
    assert flag(args, "--host") == "0.0.0.0"
    assert flag(args, "--port") == str(port_of(name))
    assert flag(args, "--workdir") == "/work"
    assert container["workingDir"] == "/home/a2a"
    env = env_of(container)
    # Kubernetes expands $(VAR) in args from the container's environment:
    # the URLs come from the Secret, never from these files.
    urls = {"--db": "A2A_DB_URL"}
    if name == "orchestrator":
        urls["--store"] = "A2A_STORE_URL"
        assert flag(args, "--public-url") == "$(A2A_PUBLIC_URL)"
    else:
        assert flag(args, "--public-url") == f"http://{name}:{port_of(name)}"
    for option, variable in urls.items():
        assert flag(args, option) == f"$({variable})"
        ref = env[variable]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "a2a-secrets" and not ref.get("optional", False)
    token = env["A2A_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token == {"name": "a2a-secrets", "key": "auth-token"}
    assert container["envFrom"] == [{"configMapRef": {"name": "a2a-config"}}]


def test_each_store_has_its_own_secret_key() -> None:
    keys = [
        item["valueFrom"]["secretKeyRef"]["key"]
        for deployment in of_kind("Deployment").values()
        for item in container_of(deployment).get("env", [])
        if item["name"] in {"A2A_DB_URL", "A2A_STORE_URL"}
    ]
    assert len(keys) == len(set(keys)) == len(COMPONENTS) + 1


@pytest.mark.parametrize("name", COMPONENTS)
def test_probes_fetch_the_agent_card(name: str) -> None:
    container = container_of(of_kind("Deployment")[name])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        check = container[probe]["httpGet"]
        assert check == {"path": CARD_PATH, "port": "http"}, (name, probe)


@pytest.mark.parametrize("name", COMPONENTS)
def test_resources_and_security_context(name: str) -> None:
    pod = of_kind("Deployment")[name]["spec"]["template"]["spec"]
    container = container_of(of_kind("Deployment")[name])
    for bound in ("requests", "limits"):
        assert set(container["resources"][bound]) == {"cpu", "memory"}, (name, bound)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the Dockerfile's user
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # Commands run unsandboxed in the pod: no API token to find there.
    assert pod["automountServiceAccountToken"] is False
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    # What stays writable: the shared project, a home and /tmp of the pod's own.
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert mounts == {"/work": "work", "/home/a2a": "home", "/tmp": "tmp"}
    assert volumes["work"]["persistentVolumeClaim"] == {"claimName": "a2a-work"}
    assert "emptyDir" in volumes["home"] and "emptyDir" in volumes["tmp"]


def test_the_work_volume_is_shared_across_nodes() -> None:
    claim = of_kind("PersistentVolumeClaim")["a2a-work"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_the_sandbox_opt_out_is_explicit_and_nothing_secret_is_shipped() -> None:
    config = of_kind("ConfigMap")["a2a-config"]["data"]
    assert config["A2A_SANDBOX"] == "off"
    assert "bubblewrap" in (KUBERNETES / "config.yaml").read_text(encoding="utf-8")
    assert not of_kind("Secret")
    assert not any(key.endswith(("TOKEN", "API_KEY", "PASSWORD")) for key in config)
    for deployment in of_kind("Deployment").values():
        for item in container_of(deployment).get("env", []):
            assert "value" not in item or "://" not in item["value"] or "@" not in item["value"]


def test_the_orchestrator_reaches_every_role_at_its_service() -> None:
    env = {
        item["name"]: item["value"]
        for item in container_of(of_kind("Deployment")["orchestrator"])["env"]
        if "value" in item
    }
    network = Network.load(cwd=ROOT, home=ROOT / "no-such-home", environ=env)
    services = of_kind("Service")
    for name, spec in AGENTS.items():
        assert env[override_var(name, "URL")] == f"http://{name}:{spec.port}"
        assert network.agents[name].url == f"http://{name}:{spec.port}"
        assert network.agents[name].token_env == "A2A_AUTH_TOKEN"
        assert services[name]["spec"]["ports"][0]["port"] == spec.port


def test_only_the_orchestrator_reaches_the_roles() -> None:
    (policy,) = of_kind("NetworkPolicy").values()
    selector = policy["spec"]["podSelector"]["matchExpressions"][0]
    assert sorted(selector["values"]) == sorted(AGENTS)
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "orchestrator"
