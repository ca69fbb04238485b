"""Every benchmark still runs: each script in its quick mode, as a subprocess,
printing its figures. Nothing here checks a figure's value (speed is measured
in bench/, never asserted), only that the figures are there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

# Each script's quick run, and lines its output must hold (regular expressions).
FIGURES = {
    "startup.py": [r"--help\s+wall min\s+[\d.]+ s", r"status\s+wall min\s+[\d.]+ s.*cpu min"],
    "delegation.py": [
        r"bare SDK\s+[\d.]+ ms",
        r"in-process\s+[\d.]+ ms",
        r"local\s+[\d.]+ ms",
        r"remote\s+[\d.]+ ms",
        r"SDK->app\s+[\d.]+ ms",
        r"remote delegation / bare SDK .*: wall [\d.]+x, cpu [\d.]+x",
        r"SDK->replay\s+[\d.]+ ms",
        r"by the role server -?[\d.]+ ms \(its frames -?[\d.]+ ms, its app and task store on",
        r"app\+replay\s+[\d.]+ ms",
        r"remote without the role executor's own work, .*: [\d.]+x",
        r"a frame costs a2a-sdk, both ends .*: -?[\d.]+ ms",
        r"bare gRPC\s+[\d.]+ ms",
        r"over gRPC, remote / bare gRPC \(cpu medians\): [\d.]+x; remote gRPC / bare SDK",
        r"local child overhead.*: wall -?[\d.]+ ms",
    ],
    "fanout.py": [
        r"20 children: wall\s+[\d.]+ s.*children/s.*most in flight \d+",
        r"orchestrator\s+RSS before .* per child\s+-?[\d.]+ KiB",
        r"server 1\s+RSS before .* per child\s+-?[\d.]+ KiB",
    ],
    "relay.py": [r"local\s+\d+ events: events/s min\s+\d+", r"remote\s+\d+ events: events/s"],
    "integers.py": [
        r"text delta \(SSE\)\s+[\d,]+ bytes\s+added cpu per frame min\s+-?[\d.]+ us",
        r"GetTask, 200 events \(JSON\)\s+[\d,]+ bytes.*SDK making it\s+[\d.]+ us",
    ],
    "races.py": [r"races: 500 trials, 0 escaped"],
    "tracing_cost.py": [
        r"span\s+off\s+[\d.]+ us",
        r"local\s+on - off, medians: wall [+-][\d.]+ ms",
        r"remote\s+on - off, medians: wall [+-][\d.]+ ms .* cpu [+-][\d.]+ ms",
    ],
    "replicas.py": [
        rf"{n} replica\(s\): 20 children in\s+[\d.]+ s,\s+[\d.]+ children/s" for n in (1, 2, 3)
    ],
    "notify.py": [
        rf"{mode}\s+at rest\s+[\d.]+ statements/s \([\d.]+ per subscription\); event latency "
        r"median [\d.]+ ms, p90 [\d.]+ ms, max [\d.]+ ms; -?[\d.]+ statements per event"
        for mode in ("polling", "notify")
    ]
    + [r"notify\s+extrapolated to 100 replicas x 1000 subscriptions: [\d,]+ statements/s"],
    "taskstore.py": [
        r"role server \(results at once, calls held\)\s+wall min [\d.]+ s.*per frame.* \d+ us",
        r"every frame written\s+wall min [\d.]+ s.*cpu min [\d.]+ s",
        r"get of the \d+-message task: from memory median [\d.]+ ms, from the file median",
    ],
    "hostile.py": [
        r"trickle: 30 connections, 30 answered 408 and closed [\d.]+-[\d.]+ s after opening",
        r"card while trickling: \d+ requests, median [\d.]+ ms, max [\d.]+ ms",
        r"server fds \d+ before, \d+ during, \d+ after; RSS",
        r"silent: \d+ connections sending nothing, \d+ closed at once",
        r"streams: one caller asked for 34, 32 accepted \(cap 32\)",
        r"the next: too many open streams: this caller has 32, the limit is 32 per caller",
        r"uploads: 20 unauthenticated 3.75 MiB uploads to /a2a/push/x, 20 refused before",
        r"uploads: 20 unauthenticated 3.75 MiB uploads to /, 20 refused before",
    ],
    "trials.py": [r"SIGKILL trials: 2 \(1 orchestrator, 1 role server\).*lost 0, re-run 0"],
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", sorted(FIGURES))
def test_bench_quick_mode_prints_its_figures(script: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for figure in FIGURES[script]:
        assert re.search(figure, done.stdout), (figure, done.stdout)
