"""The exceptions a2a-orchestrator raises.

    OrchestratorError
    ├── ConfigError                  misuse: fix the configuration or the call
    │   ├── RoleNotFoundError        no role file by that name
    │   └── RoleFileError            a role file that does not parse or validate
    ├── ToolError                    a tool refused or failed (reported to the model)
    │   └── PathOutsideWorkdirError  a path that leads outside the work directory
    ├── ModelError                   the model could not be reached or answered badly
    ├── StoreError                   a SQLite store could not be read or written
    ├── AccessError                  a caller's credential is not accepted (server side)
    │   ├── CredentialError          missing, malformed, unknown, expired, badly signed: 401
    │   └── IssuerUnavailableError   the identity provider's keys cannot be had now: 503
    ├── ControlError                 a control-plane request that cannot be honoured
    │   ├── SpawnRefusedError        the concurrency gate or a spawn.before hook said no
    │   └── UnknownChildError        no such child of this parent
    └── DelegationError              talking to a child failed at run time
        ├── AgentUnavailableError    the agent cannot be reached
        ├── DelegationTimeoutError   the agent did not answer in time
        └── ProtocolError            the agent answered outside the A2A protocol
            └── UntrustedCardError   its card lacks the signature the network requires

On the wire the role server uses a2a-sdk's error classes, so JSON-RPC error
codes stay the standard ones; these classes never cross the network.
"""

from __future__ import annotations

__all__ = [
    "AccessError",
    "AgentUnavailableError",
    "ConfigError",
    "ControlError",
    "CredentialError",
    "DelegationError",
    "DelegationTimeoutError",
    "IssuerUnavailableError",
    "ModelError",
    "OrchestratorError",
    "PathOutsideWorkdirError",
    "ProtocolError",
    "RoleFileError",
    "RoleNotFoundError",
    "SpawnRefusedError",
    "StoreError",
    "ToolError",
    "UnknownChildError",
    "UntrustedCardError",
]


class OrchestratorError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigError(OrchestratorError):
    """The configuration or the call is wrong; retrying will not help."""


class RoleNotFoundError(ConfigError):
    """No role by that name in any lookup directory."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        listing = ", ".join(known) if known else "(none)"
        super().__init__(f"Unknown role {name!r}. Known roles: {listing}")


class RoleFileError(ConfigError):
    """A role file that cannot be used, naming the file and the field."""

    def __init__(self, path: str, message: str, field: str | None = None) -> None:
        self.path = path
        self.field = field
        where = f"{path}: field {field!r}" if field else path
        super().__init__(f"{where}: {message}")


class ToolError(OrchestratorError):
    """A tool call that failed; its message goes back to the model."""


class PathOutsideWorkdirError(ToolError):
    """A path argument that resolves outside the session's work directory."""


class ModelError(OrchestratorError):
    """The model endpoint failed, was unreachable, or is misconfigured.

    `kind` names the failure in a word, for counting (metrics): `timeout`,
    `unreachable`, `refused` (credentials), `http_<status>`, `malformed`,
    `cut_short`, `closed`, or `error` when nothing finer is known."""

    def __init__(self, message: str = "", *, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


class StoreError(OrchestratorError):
    """A SQLite store refused a read or a write (the sqlite3 error is its cause).

    Raised for one call: a write that fails leaves the store as it was (its
    transaction, or its part of a group commit, is rolled back)."""


class AccessError(OrchestratorError):
    """A request's credential is not accepted; the message is safe to show the caller."""


class CredentialError(AccessError):
    """No credential, or one that is malformed, unknown, expired or badly signed."""


class IssuerUnavailableError(AccessError):
    """A JWT cannot be checked now: the issuer's keys could not be fetched."""


class ControlError(OrchestratorError):
    """A control-plane request that cannot be honoured; the message says why."""


class SpawnRefusedError(ControlError):
    """The concurrency gate is full, or a `spawn.before` hook denied the spawn."""


class UnknownChildError(ControlError):
    """The id (or role) names no child of this parent."""

    def __init__(self, child_id: str) -> None:
        self.child_id = child_id
        super().__init__(f"Unknown subagent: {child_id}")


class DelegationError(OrchestratorError):
    """Handing work to a child, or hearing back from it, failed."""


class AgentUnavailableError(DelegationError):
    """The agent could not be reached (refused, DNS, TLS, lost connection)."""


class DelegationTimeoutError(DelegationError):
    """The agent did not answer within the allowed time."""


class ProtocolError(DelegationError):
    """The agent answered with something the A2A protocol does not allow."""


class UntrustedCardError(ProtocolError):
    """The agent's card is not signed with the key the network requires for it."""
