"""A server's settings: one frozen object, validated once, passed down.

`run_role_server` and `run_orchestrator_server` take their settings as one
object (`RoleServerSettings`, `orchestrator.settings.OrchestratorSettings`) instead of a keyword
each, and hand it down as it is: `build_app` reads the `AppSettings` part.
Collaborators (the role, models, caller access, the sandbox, prices) are
given beside it, built by the caller; settings are plain values.

Frozen dataclasses checked in `__post_init__`: a few range checks read as
well as a pydantic model would, and the module imports nothing heavy (the
CLI builds one only once a command runs, never for `--help`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ConfigError
from .executor import DEFAULT_MAX_MEMORY
from .middleware import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY

if TYPE_CHECKING:
    from ..protocol.cards import CardOptions
    from .push import PushPolicy
    from .replicas import ReplicaSettings
    from .streams import StreamLimits

__all__ = ["AppSettings", "RoleServerSettings", "ServerSettings", "settings_from"]


def _port(name: str, port: int | None) -> None:
    if port is not None and not 0 <= port <= 65535:
        raise ConfigError(f"{name} {port} is not in 0..65535")


@dataclass(frozen=True, kw_only=True)
class AppSettings:
    """What `build_app` reads: the limits and exposure of the app it builds."""

    max_body: int = DEFAULT_MAX_BODY
    """Bytes a request body may have (413 past it)."""
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    """Seconds a client has to send a request body (408 past it)."""
    metrics_public: bool = False
    """Serve `/metrics` without the callers' auth."""
    push_policy: PushPolicy | None = None
    """The webhook URLs callers may register (None: public addresses only; `push.py`)."""

    def __post_init__(self) -> None:
        if not self.max_body > 0:
            raise ConfigError(f"max_body must be a positive number of bytes, got {self.max_body}")
        if not self.body_timeout > 0:
            raise ConfigError(f"body_timeout must be positive, got {self.body_timeout:g}")


@dataclass(frozen=True, kw_only=True)
class ServerSettings(AppSettings):
    """What both servers read: where they listen and what they serve."""

    db: str
    """The A2A task store: a file path (SQLite) or an SQLAlchemy async URL."""
    host: str = "127.0.0.1"
    port: int = 0
    """0: any free port (the server reports the one it took)."""
    public_url: str | None = None
    """The URL clients reach it at, when not host and port (a container's name)."""
    token: str | None = None
    """One caller's bearer token, when no `access` is given beside the settings."""
    metrics: bool = True
    """Serve Prometheus metrics at `/metrics`."""
    install_signal_handlers: bool = False
    grpc_port: int | None = None
    """A2A over gRPC too, on this port (0: any free one; None: not served)."""
    stream_limits: StreamLimits | None = None
    """The streams it holds open, per caller and in all (None: `StreamLimits()`)."""
    card_options: CardOptions | None = None
    """The protocol versions its card lists and its signing key (None: both, unsigned)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _port("port", self.port)
        _port("the gRPC port", self.grpc_port)


@dataclass(frozen=True, kw_only=True)
class RoleServerSettings(ServerSettings):
    """A role server's settings (`run_role_server`)."""

    model_names: Collection[str] = ()
    """Model names a caller may choose besides `default`, `mini` and the role's `models`."""
    max_memory: int = DEFAULT_MAX_MEMORY
    """Bytes of conversations kept in memory (`RoleExecutor` checks it)."""
    replica: ReplicaSettings | None = None
    """With a PostgreSQL `db`: its replica id and lease (None: `ReplicaSettings.from_env()`)."""


S = TypeVar("S", bound=ServerSettings)


def settings_from(kind: type[S], settings: S | None, options: Mapping[str, Any]) -> S:
    """`settings` with `options` (keywords named as its fields) in place, or
    a `kind` made of `options` alone: how the public entry points keep
    taking their settings as keywords. A name that is no field is a
    `TypeError`, as for any function."""
    if settings is None:
        return kind(**options)
    return dataclasses.replace(settings, **options) if options else settings
