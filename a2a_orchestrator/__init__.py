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
    from .control.parent import ParentAgent as ParentAgent
    from .control.pipeline import Brief as Brief
    from .control.pipeline import PassOptions as PassOptions
    from .control.pipeline import Pipeline as Pipeline
    from .control.pipeline import PipelineError as PipelineError
    from .control.pipeline import PipelineResult as PipelineResult
    from .control.pipeline import TaskSpec as TaskSpec
    from .control.plane import ControlPlane as ControlPlane
    from .control.reactions import Reactions as Reactions
    from .control.reactions import load_reactions as load_reactions
    from .control.supervisor import Supervisor as Supervisor
    from .delegation.base import ChildConfig as ChildConfig
    from .delegation.base import ChildHandle as ChildHandle
    from .delegation.base import Delegate as Delegate
    from .delegation.hooks import Deny as Deny
    from .delegation.hooks import Hooks as Hooks
    from .delegation.network import AgentSpec as AgentSpec
    from .delegation.network import Network as Network
    from .delegation.policy import Narrow as Narrow
    from .delegation.policy import SpawnPolicy as SpawnPolicy
    from .delegation.policy import SpawnRequest as SpawnRequest
    from .delegation.policy import load_policy_file as load_policy_file
    from .delegation.session import RelayedEvent as RelayedEvent
    from .delegation.session import Session as Session
    from .delegation.transports import MemoryDelegate as MemoryDelegate
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
    from .models import Model as Model
    from .models import ModelSettings as ModelSettings
    from .models import OpenAIModel as OpenAIModel
    from .models import ScriptedModel as ScriptedModel
    from .models import resolve_model as resolve_model
    from .runtime.budgets import Budget as Budget
    from .runtime.budgets import PriceTable as PriceTable
    from .runtime.budgets import Spend as Spend
    from .runtime.conversation import Conversation as Conversation
    from .runtime.events import AssistantMessage as AssistantMessage
    from .runtime.events import ChildEvent as ChildEvent
    from .runtime.events import Done as Done
    from .runtime.events import Failed as Failed
    from .runtime.events import InputRequired as InputRequired
    from .runtime.events import MessageDelta as MessageDelta
    from .runtime.events import MessageRestarted as MessageRestarted
    from .runtime.events import Started as Started
    from .runtime.events import ToolCalled as ToolCalled
    from .runtime.events import ToolResult as ToolResult
    from .runtime.roles import Role as Role
    from .runtime.roles import find_role as find_role
    from .runtime.roles import list_roles as list_roles
    from .server.app import build_app as build_app
    from .server.app import build_card as build_card
    from .server.app import run_role_server as run_role_server
    from .server.auth.access import Access as Access
    from .server.auth.callers import CallerFile as CallerFile
    from .server.auth.callers import Limits as Limits
    from .server.auth.issuer import Issuer as Issuer
    from .server.executor import RoleExecutor as RoleExecutor
    from .storage.store import Store as Store
    from .tools import Tool as Tool
    from .tools import Workspace as Workspace
    from .tools import build_tools as build_tools

# Each exported name and the submodule that defines it.
_EXPORTS: dict[str, str] = {
    "Access": "server.auth.access",
    "Budget": "runtime.budgets",
    "PriceTable": "runtime.budgets",
    "Spend": "runtime.budgets",
    "CallerFile": "server.auth.callers",
    "Limits": "server.auth.callers",
    "ControlPlane": "control.plane",
    "ChildConfig": "delegation.base",
    "ChildHandle": "delegation.base",
    "Delegate": "delegation.base",
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
    "AssistantMessage": "runtime.events",
    "ChildEvent": "runtime.events",
    "Done": "runtime.events",
    "Failed": "runtime.events",
    "InputRequired": "runtime.events",
    "MessageDelta": "runtime.events",
    "MessageRestarted": "runtime.events",
    "Started": "runtime.events",
    "ToolCalled": "runtime.events",
    "ToolResult": "runtime.events",
    "RoleExecutor": "server.executor",
    "Deny": "delegation.hooks",
    "Hooks": "delegation.hooks",
    "Issuer": "server.auth.issuer",
    "Model": "models",
    "ModelSettings": "models",
    "OpenAIModel": "models",
    "ScriptedModel": "models",
    "resolve_model": "models",
    "AgentSpec": "delegation.network",
    "Network": "delegation.network",
    "ParentAgent": "control.parent",
    "Brief": "control.pipeline",
    "PassOptions": "control.pipeline",
    "Pipeline": "control.pipeline",
    "PipelineError": "control.pipeline",
    "PipelineResult": "control.pipeline",
    "TaskSpec": "control.pipeline",
    "Narrow": "delegation.policy",
    "SpawnPolicy": "delegation.policy",
    "SpawnRequest": "delegation.policy",
    "load_policy_file": "delegation.policy",
    "Reactions": "control.reactions",
    "load_reactions": "control.reactions",
    "Role": "runtime.roles",
    "find_role": "runtime.roles",
    "list_roles": "runtime.roles",
    "Conversation": "runtime.conversation",
    "build_app": "server.app",
    "build_card": "server.app",
    "run_role_server": "server.app",
    "RelayedEvent": "delegation.session",
    "Session": "delegation.session",
    "Store": "storage.store",
    "Supervisor": "control.supervisor",
    "Tool": "tools",
    "Workspace": "tools",
    "build_tools": "tools",
    "MemoryDelegate": "delegation.transports",
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
