"""Every import inside the package names a module that exists, the ones in
function bodies included: the commands import what they run lazily, and
mypy (with `ignore_missing_imports`, for the dependencies without stubs)
would not notice a relative import that points at the wrong package."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import a2a_orchestrator

PACKAGE = Path(a2a_orchestrator.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module name) of each `from X import ...` in `path`
    (or in `source`, read as that file) that names this package's modules
    (relative, or `a2a_orchestrator...`)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            name = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
        elif node.module and node.module.split(".")[0] == "a2a_orchestrator":
            name = node.module
        else:
            continue
        found.append((node.lineno, name))
    return found


def _exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent package is missing too
        return False


def _missing(path: Path, source: str | None = None) -> list[str]:
    return [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for line, name in _imports(path, source)
        if not _exists(name)
    ]


def test_every_import_of_the_package_names_a_module_that_exists() -> None:
    files = [p for p in PACKAGE.rglob("*.py") if "demo_scenario" not in p.parts]
    missing = [line for path in files for line in _missing(path)]
    assert not missing, missing
    # The walk reaches the lazy imports too (the commands alone have dozens).
    assert sum(len(_imports(path)) for path in files) > 500


def test_a_relative_import_one_level_short_is_caught() -> None:
    # The check can fail: a lazy import inside a subpackage that forgot a dot.
    path = PACKAGE / "cli" / "commands" / "serve.py"
    good = path.read_text()
    bad = good.replace("from ...runtime.roles import", "from ..runtime.roles import")
    assert bad != good and _missing(path, good) == []
    [missing] = _missing(path, bad)
    assert missing.endswith(": a2a_orchestrator.cli.runtime.roles")
