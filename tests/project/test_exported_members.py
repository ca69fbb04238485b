"""The public surface: every exported name exists, and every module says what it exports."""

from __future__ import annotations

import importlib
import pkgutil

import a2a_orchestrator


def test_package_exports_resolve() -> None:
    for name in a2a_orchestrator.__all__:
        assert hasattr(a2a_orchestrator, name), name
    public = {n for n in dir(a2a_orchestrator) if not n.startswith("_")}
    modules = {m.name for m in pkgutil.iter_modules(a2a_orchestrator.__path__)}
    # Anything public at the top that is not a submodule is listed in __all__.
    assert public - modules - set(a2a_orchestrator.__all__) == set()


def test_every_public_module_has_all() -> None:
    for info in pkgutil.walk_packages(a2a_orchestrator.__path__, "a2a_orchestrator."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        assert hasattr(module, "__all__"), info.name
        for name in module.__all__:
            assert hasattr(module, name), f"{info.name}.{name}"
