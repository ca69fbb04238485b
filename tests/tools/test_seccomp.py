"""No file a sandboxed command makes carries setuid or setgid bits on the host.

Real bubblewrap and real files: a command tries every way it has to make a
setuid or setgid file, and what it made is then run as an unprivileged user
(`setpriv`), which is what any local user could do with it. The filter's
branches for the architectures this machine cannot run are checked by
evaluating the program itself (`verdict`).
"""

from __future__ import annotations

import errno
import os
import platform
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from a2a_orchestrator.errors import ToolError
from a2a_orchestrator.tools import Sandbox, Tool, Workspace, build_tools, seccomp
from a2a_orchestrator.tools.sandbox import probe

pytestmark = pytest.mark.anyio

WHY_NOT = probe()
needs_bwrap = pytest.mark.skipif(
    bool(WHY_NOT),
    reason=f"needs bubblewrap (Debian package `bubblewrap`) able to create namespaces: {WHY_NOT}",
)
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
SETID = stat.S_ISUID | stat.S_ISGID
PY = shlex.quote(sys.executable)


@pytest.fixture
def work() -> Iterator[Path]:
    """A work directory on the host's file system that an unprivileged user
    can reach: pytest's tmp_path is under /tmp (the sandbox's own tmpfs)
    and private to the user running the tests."""
    parent = Path(tempfile.mkdtemp(prefix="a2a-setuid-test-", dir="/var/tmp"))
    parent.chmod(0o755)
    (parent / "work").mkdir(mode=0o755)
    yield parent / "work"
    shutil.rmtree(parent)


def command_tool(work: Path) -> Tool:
    (tool,) = build_tools(["run_command"], Workspace(work), sandbox=Sandbox())
    return tool


async def run(tool: Tool, command: str) -> str:
    """The command's output; a failed command's too (its ToolError text)."""
    with anyio.fail_after(30):
        try:
            return await tool.run({"command": command})
        except ToolError as exc:
            return str(exc)


def python(code: str) -> str:
    return f"{PY} -c {shlex.quote(code)}"


SHELL_COPIES = ["chmod_sh", "chmod_g_sh", "symbolic_sh", "installed_sh", "py_chmod_sh"]
"""Copies of /bin/sh the command tries to make setuid or setgid."""

ATTEMPTS = "; ".join(
    [
        *(f"cp /bin/sh {name}" for name in SHELL_COPIES if name != "installed_sh"),
        "chmod 4755 chmod_sh",
        "chmod 2755 chmod_g_sh",
        "chmod u+s,g+s symbolic_sh",
        "install -m 4755 /bin/sh installed_sh",
        # Kept modes: a copy of a setuid binary the host has.
        'cp -p "$(find /usr/bin /bin -maxdepth 1 -perm -4000 -type f | head -n 1)" kept_mode',
        python(
            "import os, stat\n"
            "tries = [\n"
            "    lambda: os.chmod('py_chmod_sh', 0o6755),\n"
            "    lambda: os.close(os.open('py_open', os.O_CREAT | os.O_WRONLY, 0o4755)),\n"
            "    lambda: os.close(os.open('py_open_g', os.O_CREAT | os.O_WRONLY, 0o2755)),\n"
            "    lambda: os.mknod('py_mknod', stat.S_IFREG | 0o4755),\n"
            "]\n"
            "for t in tries:\n"
            "    try:\n"
            "        t()\n"
            "        print('MADE')\n"
            "    except OSError as exc:\n"
            "        print('refused', exc.errno)\n"
        ),
        "echo finished",
    ]
)


def setid_files(root: Path) -> list[str]:
    return [
        f"{path.relative_to(root)} {oct(path.lstat().st_mode)}"
        for path in root.rglob("*")
        if path.lstat().st_mode & SETID
    ]


