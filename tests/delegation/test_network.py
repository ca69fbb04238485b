"""The network registry: agent files, env overrides, lookup order, resolve, errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from a2a_orchestrator.delegation.network import (
    AgentSpec,
    Network,
    agent_dirs,
    load_agent_file,
    override_var,
    shipped_agents_dir,
)
from a2a_orchestrator.errors import ConfigError

SHIPPED = {"architect": 9101, "coder": 9102, "observer": 9104, "reviewer": 9103}
NO_ENV: dict[str, str] = {}


def write(directory: Path, filename: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, env: dict[str, str] | None = None) -> Network:
    """The network seen from an empty project and an empty home under tmp_path."""
    return Network.load(cwd=tmp_path / "project", home=tmp_path / "home", environ=env or NO_ENV)


# --- shipped agents -----------------------------------------------------------


def test_shipped_dir_holds_the_four_agents() -> None:
    assert sorted(p.stem for p in shipped_agents_dir().glob("*.toml")) == sorted(SHIPPED)


def test_shipped_agents_load_in_process(tmp_path: Path) -> None:
    network = load(tmp_path)
    assert network.names() == sorted(SHIPPED)
    for name, port in SHIPPED.items():
        spec = network.agents[name]
        assert spec.name == name
        assert spec.role == name
        assert spec.url is None
        assert spec.remote is False
        assert spec.token_env is None
        assert spec.port == port
        assert spec.description, name
        assert spec.source == shipped_agents_dir() / f"{name}.toml"


def test_shipped_agent_files_explain_the_env_override() -> None:
    for name in SHIPPED:
        text = (shipped_agents_dir() / f"{name}.toml").read_text(encoding="utf-8")
        assert text.startswith("#"), name
        assert override_var(name, "URL") in text
        assert "token_env" in text


# --- one file -----------------------------------------------------------------


def test_remote_agent_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "search-bot.toml",
        'name = "search-bot"\nrole = "researcher"\nurl = "https://search.example:8443/a2a"\n'
        'token_env = "SEARCH_TOKEN"\ndescription = " Finds things. "\n',
    )
    spec = load_agent_file(path, environ=NO_ENV)
    assert spec == AgentSpec(
        name="search-bot",
        role="researcher",
        url="https://search.example:8443/a2a",
        token_env="SEARCH_TOKEN",
        description="Finds things.",
        port=None,
        source=path,
    )
    assert spec.remote is True


def test_name_field_is_optional(tmp_path: Path) -> None:
    spec = load_agent_file(write(tmp_path, "helper.toml", 'role = "coder"\n'), environ=NO_ENV)
    assert (spec.name, spec.role, spec.url, spec.description) == ("helper", "coder", None, "")


def test_token_reads_the_named_variable() -> None:
    spec = AgentSpec(name="x", role="coder", url="http://x:1", token_env="X_TOKEN")
    assert spec.token({"X_TOKEN": "s3cret"}) == "s3cret"
    assert spec.token({"X_TOKEN": ""}) is None
    assert spec.token({}) is None
    assert AgentSpec(name="y", role="coder").token({"X_TOKEN": "s3cret"}) is None


def test_token_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("A2A_TEST_NETWORK_TOKEN", "from-env")
    spec = AgentSpec(name="x", role="coder", token_env="A2A_TEST_NETWORK_TOKEN")
    assert spec.token() == "from-env"


def test_spec_is_frozen() -> None:
    spec = AgentSpec(name="x", role="coder")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.url = "http://elsewhere"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "Bad"}, "name"),
        ({"role": "../x"}, "role"),
        ({"url": "ftp://x"}, "url"),
        ({"token_env": "not a name"}, "token_env"),
        ({"port": 0}, "port"),
    ],
)
def test_spec_built_in_code_is_validated(kwargs: dict[str, object], field: str) -> None:
    fields: dict[str, object] = {"name": "x", "role": "coder", **kwargs}
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        AgentSpec(**fields)  # type: ignore[arg-type]


# --- environment overrides ----------------------------------------------------


def test_override_var_names() -> None:
    assert override_var("code-review", "URL") == "A2A_AGENT_CODE_REVIEW_URL"
    assert override_var("coder", "TOKEN_ENV") == "A2A_AGENT_CODER_TOKEN_ENV"


def test_env_url_makes_a_shipped_agent_remote(tmp_path: Path) -> None:
    env = {"A2A_AGENT_CODER_URL": "http://coder:9102", "A2A_AGENT_CODER_TOKEN_ENV": "CODER_TOK"}
    coder = load(tmp_path, env).agents["coder"]
    assert coder.url == "http://coder:9102"
    assert coder.remote is True
    assert coder.token_env == "CODER_TOK"
    assert coder.port == 9102  # the rest of the file still applies
    assert load(tmp_path, env).agents["reviewer"].remote is False


@pytest.mark.parametrize("value", ["", "local", " LOCAL "])
def test_env_url_local_or_empty_means_in_process(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, "far.toml", 'role = "coder"\nurl = "https://far.example"\n')
    spec = load_agent_file(path, environ={"A2A_AGENT_FAR_URL": value})
    assert spec.url is None
    assert spec.remote is False


def test_env_override_uses_underscores_for_dashes(tmp_path: Path) -> None:
    path = write(tmp_path, "code-review.toml", 'role = "reviewer"\ntoken_env = "OLD"\n')
    env = {"A2A_AGENT_CODE_REVIEW_URL": "https://r.example", "A2A_AGENT_CODE_REVIEW_TOKEN_ENV": ""}
    spec = load_agent_file(path, environ=env)
    assert (spec.url, spec.token_env) == ("https://r.example", None)


def test_bad_env_url_names_the_variable_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "coder.toml", 'role = "coder"\n')
    with pytest.raises(ConfigError) as info:
        load_agent_file(path, environ={"A2A_AGENT_CODER_URL": "coder:9102"})
    message = str(info.value)
    assert "A2A_AGENT_CODER_URL" in message
    assert str(path) in message
    assert "field 'url'" in message


# --- malformed files ----------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "text", "field", "detail"),
    [
        ("a.toml", "", "role", "missing"),
        ("a.toml", "role = 3\n", "role", "must be a string"),
        ("a.toml", 'role = "Coder"\n', "role", "not a valid name"),
        ("a.toml", 'role = "coder"\nurl = 5\n', "url", "must be a string"),
        ("a.toml", 'role = "coder"\nurl = "coder:9102"\n', "url", "http:// or https://"),
        ("a.toml", 'role = "coder"\nurl = "file:///etc"\n', "url", "http:// or https://"),
        ("a.toml", 'role = "coder"\ntoken_env = ["X"]\n', "token_env", "must be a string"),
        ("a.toml", 'role = "coder"\ntoken_env = "sk-abc.def"\n', "token_env", "not the token"),
        ("a.toml", 'role = "coder"\ndescription = 1\n', "description", "must be a string"),
        ("a.toml", 'role = "coder"\nport = "9101"\n', "port", "1 to 65535"),
        ("a.toml", 'role = "coder"\nport = 70000\n', "port", "1 to 65535"),
        ("a.toml", 'role = "coder"\nport = true\n', "port", "1 to 65535"),
        ("a.toml", 'role = "coder"\nmodel = "mini"\n', "model", "unknown field"),
        ("a.toml", 'name = "b"\nrole = "coder"\n', "name", "file is named 'a'"),
        ("Bad.toml", 'role = "coder"\n', "name", "not a valid name"),
    ],
)
def test_malformed_file_names_file_and_field(
    tmp_path: Path, filename: str, text: str, field: str, detail: str
) -> None:
    path = write(tmp_path, filename, text)
    with pytest.raises(ConfigError) as info:
        load_agent_file(path, environ=NO_ENV)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert f"field '{field}'" in message
    assert detail in message


def test_toml_syntax_error_gives_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "a.toml", 'role = "coder"\nport = \n')
    with pytest.raises(ConfigError, match=r"not valid TOML.*line 2") as info:
        load_agent_file(path, environ=NO_ENV)
    assert str(info.value).startswith(str(path))


def test_wrong_suffix_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "a.json", "{}")
    with pytest.raises(ConfigError, match=r"must end in \.toml"):
        load_agent_file(path, environ=NO_ENV)


def test_broken_winning_file_fails_the_load(tmp_path: Path) -> None:
    write(tmp_path / "project" / "agents", "coder.toml", 'role = "coder"\nport = -1\n')
    with pytest.raises(ConfigError, match=r"coder\.toml: field 'port'"):
        load(tmp_path)


# --- lookup order -------------------------------------------------------------


def test_agent_dirs_order(tmp_path: Path) -> None:
    cwd, home = tmp_path / "project", tmp_path / "home"
    assert agent_dirs(cwd, home) == [
        cwd / "agents",
        cwd / ".a2a" / "agents",
        home / ".config" / "a2a-orchestrator" / "agents",
        shipped_agents_dir(),
    ]


def test_agent_dirs_lists_the_shipped_dir_once_from_the_repo_root(tmp_path: Path) -> None:
    dirs = agent_dirs(shipped_agents_dir().parent, tmp_path)
    assert [d.resolve() for d in dirs].count(shipped_agents_dir().resolve()) == 1


def test_lookup_order_first_hit_wins(tmp_path: Path) -> None:
    cwd, home = tmp_path / "project", tmp_path / "home"
    user_dir = home / ".config" / "a2a-orchestrator" / "agents"
    write(cwd / "agents", "coder.toml", 'role = "coder"\ndescription = "cwd"\n')
    write(cwd / ".a2a" / "agents", "coder.toml", 'role = "coder"\ndescription = "dot-a2a"\n')
    write(cwd / ".a2a" / "agents", "reviewer.toml", 'role = "reviewer"\ndescription = "dot"\n')
    write(user_dir, "coder.toml", 'role = "coder"\ndescription = "home"\n')
    write(user_dir, "reviewer.toml", 'role = "reviewer"\ndescription = "home"\n')
    write(user_dir, "architect.toml", 'role = "architect"\ndescription = "home"\n')
    # A shadowed file is never parsed, so a broken one there does no harm.
    write(user_dir, "observer.toml", "this is not toml")
    write(cwd / "agents", "observer.toml", 'role = "observer"\ndescription = "cwd"\n')

    network = Network.load(cwd=cwd, home=home, environ=NO_ENV)
    described = {name: spec.description for name, spec in network.agents.items()}
    assert described == {
        "architect": "home",
        "coder": "cwd",
        "observer": "cwd",
        "reviewer": "dot",
    }
    assert network.agents["coder"].source == cwd / "agents" / "coder.toml"


def test_user_agent_joins_the_shipped_ones(tmp_path: Path) -> None:
    write(tmp_path / "project" / "agents", "helper.toml", 'role = "coder"\n')
    write(tmp_path / "project" / "agents", "README.md", "not an agent")
    assert load(tmp_path).names() == sorted([*SHIPPED, "helper"])


# --- Network ------------------------------------------------------------------


def test_resolve_by_name(tmp_path: Path) -> None:
    network = load(tmp_path).with_agent(
        AgentSpec(name="remote-coder", role="coder", url="http://c:1")
    )
    assert network.resolve("remote-coder").url == "http://c:1"
    # A name match wins over a role match: `coder` is both.
    assert network.resolve("coder").name == "coder"
    assert network.resolve("coder").remote is False


def test_resolve_by_role_takes_the_first_agent_by_name() -> None:
    network = Network.of(
        AgentSpec(name="zeta", role="researcher", url="http://z:1"),
        AgentSpec(name="alpha", role="researcher", url="http://a:1"),
    )
    assert network.resolve("researcher").name == "alpha"


def test_resolve_falls_back_to_an_in_process_role(tmp_path: Path) -> None:
    write(tmp_path / "project" / "roles", "tester.md", "---\ndescription: Tests.\n---\nTest.\n")
    network = Network.of(cwd=tmp_path / "project", home=tmp_path / "home")
    spec = network.resolve("tester")
    assert (spec.name, spec.role, spec.url, spec.remote) == ("tester", "tester", None, False)
    # A shipped role resolves too, with no agent file at all.
    assert network.resolve("architect").role == "architect"


def test_resolve_unknown_lists_agents_and_roles(tmp_path: Path) -> None:
    network = Network.of(
        AgentSpec(name="b-agent", role="coder"),
        AgentSpec(name="a-agent", role="coder"),
        cwd=tmp_path,
        home=tmp_path,
    )
    for unknown in ("nobody", "No Body"):
        with pytest.raises(ConfigError) as info:
            network.resolve(unknown)
        assert str(info.value) == (
            f"Unknown agent or role {unknown!r}. Agents: a-agent, b-agent. "
            "Roles: architect, coder, observer, orchestrator, reviewer"
        )


def test_network_is_immutable() -> None:
    one = AgentSpec(name="one", role="coder")
    network = Network.of(one)
    bigger = network.with_agent(AgentSpec(name="two", role="reviewer"))
    assert network.names() == ["one"]
    assert bigger.names() == ["one", "two"]
    with pytest.raises(TypeError):
        network.agents["two"] = one  # type: ignore[index]
    replaced = bigger.with_agent(AgentSpec(name="one", role="coder", url="http://one:1"))
    assert replaced.agents["one"].remote is True
    assert bigger.agents["one"].remote is False
    assert "two" in bigger and "two" not in network
    assert len(bigger) == 2


def test_network_refuses_inconsistent_names() -> None:
    spec = AgentSpec(name="one", role="coder")
    with pytest.raises(ConfigError, match="given twice"):
        Network.of(spec, spec)
    with pytest.raises(ConfigError, match="different name 'other'"):
        Network({"other": spec})
