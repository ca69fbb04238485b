"""The README's and docs/' examples run: every fenced ```python, ```toml
and ```markdown block of README.md and docs/*.md is executed or loaded
here, so the guide cannot drift from the code.

- Python blocks run as real scripts in a subprocess, against real servers
  on 127.0.0.1 (`serve` processes) with the scripted offline model (no
  model endpoint: the only fake). The README writes the orchestrator's
  default address, `http://127.0.0.1:9100`; the test starts the server on
  a free port instead (9100 may be taken on a shared machine) and replaces
  that one string in the example, which is the only substitution made. A
  README example without the string fails the test rather than reaching
  whatever listens on 9100.
- TOML blocks are loaded by the loader of the file they document (agents,
  hooks, reactions); the hooks example also runs its commands.
- The role examples (```markdown blocks) are loaded as role files; the
  full one is given a conversation, which checks its tools.

A block of a kind this file does not know fails `test_every_block_is_tested`.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from support.servers import served_url

from a2a_orchestrator.control.reactions import load_reactions
from a2a_orchestrator.delegation.hooks import CompleteInfo, Deny, SpawnInfo, load_hook_file
from a2a_orchestrator.delegation.network import load_agent_file
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.factory import RoleRuntime, role_conversation
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.tools import Sandbox, Workspace

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
"""The guide: the README and the pages it sends readers on to."""


def guide_text() -> str:
    return "\n".join(page.read_text(encoding="utf-8") for page in PAGES)


CLI = [sys.executable, "-m", "a2a_orchestrator.cli"]
OFFLINE = {
    "A2A_MODEL_BASE_URL": "",
    "A2A_MODEL_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "OPENAI_API_KEY": "",
    "A2A_MODEL_SCRIPT": "",
}
ORCHESTRATOR_URL = "http://127.0.0.1:9100"


def blocks(language: str) -> list[str]:
    text = guide_text()
    return [
        match.group(2)
        for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)
        if match.group(1) == language
    ]


def one_block(language: str, marker: str) -> str:
    """The one `language` block containing `marker`."""
    found = [block for block in blocks(language) if marker in block]
    assert len(found) == 1, f"expected one ```{language} block with {marker!r}, got {len(found)}"
    return found[0]


# Which test covers which block, by a string only that block contains.
PYTHON = {
    "client": "A2ACardResolver",
    "session": "session.spawn_child(",
    "memory": "MemoryDelegate(architect)",
    "budgets": "SpawnPolicy([read_only_reviewer])",
}
TOML = {
    "agents": 'url = "http://coder:9102"',
    "hooks": "[[hook]]",
    "reactions": "[[reaction]]",
    "callers": "[callers.reports-team]",
    "client credentials": 'client_id = "orchestrator"',
    "policy": 'deny = "agents do not deploy"',
    "prices": '[models."gpt-4o"]',
    "signed card": "require_signature = true",
}
MARKDOWN = {
    "role": "name: coder",
    "model limits": "model_timeout:",
    "first-hour role": "You are a test-first coder",
}


def test_every_block_is_tested() -> None:
    for language, known in (("python", PYTHON), ("toml", TOML), ("markdown", MARKDOWN)):
        found = blocks(language)
        assert found, f"no ```{language} block in the README or docs/"
        for block in found:
            covered = [name for name, marker in known.items() if marker in block]
            assert len(covered) == 1, f"a ```{language} block no test covers:\n{block}"


# -- Python: real scripts against real servers ------------------------------------


@contextmanager
def serving(what: str, workdir: Path) -> Iterator[str]:
    """`a2a-orchestrator serve WHAT` on a free port of 127.0.0.1; its URL."""
    process = subprocess.Popen(
        [*CLI, "serve", what, "--port", "0", "--workdir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=workdir,
        env={**os.environ, **OFFLINE},
    )
    try:
        yield served_url(process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def run_example(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    script = cwd / "example.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env={**os.environ, **OFFLINE, **(env or {})},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_a2a_client_example_talks_to_the_orchestrator(tmp_path: Path) -> None:
    code = one_block("python", PYTHON["client"])
    assert code.count(ORCHESTRATOR_URL) == 1, "the example no longer names the default address"
    with serving("orchestrator", tmp_path) as url:
        out = run_example(code.replace(ORCHESTRATOR_URL, url), tmp_path)
    # It streamed the pipeline's children and ended with the result: offline,
    # every pass says it was not worked on and skips.
    assert "child_event" in out
    assert "TASK_STATE_COMPLETED" in out and "TASK_SKIPPED" in out


@pytest.mark.parametrize("coder", ["in-process", "remote"])
def test_the_session_example_runs_in_process_and_remote(coder: str, tmp_path: Path) -> None:
    # Unchanged code; the network decides where the coder runs: the shipped
    # agents are in-process, and A2A_AGENT_CODER_URL points the coder at a
    # role server (what the README's "The network" section documents).
    code = one_block("python", PYTHON["session"])
    if coder == "remote":
        with serving("coder", tmp_path) as url:
            out = run_example(code, tmp_path, env={"A2A_AGENT_CODER_URL": url})
    else:
        out = run_example(code, tmp_path)
    kinds = [line.split(maxsplit=1)[0] for line in out.splitlines() if line[:1].isalpha()]
    # The coder's events as they came; the reviewer's handle ran too.
    assert kinds[0] == "started" and "done" in kinds, out
    stored = subprocess.run(
        [*CLI, "children", "--store", ".a2a/orchestrator.db", *session_of(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={**os.environ, **OFFLINE},
    )
    _header, *lines, total = stored.stdout.splitlines()
    assert total.startswith("session total: "), stored
    assert [line.split()[1] for line in lines] == ["coder", "reviewer"], stored
    assert all("completed" in line for line in lines)
    where = lines[0].split()[3]
    assert where.startswith("http://127.0.0.1:") if coder == "remote" else where == "in-process"


def test_the_memory_delegate_example_answers_without_a_model(tmp_path: Path) -> None:
    code = one_block("python", PYTHON["memory"])
    assert run_example(code, tmp_path) == "design for: a --verbose flag\n"


def session_of(workdir: Path) -> list[str]:
    """The one session the example made, from the store it wrote."""
    with sqlite3.connect(workdir / ".a2a" / "orchestrator.db") as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM sessions")]
    assert len(ids) == 1
    return ids


def test_the_budgets_example_prints_its_usage_report(tmp_path: Path) -> None:
    code = one_block("python", PYTHON["budgets"])
    out = run_example(code, tmp_path)
    # The report the README shows, token for token (only wall time varies,
    # and it is not printed).
    shown = guide_text().split("Its output:", 1)[1]
    expected = shown.split("```\n", 2)[1].split("```", 1)[0]
    assert out == expected
    stored = subprocess.run(
        [*CLI, "children", "--store", ".a2a/orchestrator.db", *session_of(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={**os.environ, **OFFLINE},
    )
    lines = stored.stdout.splitlines()[1:]  # under the header
    assert "4800tok (subtree 7200tok)" in lines[0] and "1200tok" in lines[1], stored


# -- TOML: the loaders of the files they document ------------------------------------


@pytest.mark.anyio
async def test_the_policy_example_narrows_and_denies(tmp_path: Path) -> None:
    from a2a_orchestrator.delegation.base import ChildConfig
    from a2a_orchestrator.delegation.network import AgentSpec
    from a2a_orchestrator.delegation.policy import SpawnRequest, load_policy_file
    from a2a_orchestrator.errors import SpawnRefusedError

    path = tmp_path / "policy.toml"
    path.write_text(one_block("toml", TOML["policy"]))
    policy = load_policy_file(path)

    def request(agent: AgentSpec) -> SpawnRequest:
        config = ChildConfig(role=agent.name, prompt="go")
        return SpawnRequest(
            session_id="s", parent_id="", parent_role="", agent=agent, config=config
        )

    reviewer = await policy.apply(request(AgentSpec(name="reviewer", role="reviewer")))
    remote = await policy.apply(request(AgentSpec(name="coder", role="coder", url="http://c:1")))
    local = await policy.apply(request(AgentSpec(name="coder", role="coder")))
    assert reviewer.tools is not None and set(reviewer.tools) <= {"read_file", "list_files", "grep"}
    assert reviewer.network is False and reviewer.budget is None
    assert remote.budget is not None and remote.budget.as_dict() == {
        "tokens": 200000,
        "seconds": 900.0,
        "model_calls": 60,
    }
    assert local.budget is None and local.tools is None
    with pytest.raises(SpawnRefusedError, match="agents do not deploy"):
        await policy.apply(request(AgentSpec(name="deployer", role="deployer")))


def test_the_price_table_example_loads(tmp_path: Path) -> None:
    from a2a_orchestrator.models.base import Usage
    from a2a_orchestrator.runtime.budgets import PriceTable

    path = tmp_path / "prices.toml"
    path.write_text(one_block("toml", TOML["prices"]))
    price = PriceTable.from_env({"A2A_PRICES": str(path)}).price("gpt-4o")
    assert price is not None
    assert price.cost(Usage(input_tokens=1_000_000, output_tokens=100_000)) == 3.5


def test_the_agents_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "agents" / "coder.toml"
    path.parent.mkdir()
    path.write_text(one_block("toml", TOML["agents"]))
    spec = load_agent_file(path, environ={})
    assert (spec.name, spec.role, spec.url, spec.port) == (
        "coder",
        "coder",
        "http://coder:9102",
        9102,
    )
    assert spec.token_env == "CODER_TOKEN" and spec.remote


def test_the_client_credentials_example_loads(tmp_path: Path) -> None:
    # The README shows the lines an agent file adds; the agent's own lines go first.
    path = tmp_path / "agents" / "coder.toml"
    path.parent.mkdir()
    head = 'name = "coder"\nrole = "coder"\nurl = "http://coder:9102"\n'
    path.write_text(head + one_block("toml", TOML["client credentials"]))
    spec = load_agent_file(path, environ={})
    assert spec.token_url == "https://idp.example/oauth/token"
    assert (spec.client_id, spec.scope, spec.audience) == ("orchestrator", "a2a", "coder-api")


def test_the_signed_card_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "agents" / "coder.toml"
    path.parent.mkdir()
    path.write_text(one_block("toml", TOML["signed card"]))
    spec = load_agent_file(path, environ={})
    assert spec.card_key == str(path.parent / "keys" / "coder.pub.pem")
    assert spec.require_signature and spec.url == "https://coder.example"


def test_the_callers_example_loads(tmp_path: Path) -> None:
    from a2a_orchestrator.server.auth.callers import CallerFile, hash_token

    # The README abbreviates the hash; a real one (as `token add` writes) goes in.
    token = "a-token-for-the-readme-test"
    text = re.sub(
        r'token_hash = "[^"]*"',
        f'token_hash = "{hash_token(token)}"',
        one_block("toml", TOML["callers"]),
    )
    path = tmp_path / "callers.toml"
    path.write_text(text)
    callers = CallerFile(path)
    caller = callers.match(token)
    assert caller is not None and caller.owner == "reports-team"
    limits = callers.limits(caller)
    assert (limits.concurrent_tasks, limits.tasks_per_minute) == (2, 30)
    assert limits.tokens_per_day == 2_000_000


def test_the_reactions_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "reactions.toml"
    path.write_text(one_block("toml", TOML["reactions"]))
    first, second = load_reactions(path)
    assert first.role == "coder" and first.inject and first.signal is None
    assert second.signal == "terminate" and second.inject is None


@pytest.mark.anyio
async def test_the_hooks_example_loads_and_its_commands_run(tmp_path: Path) -> None:
    state = tmp_path / ".a2a"
    state.mkdir()
    (state / "hooks.toml").write_text(one_block("toml", TOML["hooks"]))
    # The two scripts the example names, written as a user would: deny
    # spawning a coder; keep a line per completed child.
    (state / "check.py").write_text(
        "import json, sys\n"
        "payload = json.load(sys.stdin)\n"
        "if payload['role'] == 'coder':\n"
        "    sys.exit('no coders today')\n"
    )
    (state / "record.py").write_text(
        "import json, sys\n"
        "payload = json.load(sys.stdin)\n"
        "open('completed.txt', 'a').write(payload['child_id'] + ' ' + payload['status'] + '\\n')\n"
    )
    hooks = load_hook_file(state / "hooks.toml")
    info = {"session_id": "s", "parent_id": "p", "prompt": "go"}
    with anyio.fail_after(60):
        denied = await hooks.before_spawn(SpawnInfo(role="coder", **info))
        allowed = await hooks.before_spawn(SpawnInfo(role="reviewer", **info))
        await hooks.notify(
            "complete",
            CompleteInfo(
                session_id="s",
                parent_id="p",
                child_id="c1",
                role="reviewer",
                status="completed",
                reason="",
                result="fine",
            ),
        )
    assert denied == Deny("no coders today") and allowed is None
    assert (state / "completed.txt").read_text() == "c1 completed\n"


# -- the role file example ------------------------------------------------------------


def test_the_role_example_loads_and_gets_its_tools(tmp_path: Path) -> None:
    roles = tmp_path / "roles"
    roles.mkdir()
    (roles / "coder.md").write_text(one_block("markdown", MARKDOWN["role"]))
    role = find_role("coder", cwd=tmp_path)
    assert role.source and Path(role.source).parent == roles
    assert (role.max_turns, role.timeout, role.sandbox_network) == (30, 600, False)
    assert role.budget is not None
    assert role.budget.as_dict() == {"tokens": 400000, "seconds": 1800.0, "model_calls": 120}
    assert role.prompt.startswith("You are the coder")
    # A conversation is what checks the tools a role lists; it is built here
    # with a scripted model (nothing is called).
    conversation = role_conversation(
        role,
        ScriptedModel([{"text": "ok"}]),
        Workspace(tmp_path),
        runtime=RoleRuntime(sandbox=Sandbox.from_env()),
    )
    assert conversation is not None


def test_the_model_limits_role_example_loads(tmp_path: Path) -> None:
    # It has no `name`: the file name gives it, as for the architect here.
    roles = tmp_path / "roles"
    roles.mkdir()
    (roles / "architect.md").write_text(one_block("markdown", MARKDOWN["model limits"]))
    role = find_role("architect", cwd=tmp_path)
    assert (role.name, role.model, role.model_timeout, role.model_retries) == (
        "architect",
        "o3",
        300,
        1,
    )
    assert role.prompt.startswith("You are the architect")


def test_the_first_hour_role_loads_from_a2a_roles(tmp_path: Path) -> None:
    # docs/first-hour.md keeps it in .a2a/roles/, where commands cannot write.
    roles = tmp_path / ".a2a" / "roles"
    roles.mkdir(parents=True)
    (roles / "tdd.md").write_text(one_block("markdown", MARKDOWN["first-hour role"]))
    role = find_role("tdd", cwd=tmp_path)
    assert role.source and Path(role.source).parent == roles
    assert (role.name, role.model, role.max_turns) == ("tdd", "default", 20)
    assert "run_command" in role.tools and "ask_parent" not in role.tools
    conversation = role_conversation(
        role,
        ScriptedModel([{"text": "ok"}]),
        Workspace(tmp_path),
        runtime=RoleRuntime(sandbox=Sandbox.from_env()),
    )
    assert conversation is not None


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings (outside code blocks)."""
    anchors, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"^#{1,6} (.*)$", line)):
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug)
    return anchors


def test_every_link_of_the_guide_resolves() -> None:
    """The guide is split over pages: a link to a moved section, a missing
    file or a wrong anchor fails here, not in a reader's browser."""
    broken = []
    for page in PAGES:
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken
