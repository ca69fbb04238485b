"""Where `run_command` runs its commands: a bubblewrap sandbox, and the policy for it.

The operator decides the policy (flags, environment variables, role files on
the server); nothing a caller sends over A2A reaches it. `Sandbox.wrap` turns
a command into a `bwrap` command line that gives the command:

- the work directory read-write, the rest of the filesystem read-only;
- hidden behind an empty tmpfs (or /dev/null, for a file): the work
  directory's `.a2a` (task stores, the orchestrator's store, hooks, reactions,
  roles), `~/.config/a2a-orchestrator`, `/run` and `/var/run` (daemon sockets:
  a read-only mount does not stop `connect()` on a Unix socket), and every
  path in `Sandbox.hidden`;
- read-only: the work directory's `roles/` and `agents/` when they exist
  (an orchestrator started there reads them);
- a fresh `/tmp` (also its `HOME`), `/dev` and `/proc`;
- its own PID, IPC and UTS namespaces, and its own empty network namespace
  unless `Sandbox.network` allows the network;
- no capabilities: bwrap run by root keeps them all otherwise, and root
  could unmount what hides the stores or remount `/` read-write;
- no setuid or setgid bits on any file it makes (`tools.seccomp`): its work
  directory is the host's, and a setuid-root file left there would run as
  root for any local user;
- death with the server: `--die-with-parent` kills it when bwrap's parent
  dies, even by SIGKILL, and the PID namespace ends with its first process.

Not confined: reading whatever else the server's user can read (hide it with
`A2A_SANDBOX_HIDE`), Unix sockets elsewhere than the hidden paths, CPU,
memory and disk use, and, when the network is allowed, everything reachable
from the machine.

Where bubblewrap is missing or cannot create namespaces, `Sandbox.check`
refuses with a `ConfigError` naming the fix; only an explicit opt-out
(`enabled=False`: `--no-sandbox`, `A2A_SANDBOX=off`) runs commands
unconfined. Unconfined, a command still gets a PID namespace of its own
where `unshare` can make one (root, or a container that allows it), so what
it detaches dies with it; elsewhere `describe` says that it survives.
Either way a command gets `environment()`, never the server's own
environment (which holds tokens and API keys).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from . import seccomp
from .base import CALL_MARKER_ENV
from .reserved import READ_ONLY_DIRS, STATE_DIR

__all__ = [
    "HIDE_ENV",
    "NETWORK_ENV",
    "SANDBOX_ENV",
    "STATE_DIR",
    "UNSANDBOXED_NOTE",
    "Launch",
    "Sandbox",
    "pid_namespace",
    "probe",
    "store_paths",
]

SANDBOX_ENV = "A2A_SANDBOX"
"""`off` runs commands without a sandbox (the operator's explicit opt-out)."""
NETWORK_ENV = "A2A_SANDBOX_NETWORK"
"""`on` lets sandboxed commands use the network."""
HIDE_ENV = "A2A_SANDBOX_HIDE"
"""More paths commands must not see, separated by `os.pathsep`."""
UNSANDBOXED_NOTE = "commands run unsandboxed"
"""How a card and the start-up output say that the operator opted out."""

_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SWITCH = {"": None, "on": True, "1": True, "true": True, "off": False, "0": False, "false": False}
_PROBE_TIMEOUT = 10.0


def _switch(environ: Mapping[str, str], name: str) -> bool | None:
    value = environ.get(name, "").strip().lower()
    if value not in _SWITCH:
        raise ConfigError(f"{name}={environ[name]!r}: use on or off")
    return _SWITCH[value]


@dataclass(frozen=True, kw_only=True)
class Sandbox:
    """How `run_command` confines commands; chosen by the operator only."""

    enabled: bool = True
    """False only on the operator's explicit opt-out: commands then run
    unconfined, as the server's user, in the work directory."""
    network: bool = False
    """Whether commands may use the network (`--allow-network`,
    `A2A_SANDBOX_NETWORK=on`, or a role file's `sandbox_network: true`)."""
    hidden: tuple[Path, ...] = ()
    """Paths commands must not see, besides the ones every sandbox hides."""
    bwrap: str = "bwrap"
    """The bubblewrap executable: a name looked up on PATH, or a path."""
    unshare: str = "unshare"
    """util-linux's `unshare`, which gives unsandboxed commands a PID namespace."""

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        no_sandbox: bool = False,
        allow_network: bool = False,
        hidden: Iterable[str | os.PathLike[str]] = (),
    ) -> Sandbox:
        """The operator's settings: command-line flags, else `A2A_SANDBOX*` variables.

        A flag can only loosen what it names (`no_sandbox`, `allow_network`);
        an unknown variable value is a `ConfigError`, not a silent default.
        """
        env = os.environ if environ is None else environ
        enabled = _switch(env, SANDBOX_ENV)
        network = _switch(env, NETWORK_ENV)
        listed = [p for p in env.get(HIDE_ENV, "").split(os.pathsep) if p.strip()]
        return cls(
            enabled=not no_sandbox and enabled is not False,
            network=allow_network or bool(network),
            hidden=tuple(Path(p) for p in [*listed, *hidden]),
        )

    def hiding(self, *paths: str | os.PathLike[str]) -> Sandbox:
        """A copy that also hides `paths` (a server's stores outside the work directory)."""
        return dataclasses.replace(self, hidden=(*self.hidden, *map(Path, paths)))

    def allowing_network(self, allowed: bool) -> Sandbox:
        """A copy with the network allowed too when `allowed` (a role file's setting)."""
        return dataclasses.replace(self, network=True) if allowed else self

    def describe(self) -> str:
        """One line for start-up output."""
        if not self.enabled:
            off = f"OFF: {UNSANDBOXED_NOTE} (--no-sandbox or {SANDBOX_ENV}=off)"
            why_not = pid_namespace(self.unshare)[1]
            if why_not:
                return (
                    f"{off}; no PID namespace for them ({why_not}): a process a command "
                    "detaches (setsid) outlives its timeout, a cancel and the server"
                )
            return f"{off}; each in a PID namespace of its own, which ends with it"
        return f"bubblewrap, network {'allowed' if self.network else 'off'}"

    def check(self) -> None:
        """Raise `ConfigError` naming the fix when commands cannot be sandboxed here.

        Probes bubblewrap once per executable and network setting (a real
        sandbox running /bin/true); nothing to check when opted out.
        """
        if not self.enabled:
            return
        reason = probe(self.bwrap, network=self.network)
        if reason:
            raise ConfigError(
                f"run_command runs commands in a bubblewrap sandbox, but {reason}. "
                "Install it (apt-get install bubblewrap) on a machine that allows "
                "namespaces, or run commands unsandboxed on purpose with --no-sandbox "
                f"or {SANDBOX_ENV}=off"
            )

    def environment(self, marker: str | None = None) -> dict[str, str]:
        """A command's whole environment: the server's own holds tokens and keys.

        `marker` tags every process of one tool call (`CALL_MARKER_ENV`) so a
        later recovery can find what a crashed server left running.
        """
        env = {
            # Where programs are is no secret, and a venv's python must stay found.
            "PATH": os.environ.get("PATH") or _DEFAULT_PATH,
            # The sandbox's /tmp is private and empty; unsandboxed, the
            # server's HOME (with its dotfiles) is still not handed over.
            "HOME": "/tmp" if self.enabled else tempfile.gettempdir(),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            # A model edits a file and reruns its tests within a second; a
            # same-size edit then matches the cached bytecode's mtime and
            # size, and Python would run the stale .pyc.
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if marker:
            env[CALL_MARKER_ENV] = marker
        return env

    @contextlib.contextmanager
    def launch(self, argv: Sequence[str], workdir: Path) -> Iterator[Launch]:
        """`argv` as run under this policy, with what its process must inherit.

        Start the process inside the block: the descriptors in
        `Launch.pass_fds` are closed when it ends.
        """
        if not self.enabled:
            yield Launch(argv=self._unconfined(argv))
            return
        fd = seccomp.program_fd()
        try:
            yield Launch(argv=tuple(self.wrap(argv, workdir, seccomp_fd=fd)), pass_fds=(fd,))
        finally:
            os.close(fd)

    def _unconfined(self, argv: Sequence[str]) -> tuple[str, ...]:
        # Unconfined, but the shell still dies with the server (even by
        # SIGKILL), so a crashed server's command stops where it is; in a
        # PID namespace of its own, what it started dies with it, even a
        # process that left its group and cleared its environment (so that
        # neither the group nor the call's marker finds it).
        setpriv = shutil.which("setpriv")
        prefix = (setpriv, "--pdeathsig", "KILL") if setpriv else ()
        return (*prefix, *pid_namespace(self.unshare)[0], *argv)

    def wrap(self, argv: Sequence[str], workdir: Path, *, seccomp_fd: int) -> list[str]:
        """`argv` as run in this sandbox with `workdir` writable (unconfined,
        ignoring `seccomp_fd`, when opted out).

        `seccomp_fd` reads the filter against setuid files (`seccomp.program_fd`)
        and the process must inherit it: `launch` does both. Creates
        `workdir/.a2a` when missing: a command could otherwise make it and
        plant configuration the server reads later.
        """
        if not self.enabled:
            return list(self._unconfined(argv))
        root = Path(os.path.realpath(workdir))
        state = root / STATE_DIR
        try:
            state.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            pass  # a read-only work directory: nothing can be planted there either
        config = Path(os.path.expanduser("~")) / ".config" / "a2a-orchestrator"
        hidden = [state, config, *self.hidden]
        inside: list[Path] = []
        outside: list[Path] = []
        for path in dict.fromkeys(Path(os.path.realpath(p)) for p in hidden):
            if path == root:
                continue  # hiding the work directory would leave nothing to work on
            (inside if path.is_relative_to(root) else outside).append(path)
        args = [
            shutil.which(self.bwrap) or self.bwrap,
            *("--ro-bind", "/", "/"),
            *("--dev", "/dev"),
            *("--proc", "/proc"),
            *("--tmpfs", "/tmp"),
        ]
        # The fresh /tmp would hide a Python environment kept under /tmp (a
        # checkout's .venv there): commands run this interpreter by its path.
        for path in _interpreter_dirs():
            if path.is_relative_to("/tmp"):
                args += ["--ro-bind", str(path), str(path)]
        for run in ("/run", "/var/run"):
            if os.path.isdir(run) and not os.path.islink(run):
                args += ["--tmpfs", run]
        if self.network:
            # DNS: /etc/resolv.conf often points into /run.
            args += ["--ro-bind-try", "/run/systemd/resolve", "/run/systemd/resolve"]
        # Mounts apply in order: hidden paths above the work directory go
        # first so its bind shows through them; those inside it go after it.
        args += _hide(outside)
        args += ["--bind", str(root), str(root)]
        args += _hide(inside)
        # Role and agent files an orchestrator started in this directory reads
        # (`./roles/`, `./agents/`): a command must not grant a later child
        # tools or the network by writing one.
        for name in READ_ONLY_DIRS:
            path = Path(os.path.realpath(root / name))
            if path.is_dir() and path.is_relative_to(root) and path != root:
                args += ["--ro-bind", str(path), str(path)]
        args += [
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            *([] if self.network else ["--unshare-net"]),
            "--die-with-parent",
            *("--cap-drop", "ALL"),
            *("--seccomp", str(seccomp_fd)),
            # No --new-session: `run_command` already starts bwrap in a new
            # session (setsid), so the sandbox has no controlling terminal to
            # inject input into, and staying in that process group lets the
            # tool signal and wait for every process of the sandbox.
            *("--chdir", str(root)),
            "--",
            *argv,
        ]
        return args


@dataclass(frozen=True, kw_only=True)
class Launch:
    """How to start one command (`Sandbox.launch`)."""

    argv: tuple[str, ...]
    """The command line: bwrap's, or the unconfined command's."""
    pass_fds: tuple[int, ...] = ()
    """Descriptors the process must inherit (bwrap's seccomp filter)."""


@functools.cache
def _interpreter_dirs() -> tuple[Path, ...]:
    """The server's Python environment and interpreter, resolved."""
    found = {Path(os.path.realpath(p)) for p in (sys.prefix, sys.base_prefix)}
    found.add(Path(os.path.realpath(sys.executable)).parent)
    return tuple(sorted(found))


def _hide(paths: Iterable[Path]) -> list[str]:
    """bwrap arguments covering each existing path: a tmpfs on a directory,
    /dev/null on anything else. A missing path needs no cover, and bwrap
    would create its mount point on the real file system."""
    args: list[str] = []
    for path in paths:
        if path.is_dir():
            args += ["--tmpfs", str(path)]
        elif path.exists():
            args += ["--ro-bind", "/dev/null", str(path)]
    return args


def store_paths(path: str | os.PathLike[str]) -> list[Path]:
    """What to hide for an SQLite store at `path`: its `.a2a` directory, or
    the file and the journal files beside it."""
    store = Path(path).expanduser().absolute()
    if store.parent.name == STATE_DIR:
        return [store.parent]
    return [store, *(store.with_name(store.name + s) for s in ("-wal", "-shm", "-journal"))]


@functools.lru_cache(maxsize=16)
def probe(bwrap: str = "bwrap", *, network: bool = False) -> str:
    """Why `bwrap` cannot sandbox commands on this machine; "" when it can.

    Runs /bin/true in the same sandbox a command gets, so a kernel or
    container that forbids namespaces (Docker's default seccomp profile) is
    found at start-up, not at the first command. Cached: the answer does not
    change while the server runs.
    """
    found = shutil.which(bwrap)
    if found is None:
        return f"bubblewrap is not installed ({bwrap!r} not found)"
    unsupported = seccomp.machine_supported()
    if unsupported:
        return unsupported
    with (
        tempfile.TemporaryDirectory(prefix="a2a-sandbox-probe-") as tmp,
        Sandbox(bwrap=found, network=network).launch(["/bin/true"], Path(tmp)) as launch,
    ):
        try:
            result = subprocess.run(
                launch.argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_PROBE_TIMEOUT,
                env={"PATH": _DEFAULT_PATH},
                pass_fds=launch.pass_fds,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{found} could not run ({exc})"
    if result.returncode != 0:
        detail = result.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"{found} cannot create its sandbox here ({detail[-1] if detail else 'no output'})"
    return ""


_PID_NAMESPACE = ("--pid", "--fork", "--kill-child", "--mount-proc")
"""`unshare` options for an unsandboxed command: its own PID namespace (when
its first process ends, the kernel kills every process left in it), ended
when `unshare` dies (`--kill-child`), and a /proc of its own so that a pid
the command reads names a process there."""

_FIRST_PROCESS = ("--foreground", "0")
"""coreutils' `timeout` options (no time limit, no process group of its own)
for the namespace's first process, which runs the command as its child,
passes signals on to it and exits with its status (128 + the signal when a
signal ended it, as bubblewrap reports). The command's shell must not be
that process itself: the kernel gives a namespace's first process only the
signals it handles, so that shell would ignore the SIGTERM that ends a
timed-out or cancelled command (and go on to its next line) and its own
`kill $$`."""


@functools.lru_cache(maxsize=16)
def pid_namespace(unshare: str = "unshare") -> tuple[tuple[str, ...], str]:
    """What runs an unsandboxed command in a PID namespace of its own here,
    and "" as the reason; or no arguments and the reason none can be made.

    Making one needs CAP_SYS_ADMIN (a root server; not in a default Docker
    container). Tried once with /bin/true; cached like `probe`.
    """
    found = shutil.which(unshare)
    if found is None:
        return (), f"util-linux's unshare is not installed ({unshare!r} not found)"
    first = shutil.which("timeout")
    if first is None:
        return (), "coreutils' timeout is not installed"
    argv = (found, *_PID_NAMESPACE, first, *_FIRST_PROCESS)
    try:
        result = subprocess.run(
            [*argv, "/bin/true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_PROBE_TIMEOUT,
            env={"PATH": _DEFAULT_PATH},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return (), f"{found} could not run ({exc})"
    if result.returncode != 0:
        detail = result.stderr.decode("utf-8", "replace").strip().splitlines()
        return (), f"{found} cannot make one here: {detail[-1] if detail else 'no output'}"
    return argv, ""
