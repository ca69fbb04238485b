"""The network: which agents the orchestrator can delegate to, and where they run.

An agent file is TOML, one per agent, named after the agent (`coder.toml`):

    name = "coder"                # optional; must equal the file's stem
    role = "coder"                # required: the role the agent plays
    url = "https://coder.example" # optional: A2A over HTTP; absent = in-process
    token_env = "CODER_TOKEN"     # optional: env variable holding its bearer token
    description = "Writes code"   # optional
    port = 9102                   # optional: where `a2a-orchestrator up` serves it

An agent behind an OAuth2 authorization server gets its tokens by the client
credentials grant instead of `token_env` (fetched when needed, refreshed
before they expire):

    token_url = "https://idp.example/oauth/token"
    client_id = "orchestrator"
    client_secret_env = "CODER_CLIENT_SECRET"   # env variable holding the secret
    scope = "a2a"                 # optional
    audience = "https://coder.example"          # optional (Auth0 and others want it)

An agent whose card must be signed names the key that signs it (a PEM
public key or a JWKS; a path, relative to the agent file, or an https URL):

    card_key = "keys/coder.pub.pem"
    require_signature = true      # an unsigned card is refused too

With `card_key` alone a signed card must verify and an unsigned one passes.

An agent whose card is not at the well-known path names the path on its
server (`serve --grpc-port N --grpc-card separate` lists gRPC only in a
second card, here):

    card_path = "/.well-known/agent-card-grpc.json"

An agent given long tasks can answer by push notifications instead of a
stream held open for the whole task (needs `serve orchestrator`, whose
webhook endpoint receives them; elsewhere the child streams):

    push = true

Containers re-point agents without editing files: `A2A_AGENT_<NAME>_URL`
(the name upper-cased, `-` as `_`) replaces `url`, and an empty value or
`local` makes the agent in-process; `A2A_AGENT_<NAME>_TOKEN_ENV` replaces
`token_env`. Overrides are read once, when the file is loaded.

Lookup contract, as for roles: `agent_dirs()` lists the directories in
priority order and the first directory holding `<name>.toml` wins. Only the
winning files are parsed, so a broken file that is shadowed is never read.

This module stays light: it never imports a2a-sdk, so reading the network
costs nothing for a command that only lists it.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, StrictStr

from ..configfile import Flag, OperatorFile, Port, check
from ..errors import ConfigError, RoleNotFoundError
from ..runtime.lookup import lookup_dirs, shipped_dir
from ..runtime.roles import ROLE_NAME_PATTERN, find_role, read_roles, role_names

__all__ = [
    "AgentSpec",
    "Network",
    "agent_dirs",
    "load_agent_file",
    "override_var",
    "shipped_agents_dir",
]

_SUFFIX = ".toml"
_OAUTH_FIELDS = ("token_url", "client_id", "client_secret_env", "scope", "audience")
# POSIX-portable variable names; this catches a token pasted where its
# variable's name belongs (a token with '-' or '.' in it fails here).
_ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_IN_PROCESS_VALUES = frozenset({"", "local"})


@dataclass(frozen=True, kw_only=True)
class AgentSpec:
    """One agent the orchestrator can delegate to: its role and where it runs."""

    name: str
    """The agent's name, unique in the network (`coder` for `coder.toml`)."""
    role: str
    """The role it plays; an in-process agent runs this role's definition."""
    url: str | None = None
    """Base URL of its A2A server; `None` runs it in-process."""
    token_env: str | None = None
    """Name of the environment variable holding its bearer token, if any."""
    description: str = ""
    """One line for people: what this agent is for."""
    port: int | None = None
    """The local port `a2a-orchestrator up` serves it on; `None` = not served."""
    source: Path | None = None
    """The file the agent was loaded from; `None` for agents built in code."""
    token_url: str | None = None
    """OAuth2 token endpoint: tokens come from the client credentials grant."""
    client_id: str | None = None
    """The orchestrator's client id at `token_url`."""
    client_secret_env: str | None = None
    """Name of the environment variable holding the client secret."""
    scope: str | None = None
    """The scope to ask `token_url` for, if any."""
    audience: str | None = None
    """The audience to ask `token_url` for, if any (an extension many providers use)."""
    card_key: str | None = None
    """The key its card's signature must verify with: a PEM public key or a
    JWKS, as a file path or an https URL (`cards.verify_card`)."""
    require_signature: bool = False
    """Refuse its card when it carries no signature (needs `card_key`)."""
    card_path: str | None = None
    """The path of its agent card on its server (None: the well-known
    `/.well-known/agent-card.json`)."""
    push: bool = False
    """Delegate in push mode: the agent posts the task's updates to the
    orchestrator's webhook endpoint (`transports/push_receiver.py`)."""

    def __post_init__(self) -> None:
        if self.require_signature and self.card_key is None:
            raise ConfigError(
                f"agent {self.name!r}: field 'require_signature': needs 'card_key', "
                "the key the signature is checked with"
            )
        for field, problem in (
            ("name", _name_problem(self.name)),
            ("role", _name_problem(self.role)),
            ("url", _url_problem(self.url)),
            ("card_path", _card_path_problem(self.card_path)),
            ("token_env", _token_env_problem(self.token_env)),
            ("port", _port_problem(self.port)),
            ("token_url", _url_problem(self.token_url)),
            ("client_secret_env", _env_name_problem(self.client_secret_env, "client secret")),
            *_oauth_problems(self),
        ):
            if problem:
                raise ConfigError(f"agent {self.name!r}: field {field!r}: {problem}")

    @property
    def remote(self) -> bool:
        """True when the agent is reached over A2A HTTP, False when in-process."""
        return self.url is not None

    @property
    def transport(self) -> str:
        """The transport that reaches it: `remote` (A2A HTTP) or `local` (in-process)."""
        return "remote" if self.url is not None else "local"

    def token(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """The bearer token from `environ[token_env]`; `None` if unset or empty."""
        if self.token_env is None:
            return None
        return environ.get(self.token_env) or None

    def client_secret(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """The OAuth2 client secret from `environ[client_secret_env]`; `None` if unset."""
        if self.client_secret_env is None:
            return None
        return environ.get(self.client_secret_env) or None


def _oauth_problems(spec: AgentSpec) -> list[tuple[str, str | None]]:
    """The client credentials fields go together, and instead of `token_env`."""
    if spec.token_url is None:
        return [
            (field, "needs token_url (the OAuth2 client credentials grant)")
            for field in _OAUTH_FIELDS[1:]
            if getattr(spec, field) is not None
        ]
    return [
        ("client_id", None if spec.client_id else "required with token_url"),
        (
            "client_secret_env",
            None if spec.client_secret_env else "required with token_url (a variable's name)",
        ),
        ("token_env", "use either token_env or token_url, not both" if spec.token_env else None),
    ]


def override_var(name: str, what: Literal["URL", "TOKEN_ENV"]) -> str:
    """The environment variable that overrides `what` for agent `name`.

    `override_var("code-review", "URL")` is `A2A_AGENT_CODE_REVIEW_URL`.
    (`a-b` and `a_b` share their variables; give agents distinct names.)
    """
    return f"A2A_AGENT_{name.upper().replace('-', '_')}_{what}"


def shipped_agents_dir() -> Path:
    """The directory of the agents that ship with the package."""
    return shipped_dir("agents")


def agent_dirs(
    cwd: str | os.PathLike[str] | None = None, home: str | os.PathLike[str] | None = None
) -> list[Path]:
    """The lookup directories, highest priority first.

    `./agents/`, `./.a2a/agents/` (under `cwd`),
    `~/.config/a2a-orchestrator/agents/` (under `home`), then the shipped
    agents. Directories that do not exist are listed all the same; lookup
    skips them. A directory reached twice is listed once.
    """
    return lookup_dirs("agents", cwd=cwd, home=home)


class _AgentFile(OperatorFile):
    """An agent file's fields, by type; what their values mean (a name, a
    URL, a variable's name) is checked as `AgentSpec` checks it."""

    name: StrictStr | None = None
    role: Annotated[StrictStr, Field(description="the role this agent plays")]
    url: StrictStr | None = None
    token_env: StrictStr | None = None
    description: StrictStr = ""
    port: Port | None = None
    card_key: StrictStr | None = None
    require_signature: Flag = False
    card_path: StrictStr | None = None
    push: Flag = False
    token_url: StrictStr | None = None
    client_id: StrictStr | None = None
    client_secret_env: StrictStr | None = None
    scope: StrictStr | None = None
    audience: StrictStr | None = None


def load_agent_file(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] = os.environ
) -> AgentSpec:
    """Parse and validate one agent file, then apply the environment overrides.

    Every problem is a `ConfigError` naming the file (or the override
    variable) and the field.
    """
    path = Path(path)
    where = str(path)
    if path.suffix != _SUFFIX:
        raise ConfigError(f"{where}: an agent file must end in {_SUFFIX}")
    stem_problem = _name_problem(path.stem)
    if stem_problem:
        raise _file_error(where, "name", f"the file name {path.stem!r}: {stem_problem}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The decoder's message carries "(at line N, column M)".
        raise ConfigError(f"{where}: not valid TOML: {exc}") from exc

    fields = check(_AgentFile, data, where)
    name = path.stem
    if fields.name is not None and fields.name != name:
        raise _file_error(where, "name", f"is {fields.name!r} but the file is named {name!r}")
    role = fields.role
    role_problem = _name_problem(role)
    if role_problem:
        raise _file_error(where, "role", role_problem)
    url = fields.url.strip() if fields.url is not None else None
    url_problem = _url_problem(url)
    if url_problem:
        raise _file_error(where, "url", url_problem)
    token_env = fields.token_env.strip() if fields.token_env is not None else None
    token_problem = _token_env_problem(token_env)
    if token_problem:
        raise _file_error(where, "token_env", token_problem)
    oauth = {field: getattr(fields, field) for field in _OAUTH_FIELDS}
    oauth = {field: value.strip() if value else value for field, value in oauth.items()}
    card_key = fields.card_key
    if card_key is not None and not card_key.startswith(("https://", "http://")):
        card_key = str(path.parent / Path(card_key).expanduser())

    url, token_env = _apply_overrides(name, where, url, token_env, environ)
    try:
        return AgentSpec(
            name=name,
            role=role,
            url=url,
            token_env=token_env,
            description=fields.description.strip(),
            port=fields.port,
            source=path,
            card_key=card_key,
            require_signature=fields.require_signature,
            card_path=fields.card_path,
            push=fields.push,
            **oauth,
        )
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


class Network:
    """An immutable set of agents by name, and how a name or role finds one.

    `resolve()` falls back to the role files, so every role is reachable
    in-process even without an agent file; `cwd` and `home` say where those
    role files are looked up (as in `roles.find_role`).
    """

    __slots__ = ("_agents", "_cwd", "_home")

    def __init__(
        self,
        agents: Mapping[str, AgentSpec],
        *,
        cwd: str | os.PathLike[str] | None = None,
        home: str | os.PathLike[str] | None = None,
    ) -> None:
        for key, spec in agents.items():
            if key != spec.name:
                raise ConfigError(f"agent {spec.name!r} is filed under a different name {key!r}")
        self._agents: Mapping[str, AgentSpec] = MappingProxyType(
            {key: agents[key] for key in sorted(agents)}
        )
        self._cwd = cwd
        self._home = home

    @classmethod
    def load(
        cls,
        *,
        cwd: str | os.PathLike[str] | None = None,
        home: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> Network:
        """Every agent reachable by name, each from its winning file in `agent_dirs()`.

        Raises `ConfigError` for the first winning file that is malformed.
        The commands load it once, at start; the role files are read now too
        (`roles.read_roles`), so no file a run writes later becomes an agent
        or a role.
        """
        index = _index(agent_dirs(cwd, home))
        agents = {name: load_agent_file(index[name], environ=environ) for name in index}
        read_roles(cwd, home)
        return cls(agents, cwd=cwd, home=home)

    @classmethod
    def of(
        cls,
        *specs: AgentSpec,
        cwd: str | os.PathLike[str] | None = None,
        home: str | os.PathLike[str] | None = None,
    ) -> Network:
        """A network of the given agents; two agents with one name is an error."""
        agents: dict[str, AgentSpec] = {}
        for spec in specs:
            if spec.name in agents:
                raise ConfigError(f"agent {spec.name!r} is given twice")
            agents[spec.name] = spec
        return cls(agents, cwd=cwd, home=home)

    @property
    def agents(self) -> Mapping[str, AgentSpec]:
        """The agents by name, sorted by name; read-only."""
        return self._agents

    def names(self) -> list[str]:
        """The agent names, sorted."""
        return list(self._agents)

    def __contains__(self, name: object) -> bool:
        return name in self._agents

    def __len__(self) -> int:
        return len(self._agents)

    def __repr__(self) -> str:
        return f"Network({', '.join(self._agents) or '(empty)'})"

    def with_agent(self, spec: AgentSpec) -> Network:
        """A new network with `spec` added, replacing any agent of the same name."""
        return Network({**self._agents, spec.name: spec}, cwd=self._cwd, home=self._home)

    def resolve(self, name_or_role: str) -> AgentSpec:
        """The agent to delegate `name_or_role` to.

        In order: the agent of that name; else the first agent (by name) that
        plays that role; else, when a role of that name exists, an in-process
        agent for it. Otherwise `ConfigError` listing the known agents and
        roles. A malformed role file found on the way raises its own
        `RoleFileError`.
        """
        spec = self._agents.get(name_or_role)
        if spec is not None:
            return spec
        for spec in self._agents.values():
            if spec.role == name_or_role:
                return spec
        if ROLE_NAME_PATTERN.fullmatch(name_or_role):
            try:
                role = find_role(name_or_role, cwd=self._cwd, home=self._home)
            except RoleNotFoundError as exc:
                known_roles = exc.known
            else:
                return AgentSpec(name=role.name, role=role.name, description=role.description)
        else:
            known_roles = role_names(self._cwd, self._home)
        raise ConfigError(
            f"Unknown agent or role {name_or_role!r}. "
            f"Agents: {', '.join(self._agents) or '(none)'}. "
            f"Roles: {', '.join(known_roles) or '(none)'}"
        )


# --- helpers ------------------------------------------------------------------


def _index(dirs: Iterable[Path]) -> dict[str, Path]:
    """Map each agent name to its winning file, without parsing any file.

    Files whose stem is not a valid name are not agents and are passed over.
    """
    index: dict[str, Path] = {}
    for directory in dirs:
        if not directory.is_dir():
            continue
        for entry in sorted(directory.glob(f"*{_SUFFIX}")):
            if entry.is_file() and ROLE_NAME_PATTERN.fullmatch(entry.stem):
                index.setdefault(entry.stem, entry)
    return index


def _apply_overrides(
    name: str,
    where: str,
    url: str | None,
    token_env: str | None,
    environ: Mapping[str, str],
) -> tuple[str | None, str | None]:
    url_var = override_var(name, "URL")
    if url_var in environ:
        value = environ[url_var].strip()
        if value.lower() in _IN_PROCESS_VALUES:
            url = None
        else:
            problem = _url_problem(value)
            if problem:
                raise ConfigError(f"{url_var} (overriding {where}): field 'url': {problem}")
            url = value
    token_var = override_var(name, "TOKEN_ENV")
    if token_var in environ:
        value = environ[token_var].strip()
        problem = _token_env_problem(value) if value else None
        if problem:
            raise ConfigError(f"{token_var} (overriding {where}): field 'token_env': {problem}")
        token_env = value or None
    return url, token_env


def _file_error(where: str, field: str, message: str) -> ConfigError:
    # The same shape as RoleFileError, so both kinds of file read alike.
    return ConfigError(f"{where}: field {field!r}: {message}")


def _name_problem(value: object) -> str | None:
    if not isinstance(value, str) or not ROLE_NAME_PATTERN.fullmatch(value):
        return (
            f"{value!r} is not a valid name (lowercase letters, digits, '-' and '_', "
            "starting with a letter or digit)"
        )
    return None


def _url_problem(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.netloc:
        return f"{value!r} is not an http:// or https:// URL"
    return None


def _card_path_problem(value: str | None) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value)
    if not value.startswith("/") or value.startswith("//") or parts.query or parts.fragment:
        return f"{value!r} is not a path on the agent's server (one starting with '/')"
    return None


def _env_name_problem(value: object, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _ENV_NAME_PATTERN.fullmatch(value):
        return (
            f"{value!r} is not an environment variable name; it names the variable "
            f"that holds the {what}, not the {what} itself"
        )
    return None


def _token_env_problem(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _ENV_NAME_PATTERN.fullmatch(value):
        return (
            f"{value!r} is not an environment variable name; token_env names the "
            "variable that holds the token, not the token itself"
        )
    return None


def _port_problem(value: object) -> str | None:
    if value is None:
        return None
    # bool is an int subclass; `port = true` is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        return f"must be an integer from 1 to 65535, got {value!r}"
    return None
