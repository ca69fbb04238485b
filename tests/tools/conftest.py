"""The tool tests' fixtures: a workspace of its own per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from a2a_orchestrator.tools import Workspace


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "work"
    root.mkdir()
    return Workspace(root)
