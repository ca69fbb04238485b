"""The seccomp filter bubblewrap puts on every sandboxed command: no setuid or setgid bits.

A sandboxed command runs as the server's user (root, under CI or a root
service), and its work directory is the host's: a file it marks setuid
there stays setuid-root on the host, for any local user to run, whatever
the sandbox mounts `nosuid`. So the bits are refused where they are made:

- `chmod`, `fchmod`, `fchmodat`, `fchmodat2`, `mknod`, `mknodat`, `creat`,
  and `open` and `openat` with O_CREAT or O_TMPFILE (a new file takes the
  mode asked for, setuid included) fail with EPERM when the mode has S_ISUID
  or S_ISGID;
- `openat2` carries its mode in a struct a filter cannot read, and io_uring
  opens files without a system call per file: both fail with ENOSYS, which
  libraries treat as an older kernel and fall back to `openat`.

Nothing else a command can do sets the bits: copying or extracting with
modes kept goes through the calls above, and setting file capabilities or
changing owners needs capabilities the sandbox drops.

`program()` is a classic BPF program (`struct sock_filter[]`), the format
`bwrap --seccomp FD` reads: built here with `struct` rather than through
libseccomp, whose own Python binding is not on PyPI (`pyseccomp`, a ctypes
wrapper, was last released in 2021 and needs the C library). It knows x86_64 (and
x32 and i386 code on it) and aarch64 (and 32-bit ARM code on it); a
system call from any other architecture kills the process, so on another
machine sandboxed commands do not run at all (`machine_supported`).
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import struct
from collections.abc import Mapping

__all__ = ["machine_supported", "program", "program_fd"]

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
_NR = 0
_ARCH = 4


def _arg_low(index: int) -> int:
    """Offset of argument `index`'s low 32 bits (little-endian machines only)."""
    return 16 + 8 * index


# Classic BPF opcodes (linux/bpf_common.h).
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_ALLOW = 0x7FFF0000  # SECCOMP_RET_ALLOW
_KILL = 0x80000000  # SECCOMP_RET_KILL_PROCESS
_ERRNO = 0x00050000  # SECCOMP_RET_ERRNO | errno

_SETID_BITS = 0o6000  # S_ISUID | S_ISGID
_X32_BIT = 0x40000000  # __X32_SYSCALL_BIT: x32 calls are x86_64's numbers with it set

_UNSUPPORTED = -1
"""In a table: the call fails with ENOSYS whatever its arguments."""

# For each architecture (its AUDIT_ARCH_* value): system call number -> the
# index of its mode argument, or _UNSUPPORTED. Numbers from the kernel's
# syscall tables; openat2 (437), io_uring (425-427) and fchmodat2 (452) have
# one number on every architecture.
_COMMON = {437: _UNSUPPORTED, 425: _UNSUPPORTED, 426: _UNSUPPORTED, 427: _UNSUPPORTED, 452: 2}
_X86_64 = 0xC000003E
_I386 = 0x40000003
_AARCH64 = 0xC00000B7
_ARM = 0x40000028
_TABLES: Mapping[int, Mapping[int, int]] = {
    # open, creat, chmod, fchmod, mknod, openat, mknodat, fchmodat
    _X86_64: {2: 2, 85: 1, 90: 1, 91: 1, 133: 1, 257: 3, 259: 2, 268: 2, **_COMMON},
    _I386: {5: 2, 8: 1, 15: 1, 94: 1, 14: 1, 295: 3, 297: 2, 306: 2, **_COMMON},
    # The generic table has no open, creat, chmod or mknod.
    _AARCH64: {52: 1, 56: 3, 33: 2, 53: 2, **_COMMON},
    _ARM: {5: 2, 8: 1, 15: 1, 94: 1, 14: 1, 322: 3, 324: 2, 333: 2, **_COMMON},
}
# The opens among them (open, openat): their flags are the argument before
# the mode, which the kernel ignores unless the flags create a file, so a
# plain open with stray bits there (a raw `syscall` leaves the register as it
# was) must go through.
_OPENS: Mapping[int, frozenset[int]] = {
    _X86_64: frozenset({2, 257}),
    _I386: frozenset({5, 295}),
    _AARCH64: frozenset({56}),
    _ARM: frozenset({5, 322}),
}
_CREATES = 0o100 | 0o20000000  # O_CREAT | __O_TMPFILE, alike on these architectures
_MACHINES = {"x86_64": _X86_64, "amd64": _X86_64, "aarch64": _AARCH64, "arm64": _AARCH64}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    # struct sock_filter { __u16 code; __u8 jt; __u8 jf; __u32 k; }
    return struct.pack("=HBBI", code, jt, jf, k)


def _arch_block(arch: int, table: Mapping[int, int], opens: frozenset[int]) -> list[bytes]:
    """Instructions for one architecture; every path ends in a return."""
    block = [_insn(_LD_W_ABS, _NR)]
    if arch == _X86_64:
        # x32 numbers the shared calls as x86_64 does, plus the x32 bit.
        block.append(_insn(_AND_K, ~_X32_BIT & 0xFFFFFFFF))
    for nr, mode_arg in sorted(table.items()):
        if mode_arg == _UNSUPPORTED:
            body = [_insn(_RET_K, _ERRNO | errno.ENOSYS)]
        else:
            body = []
            if nr in opens:
                # Its flags create nothing: allowed (the last instruction below).
                body += [
                    _insn(_LD_W_ABS, _arg_low(mode_arg - 1)),
                    _insn(_JSET_K, _CREATES, jt=0, jf=3),
                ]
            body += [
                _insn(_LD_W_ABS, _arg_low(mode_arg)),
                _insn(_JSET_K, _SETID_BITS, jt=0, jf=1),
                _insn(_RET_K, _ERRNO | errno.EPERM),
                _insn(_RET_K, _ALLOW),
            ]
        block.append(_insn(_JEQ_K, nr, jt=0, jf=len(body)))
        block += body
    block.append(_insn(_RET_K, _ALLOW))
    return block


@functools.cache
def program() -> bytes:
    """The filter, as `bwrap --seccomp` reads it."""
    insns = [_insn(_LD_W_ABS, _ARCH)]
    for arch, table in _TABLES.items():
        block = _arch_block(arch, table, _OPENS[arch])
        # A jump offset is one byte: keep each block within reach.
        assert len(block) < 256
        insns.append(_insn(_JEQ_K, arch, jt=0, jf=len(block)))
        insns += block
    insns.append(_insn(_RET_K, _KILL))
    return b"".join(insns)


def machine_supported() -> str:
    """Why the filter cannot run on this machine; "" when it can."""
    machine = platform.machine().lower()
    if machine in _MACHINES:
        return ""
    return (
        f"its seccomp filter against setuid files knows x86_64 and aarch64, "
        f"not this machine ({machine or 'unknown'})"
    )


def program_fd() -> int:
    """A new descriptor reading `program()` from its start, for one bwrap.

    bwrap reads its filter to the end, so each launch needs a descriptor
    (and file offset) of its own. The caller passes it to the child and
    closes it.
    """
    fd = os.memfd_create("a2a-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program())
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
