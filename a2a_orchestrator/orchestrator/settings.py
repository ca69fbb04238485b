"""The orchestrator server's settings (`server/settings.py` has the rest)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ..errors import ConfigError
from ..server.settings import ServerSettings
from ..storage.session_leases import LEASE_SECONDS

__all__ = ["OrchestratorSettings"]


@dataclass(frozen=True, kw_only=True)
class OrchestratorSettings(ServerSettings):
    """The orchestrator server's settings (`run_orchestrator_server`)."""

    lease_seconds: float = LEASE_SECONDS
    """With a PostgreSQL store: how long a session's lease outlives its renewal."""
    model_names: Collection[str] | None = None
    """Model names a parent may choose for a child besides `default`, `mini`
    and the role's `models` (None: `$A2A_MODELS`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.lease_seconds > 0:
            raise ConfigError(f"lease_seconds must be positive, got {self.lease_seconds:g}")
