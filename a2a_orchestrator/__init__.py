"""a2a-orchestrator: an A2A agent network.

Each role runs as its own A2A server; an orchestrator delegates work to them
over A2A JSON-RPC with SSE streaming, each child in an isolated context.
"""

# The exports load on first use (PEP 562): the package is imported by the CLI
# and by every light tool, and the server side of the SDK, SQLAlchemy, openai
# and uvicorn cost most of a second to import; a command that needs none of
# them should not pay for them.

import importlib as _importlib
import typing as _typing

from ._version import __version__ as __version__

if _typing.TYPE_CHECKING:
    from .access import Access as Access
    from .budgets import Budget as Budget
    from .budgets import PriceTable as PriceTable
    from .budgets import Spend as Spend
    from .callers import CallerFile as CallerFile
    from .callers import Limits as Limits
    from .control import ControlPlane as ControlPlane
    from .delegation import ChildConfig as ChildConfig
    from .delegation import ChildHandle as ChildHandle
    from .delegation import Delegate as Delegate
    from .errors import AccessError as AccessError
    from .errors import AgentUnavailableError as AgentUnavailableError
    from .errors import ConfigError as ConfigError
    from .errors import CredentialError as CredentialError
    from .errors import DelegationError as DelegationError
    from .errors import DelegationTimeoutError as DelegationTimeoutError
    from .errors import IssuerUnavailableError as IssuerUnavailableError
    from .errors import ModelError as ModelError
    from .errors import OrchestratorError as OrchestratorError
    from .errors import PathOutsideWorkdirError as PathOutsideWorkdirError
    from .errors import ProtocolError as ProtocolError
    from .errors import RoleFileError as RoleFileError
    from .errors import RoleNotFoundError as RoleNotFoundError
    from .errors import StoreError as StoreError
    from .errors import ToolError as ToolError
    from .errors import UntrustedCardError as UntrustedCardError
    from .events import AssistantMessage as AssistantMessage
    from .events import ChildEvent as ChildEvent
    from .events import Done as Done
    from .events import Failed as Failed
    from .events import InputRequired as InputRequired
    from .events import MessageDelta as MessageDelta
    from .events import MessageRestarted as MessageRestarted
    from .events import Started as Started
    from .events import ToolCalled as ToolCalled
    from .events import ToolResult as ToolResult
    from .executor import RoleExecutor as RoleExecutor
    from .hooks import Deny as Deny
    from .hooks import Hooks as Hooks
    from .issuer import Issuer as Issuer
    from .models import Model as Model
    from .models import ModelSettings as ModelSettings
    from .models import OpenAIModel as OpenAIModel
    from .models import ScriptedModel as ScriptedModel
    from .models import resolve_model as resolve_model
    from .network import AgentSpec as AgentSpec
    from .network import Network as Network
    from .parent import ParentAgent as ParentAgent
    from .pipeline import Brief as Brief
    from .pipeline import PassOptions as PassOptions
    from .pipeline import Pipeline as Pipeline
    from .pipeline import PipelineError as PipelineError
    from .pipeline import PipelineResult as PipelineResult
    from .pipeline import TaskSpec as TaskSpec
    from .policy import Narrow as Narrow
    from .policy import SpawnPolicy as SpawnPolicy
    from .policy import SpawnRequest as SpawnRequest
    from .policy import load_policy_file as load_policy_file
    from .reactions import Reactions as Reactions
    from .reactions import load_reactions as load_reactions
    from .roles import Role as Role
    from .roles import find_role as find_role
    from .roles import list_roles as list_roles
    from .runtime import Conversation as Conversation
    from .server import build_app as build_app
    from .server import build_card as build_card
    from .server import run_role_server as run_role_server
    from .session import RelayedEvent as RelayedEvent
    from .session import Session as Session
    from .store import Store as Store
    from .supervisor import Supervisor as Supervisor
    from .tools import Tool as Tool
    from .tools import Workspace as Workspace
    from .tools import build_tools as build_tools
    from .transports import MemoryDelegate as MemoryDelegate

# Each exported name and the submodule that defines it.
_EXPORTS: dict[str, str] = {
    "Access": "access",
    "Budget": "budgets",
    "PriceTable": "budgets",
    "Spend": "budgets",
    "CallerFile": "callers",
    "Limits": "callers",
    "ControlPlane": "control",
    "ChildConfig": "delegation",
    "ChildHandle": "delegation",
    "Delegate": "delegation",
    "AccessError": "errors",
    "AgentUnavailableError": "errors",
    "ConfigError": "errors",
    "CredentialError": "errors",
    "DelegationError": "errors",
    "DelegationTimeoutError": "errors",
    "IssuerUnavailableError": "errors",
    "ModelError": "errors",
    "OrchestratorError": "errors",
    "PathOutsideWorkdirError": "errors",
    "ProtocolError": "errors",
    "RoleFileError": "errors",
    "RoleNotFoundError": "errors",
    "StoreError": "errors",
    "ToolError": "errors",
    "UntrustedCardError": "errors",
    "AssistantMessage": "events",
    "ChildEvent": "events",
    "Done": "events",
    "Failed": "events",
    "InputRequired": "events",
    "MessageDelta": "events",
    "MessageRestarted": "events",
    "Started": "events",
    "ToolCalled": "events",
    "ToolResult": "events",
    "RoleExecutor": "executor",
    "Deny": "hooks",
    "Hooks": "hooks",
    "Issuer": "issuer",
    "Model": "models",
    "ModelSettings": "models",
    "OpenAIModel": "models",
    "ScriptedModel": "models",
    "resolve_model": "models",
    "AgentSpec": "network",
    "Network": "network",
    "ParentAgent": "parent",
    "Brief": "pipeline",
    "PassOptions": "pipeline",
    "Pipeline": "pipeline",
    "PipelineError": "pipeline",
    "PipelineResult": "pipeline",
    "TaskSpec": "pipeline",
    "Narrow": "policy",
    "SpawnPolicy": "policy",
    "SpawnRequest": "policy",
    "load_policy_file": "policy",
    "Reactions": "reactions",
    "load_reactions": "reactions",
    "Role": "roles",
    "find_role": "roles",
    "list_roles": "roles",
    "Conversation": "runtime",
    "build_app": "server",
    "build_card": "server",
    "run_role_server": "server",
    "RelayedEvent": "session",
    "Session": "session",
    "Store": "store",
    "Supervisor": "supervisor",
    "Tool": "tools",
    "Workspace": "tools",
    "build_tools": "tools",
    "MemoryDelegate": "transports",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    # Cached in the package so the next lookup is an ordinary attribute read.
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Access",
    "AccessError",
    "AgentSpec",
    "AgentUnavailableError",
    "AssistantMessage",
    "Brief",
    "Budget",
    "CallerFile",
    "ChildConfig",
    "ChildEvent",
    "ChildHandle",
    "ConfigError",
    "ControlPlane",
    "Conversation",
    "CredentialError",
    "Delegate",
    "DelegationError",
    "DelegationTimeoutError",
    "Deny",
    "Done",
    "Failed",
    "Hooks",
    "InputRequired",
    "Issuer",
    "IssuerUnavailableError",
    "Limits",
    "MemoryDelegate",
    "MessageDelta",
    "MessageRestarted",
    "Model",
    "ModelError",
    "ModelSettings",
    "Narrow",
    "Network",
    "OpenAIModel",
    "OrchestratorError",
    "ParentAgent",
    "PassOptions",
    "PathOutsideWorkdirError",
    "Pipeline",
    "PipelineError",
    "PipelineResult",
    "PriceTable",
    "ProtocolError",
    "Reactions",
    "RelayedEvent",
    "Role",
    "RoleExecutor",
    "RoleFileError",
    "RoleNotFoundError",
    "ScriptedModel",
    "Session",
    "SpawnPolicy",
    "SpawnRequest",
    "Spend",
    "Started",
    "Store",
    "StoreError",
    "Supervisor",
    "TaskSpec",
    "Tool",
    "ToolCalled",
    "ToolError",
    "ToolResult",
    "UntrustedCardError",
    "Workspace",
    "__version__",
    "build_app",
    "build_card",
    "build_tools",
    "find_role",
    "list_roles",
    "load_policy_file",
    "load_reactions",
    "resolve_model",
    "run_role_server",
]
