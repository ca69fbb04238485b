"""What the benchmarks share: role servers as processes, memory of a process,
figures over rounds, and a line saying how busy the machine was."""

from __future__ import annotations

import atexit
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def scratch(prefix: str) -> Path:
    """A work directory for one bench run, removed when the process exits:
    benches write databases there, and CI runs them (`--quick`) on every push."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    return work


def start_servers(
    count: int,
    work: Path,
    script: Sequence[dict[str, Any]],
    *,
    role: str = "coder",
    db: str | None = None,
    flags: Sequence[str] = (),
) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """`count` role servers, each `a2a-orchestrator serve ROLE [flags]` in its
    own process with `script` as its scripted model; their processes and URLs.
    Each has its own SQLite file, or all share the database `db` (replicas)."""
    script_file = work / "server-script.json"
    script_file.write_text(json.dumps(list(script)))
    env = {
        **os.environ,
        "A2A_MODEL_SCRIPT": str(script_file),
        "A2A_MODEL_BASE_URL": "",
        "A2A_MODEL_API_KEY": "",
        "OPENAI_BASE_URL": "",
        "OPENAI_API_KEY": "",
    }
    processes: list[subprocess.Popen[str]] = []
    urls: list[str] = []
    try:
        for index in range(count):
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "a2a_orchestrator.cli",
                    "serve",
                    role,
                    "--port",
                    "0",
                    "--db",
                    db or str(work / f"role-{index}.db"),
                    "--workdir",
                    str(work),
                    *flags,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
            )
            processes.append(process)
            assert process.stdout is not None
            match = re.search(r"serving A2A at (http://\S+)", process.stdout.readline())
            if not match:
                raise SystemExit("a role server did not start")
            urls.append(match.group(1))
    except BaseException:
        stop_servers(processes)
        raise
    return processes, urls


def stop_servers(processes: Iterable[subprocess.Popen[str]]) -> None:
    processes = list(processes)
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def rss_mib(pid: int | str = "self") -> float:
    """The process's resident memory now (VmRSS), in MiB: not a peak, so a
    before/after difference is what the work in between holds."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time another process has used so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat; the split starts at field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_line() -> str:
    """Cores and load average: on a shared machine wall time follows the load,
    CPU time much less, so every run says what it ran beside."""
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {one:.1f} (1 min) {five:.1f} (5 min)"


def collector_line() -> str:
    """This process's garbage collector: as the long-running commands set it
    (`heap.settle`: start-up frozen, young collected less often), or CPython's."""
    frozen = gc.get_freeze_count()
    if frozen:
        return f"thresholds {gc.get_threshold()}, {frozen} objects frozen (as run and serve)"
    return f"thresholds {gc.get_threshold()}, nothing frozen (CPython's defaults)"


def min_median(samples: Sequence[float]) -> tuple[float, float]:
    return min(samples), statistics.median(samples)
