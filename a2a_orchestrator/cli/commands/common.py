"""What the commands share: output, configuration files, stores, ids, checks."""

from __future__ import annotations

import argparse
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import OrchestratorError
from ...storage.store import RunnerRecord, Store

# What only the commands that run something need (the session with its
# transports, the role server, the parent agent, models, tools, hooks,
# policy, reactions, httpx) is imported in those commands: the session alone
# loads the SDK's server side, and `status`, `children` and `events` should
# start in a fraction of that time. Names used only in annotations are here.
if TYPE_CHECKING:
    from ...control.reactions import Reaction
    from ...delegation.hooks import Hooks
    from ...delegation.network import Network
    from ...delegation.policy import SpawnPolicy
    from ...models import ModelSettings
    from ...tools import Sandbox

__all__ = [
    "MODEL_HINT",
    "PIPELINE_PASSES",
    "SESSION_ID",
    "STOPPED_LINE",
    "check_agents",
    "child_id_of",
    "existing_store",
    "hooks_of",
    "model_notice",
    "new_store",
    "policy_of",
    "reaction_rules",
    "runner_name",
    "sandbox_of",
    "say",
    "session_id_of",
    "settings_and_models",
    "workdir_of",
]

logger = logging.getLogger(__name__)


STOPPED_LINE = "stopped by `a2a-orchestrator stop`: its children ended aborted"


SESSION_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


MODEL_HINT = (
    "set A2A_MODEL_BASE_URL (and A2A_MODEL_API_KEY if needed) to use a real OpenAI-compatible model"
)


def say(text: str = "") -> None:
    print(text, flush=True)


def settings_and_models() -> tuple[ModelSettings, Any]:
    from ...models import ModelSettings, resolve_model

    settings = ModelSettings.from_env()
    return settings, lambda name: resolve_model(name, settings)


def model_notice(settings: ModelSettings) -> None:
    if settings.offline:
        say(f"model: scripted (offline) - no model endpoint is configured; {MODEL_HINT}")


def policy_of(path: Path | None, config_dir: Path) -> SpawnPolicy | None:
    """The spawn policy: `--policy FILE`, else `policy.toml` beside the hooks."""
    from ...delegation.policy import SpawnPolicy, load_policy_file

    candidate = path or config_dir / "policy.toml"
    if path is not None or candidate.exists():
        return load_policy_file(candidate, SpawnPolicy(cwd=config_dir.parent))
    return None


def hooks_of(
    path: Path | None, config_dir: Path, *, workdir: Path | None = None, sandboxed: bool = False
) -> Hooks:
    """The hooks: `--hooks FILE`, else `hooks.toml` in `config_dir`. Their
    commands run outside the sandbox, in the file's directory: while
    commands run `sandboxed`, a hooks file inside `workdir` (but for its
    `.a2a/`, which commands cannot reach) is refused, as a command could
    write the programs it runs there."""
    from ...delegation.hooks import Hooks, load_hook_file
    from ...tools.reserved import STATE_DIR

    candidate = path or config_dir / "hooks.toml"
    if path is None and not candidate.exists():
        return Hooks()
    hooks = load_hook_file(candidate)  # a file that does not load says so first
    if sandboxed and workdir is not None:
        root = Path(os.path.realpath(workdir))
        real = Path(os.path.realpath(candidate))
        if real.is_relative_to(root) and not real.is_relative_to(root / STATE_DIR):
            raise OrchestratorError(
                f"the hooks file {candidate} is inside the work directory {root}, where "
                "sandboxed commands can write what its hooks run outside the sandbox: keep it "
                f"in {root / STATE_DIR}/ or outside the work directory"
            )
    return hooks


def sandbox_of(args: argparse.Namespace) -> Sandbox:
    """The operator's sandbox for commands: `--no-sandbox`/`--allow-network`,
    else the A2A_SANDBOX* variables. Turning it off is said out loud."""
    from ...tools import Sandbox

    sandbox = Sandbox.from_env(no_sandbox=args.no_sandbox, allow_network=args.allow_network)
    if not sandbox.enabled:
        logger.warning("the operator turned the command sandbox off: %s", sandbox.describe())
        say(f"sandbox: {sandbox.describe()}")
    return sandbox