@needs_bwrap
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs what the command made as another user: needs root and setpriv (util-linux)",
)
async def test_no_file_a_command_makes_is_setuid(work: Path) -> None:
    out = await run(command_tool(work), ATTEMPTS)
    assert "finished" in out
    # What the command made, run by a user who is not root: no euid 0.
    ran = {}
    for name in SHELL_COPIES:
        if (work / name).exists():
            result = subprocess.run(
                [*NOBODY, str(work / name), "-p", "-c", "id"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            ran[name] = result.stdout + result.stderr
    assert not [out for out in ran.values() if "euid=0" in out or "egid=0" in out], ran
    # The copies ran (install's, refused its mode, may be left unreadable to others).
    assert all("uid=65534(" in ran[name] for name in SHELL_COPIES if name != "installed_sh"), ran
    assert setid_files(work) == []
    # Each attempt was refused where it was made, not undone afterwards.
    assert "MADE" not in out
    assert out.count(f"refused {errno.EPERM}") == 4
    assert out.count("Operation not permitted") >= 5


@needs_bwrap
async def test_ordinary_modes_still_work(work: Path) -> None:
    out = await run(
        command_tool(work),
        "set -e; echo x > f; chmod 755 f; chmod u-x,g+w f; mkdir d; chmod 700 d; "
        "cp -p f g; install -m 750 f h; "
        + python(
            # O_NONBLOCK is the same bit as S_ISUID, one argument earlier.
            "import os; os.close(os.open('n', os.O_CREAT | os.O_WRONLY | os.O_NONBLOCK, 0o640))"
        )
        + "; stat -c '%n %a' f g h d n",
    )
    assert out.splitlines()[:5] == ["f 675", "g 675", "h 750", "d 700", "n 640"], out


@needs_bwrap
@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 and i386 calls exist on x86_64")
async def test_other_entry_points_are_covered(work: Path) -> None:
    (work / "f").write_text("x")
    out = await run(
        command_tool(work),
        python(
            "import ctypes\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "def call(*args):\n"
            "    ctypes.set_errno(0)\n"
            "    return libc.syscall(*args), ctypes.get_errno()\n"
            # chmod by its x32 number, openat2 and io_uring_setup.
            "print('x32', *call(0x40000000 | 90, b'f', 0o4755))\n"
            # A plain openat with stray bits where a creating one has its mode.
            "print('openat', call(257, -100, b'f', 0, 0o4755)[0] >= 0)\n"
            "print('openat2', *call(437, -100, b'g', 0, 0))\n"
            "print('io_uring', *call(425, 1, 0))\n"
        ),
    )
    assert f"x32 -1 {errno.EPERM}" in out
    assert "openat True" in out
    assert f"openat2 -1 {errno.ENOSYS}" in out
    assert f"io_uring -1 {errno.ENOSYS}" in out
    assert setid_files(work) == [] and not (work / "g").exists()


# --- the program, for every architecture it knows ---------------------------------------

X86_64, I386, AARCH64, ARM = 0xC000003E, 0x40000003, 0xC00000B7, 0x40000028
EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
ALLOW = 0x7FFF0000
KILL = 0x80000000


def verdict(arch: int, nr: int, *args: int) -> int:
    """What the kernel's classic-BPF machine returns for one system call.

    Only x86_64 runs here, so the other architectures' branches are checked
    by evaluating the program: each instruction the generator emits, as
    linux/filter.h defines it.
    """
    data = struct.pack("=iIQ6Q", nr, arch, 0, *args, *[0] * (6 - len(args)))
    program = seccomp.program()
    pc, acc = 0, 0
    for _ in range(len(program) // 8):
        code, jt, jf, k = struct.unpack_from("=HBBI", program, pc * 8)
        if code == 0x20:  # load a word of seccomp_data
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == 0x54:  # and
            acc &= k
        elif code == 0x15:  # jump if equal
            pc += jt if acc == k else jf
        elif code == 0x45:  # jump if any bit set
            pc += jt if acc & k else jf
        elif code == 0x06:  # return
            return k
        else:
            pytest.fail(f"unexpected instruction {code:#x}")
        pc += 1
    pytest.fail("the program ran off its end")


# (arch, name, number, index of the mode argument)
MODE_CALLS = [
    (X86_64, "open", 2, 2),
    (X86_64, "creat", 85, 1),
    (X86_64, "chmod", 90, 1),
    (X86_64, "fchmod", 91, 1),
    (X86_64, "mknod", 133, 1),
    (X86_64, "openat", 257, 3),
    (X86_64, "mknodat", 259, 2),
    (X86_64, "fchmodat", 268, 2),
    (X86_64, "fchmodat2", 452, 2),
    (X86_64, "x32 chmod", 0x40000000 | 90, 1),
    (I386, "open", 5, 2),
    (I386, "creat", 8, 1),
    (I386, "mknod", 14, 1),
    (I386, "chmod", 15, 1),
    (I386, "fchmod", 94, 1),
    (I386, "openat", 295, 3),
    (I386, "mknodat", 297, 2),
    (I386, "fchmodat", 306, 2),
    (I386, "fchmodat2", 452, 2),
    (AARCH64, "mknodat", 33, 2),
    (AARCH64, "fchmod", 52, 1),
    (AARCH64, "fchmodat", 53, 2),
    (AARCH64, "openat", 56, 3),
    (AARCH64, "fchmodat2", 452, 2),
    (ARM, "open", 5, 2),
    (ARM, "creat", 8, 1),
    (ARM, "mknod", 14, 1),
    (ARM, "chmod", 15, 1),
    (ARM, "fchmod", 94, 1),
    (ARM, "openat", 322, 3),
    (ARM, "mknodat", 324, 2),
    (ARM, "fchmodat", 333, 2),
    (ARM, "fchmodat2", 452, 2),
]


OPENS = [call for call in MODE_CALLS if call[1] in ("open", "openat")]
"""Their flags are the argument before the mode, which counts only when they create."""
O_CREAT, O_TMPFILE = 0o100, 0o20200000  # the same on all four architectures


@pytest.mark.parametrize(("arch", "name", "nr", "mode_arg"), MODE_CALLS)
def test_the_program_refuses_setid_modes(arch: int, name: str, nr: int, mode_arg: int) -> None:
    def with_mode(mode: int) -> list[int]:
        # Every other argument holds the setuid bit: only the mode may count
        # (an open's flags create the file besides).
        args = [stat.S_ISUID] * 6
        args[mode_arg] = mode
        if (arch, name, nr, mode_arg) in OPENS:
            args[mode_arg - 1] |= O_CREAT
        return args

    assert verdict(arch, nr, *with_mode(0o4755)) == EPERM, name
    assert verdict(arch, nr, *with_mode(0o2750)) == EPERM, name
    assert verdict(arch, nr, *with_mode(stat.S_IFREG | 0o6000)) == EPERM, name
    assert verdict(arch, nr, *with_mode(0o755)) == ALLOW, name
    assert verdict(arch, nr, *with_mode(stat.S_IFREG | 0o1777)) == ALLOW, name


@pytest.mark.parametrize(("arch", "name", "nr", "mode_arg"), OPENS)
def test_an_open_that_creates_nothing_goes_through(
    arch: int, name: str, nr: int, mode_arg: int
) -> None:
    # The kernel ignores such an open's mode, whatever bits are there.
    def opening(flags: int) -> list[int]:
        args = [0] * 6
        args[mode_arg - 1] = flags
        args[mode_arg] = 0o6755
        return args

    assert verdict(arch, nr, *opening(os.O_RDWR | stat.S_ISUID)) == ALLOW, name
    assert verdict(arch, nr, *opening(O_TMPFILE | os.O_RDWR)) == EPERM, name
    assert verdict(arch, nr, *opening(O_CREAT)) == EPERM, name


@pytest.mark.parametrize("arch", [X86_64, I386, AARCH64, ARM])
def test_the_program_allows_the_rest_and_kills_unknown_architectures(arch: int) -> None:
    for nr in (437, 425, 426, 427):  # openat2, io_uring
        assert verdict(arch, nr, 0, 0, 0, 0o4755) == ENOSYS
    # read/write/exit-like numbers with a setuid-looking argument go through.
    for nr in (0, 1, 3, 60, 63, 93, 231):
        if (arch, nr) not in {(c[0], c[2]) for c in MODE_CALLS}:
            assert verdict(arch, nr, 0o4755, 0o4755, 0o4755, 0o4755) == ALLOW
    assert verdict(0xC0000015, 90, 0, 0o4755) == KILL  # ppc64: no table, no calls


def test_the_filter_reaches_bwrap_through_a_fresh_descriptor() -> None:
    fds = [seccomp.program_fd() for _ in range(2)]
    try:
        # Each starts at offset 0 and reads the whole program.
        assert [os.read(fd, 1 << 16) for fd in fds] == [seccomp.program()] * 2
        assert not os.get_inheritable(fds[0])
    finally:
        for fd in fds:
            os.close(fd)