def existing_store(path: Path | str) -> Store:
    from ...storage.opening import open_store

    if isinstance(path, Path) and not path.exists():
        raise OrchestratorError(f"no store at {path} (run a task first, or pass --store)")
    return open_store(path)


def new_store(path: Path | str) -> Store:
    """The store a command writes; a `.a2a` directory made for it is kept out of git.
    A PostgreSQL URL (a string) opens the shared store (`store_pg.py`)."""
    from ...delegation.session import keep_out_of_git
    from ...storage.opening import open_store

    if isinstance(path, Path) and path.parent.name == ".a2a":
        keep_out_of_git(path.parent)
    return open_store(path)


async def session_id_of(
    store: Store, given: str, where: Path | str, *, missing_ok: bool = False
) -> str:
    """The session `given` names: its id, or any unique prefix of one (the
    tree and `status` print short ids). One it does not name at all is an
    error, or (`missing_ok`) `given` itself."""
    if await store.get_session(given) is not None:
        return given
    matches = [row["id"] for row in await store.list_sessions() if row["id"].startswith(given)]
    if len(matches) == 1:
        return str(matches[0])
    if not matches:
        if missing_ok:
            return given
        raise OrchestratorError(f"no session {given!r} in {where}")
    more = f" and {len(matches) - 10} more" if len(matches) > 10 else ""
    raise OrchestratorError(
        f"session {given!r} is ambiguous in {where}: it starts {len(matches)} sessions "
        f"({', '.join(matches[:10])}{more}); give more of the id"
    )


async def child_id_of(store: Store, session_id: str, given: str) -> str:
    """A child of the session by its id or a unique prefix (the tree prints six characters)."""
    ids = [record.child_id for record in await store.list_children(session_id=session_id)]
    if given in ids:
        return given
    matches = [child_id for child_id in ids if child_id.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise OrchestratorError(f"session {session_id} has no child {given!r}")
    raise OrchestratorError(
        f"child {given!r} is ambiguous: it starts {', '.join(matches)}; give more of the id"
    )


def check_agents(network: Network, agents: list[str], settings: ModelSettings) -> None:
    """Each agent resolves, and each in-process one's role file and model
    script load: bad configuration is a clear error (exit 2) before anything
    runs, not a failed pass halfway through."""
    from ...models import resolve_model
    from ...runtime.conversation import ASK_PARENT
    from ...runtime.factory import CONTROL_TOOL_NAMES
    from ...runtime.roles import find_role
    from ...tools import TOOL_NAMES

    for agent in agents:
        spec = network.resolve(agent)
        if spec.remote:
            continue  # reached at run time; an unreachable agent fails its pass
        role = find_role(spec.role)
        # The check the pass would make when its conversation is built.
        known = (*TOOL_NAMES, ASK_PARENT, *sorted(CONTROL_TOOL_NAMES))
        unknown = [name for name in role.tools if name not in known]
        if unknown:
            where = f" ({role.source})" if role.source else ""
            raise OrchestratorError(
                f"role {role.name!r}{where} lists unknown tools {unknown}; "
                f"known tools: {', '.join(known)}"
            )
        model = role.model
        concrete = {None: settings.default, "default": settings.default, "mini": settings.mini}
        name = concrete.get(model, model) or settings.default
        if settings.offline or name.startswith("scripted"):
            # Only scripted models are built here: they read their file and
            # hold nothing open, where a client for an endpoint would.
            resolve_model(model, settings)


def workdir_of(path: Path) -> Path:
    resolved = path.resolve()
    if not resolved.is_dir():
        raise OrchestratorError(f"work directory {resolved} does not exist")
    return resolved


def reaction_rules(config_dir: Path) -> list[Reaction]:
    from ...control.reactions import load_reactions

    path = config_dir / "reactions.toml"
    return load_reactions(path) if path.exists() else []


PIPELINE_PASSES = ("architect", "coder", "reviewer")


def runner_name(runner: RunnerRecord) -> str:
    """How `status` and `stop` name the process that runs a session."""
    return f"pid {runner.pid} on {runner.host}"
