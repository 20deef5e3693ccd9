"""The folders show the architecture: bottom modules know nothing of asyncio.

_config, _stats and _poller are state machines tested without sockets or a
loop (h11 style); only _loop binds them; examples and benchmarks use the
public namespace only.  Read with ast, so a new import that breaks the
layering fails here.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "asyncio_relaxed"

# module -> modules of the package it may import
ALLOWED = {
    "_config": set(),
    "_stats": set(),
    "_poller": {"_stats"},
    "_writes": {"_stats"},
    "_accept": {"_config"},
    "_compat": set(),
    "_transport": {"_compat", "_config", "_stats", "_writes"},
    "_serving": {"_accept", "_compat", "_config", "_stats", "_transport"},
    "_health": set(),
    "_slow": {"_compat"},
    "_loop": {"_accept", "_compat", "_config", "_health", "_poller", "_serving", "_slow",
              "_stats", "_transport"},
    "_policy": {"_compat", "_config", "_loop"},
    "__init__": {"_accept", "_compat", "_config", "_health", "_loop", "_policy", "_slow",
                 "_stats"},
    "metrics": {"_health", "_stats"},
    "__main__": {"__init__", "_config"},
    "gunicorn": set(),  # the public API only (import asyncio_relaxed)
}
BOTTOM = {"_config", "_stats", "_poller", "_writes", "_accept", "_health"}


def imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """(package modules imported, top-level external modules imported)."""
    tree = ast.parse(path.read_text())
    internal: set[str] = set()
    external: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                if node.module:
                    internal.add(node.module.split(".")[0])
                else:
                    # "from . import x": a module, or a name of the package itself
                    for alias in node.names:
                        is_module = (PACKAGE / f"{alias.name}.py").exists()
                        internal.add(alias.name if is_module else "__init__")
            elif node.module:
                external.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            external.update(alias.name.split(".")[0] for alias in node.names)
    return internal, external


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_package_layering(module: str) -> None:
    internal, external = imports(PACKAGE / f"{module}.py")
    assert internal <= ALLOWED[module], f"{module} imports {internal - ALLOWED[module]}"
    if module in BOTTOM:
        assert "asyncio" not in external, f"{module} must not import asyncio"


def test_every_module_is_listed() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert modules <= set(ALLOWED), modules - set(ALLOWED)


def test_private_cpython_names_only_in_compat() -> None:
    """asyncio's private modules are reached through _compat alone."""
    private = ("_FlowControlMixin", "_SendfileMode", "_set_nodelay", "_format_handle",
               "_set_result_unless_cancelled", "_MIN_SCHEDULED", "_cancel_all_tasks")
    for path in PACKAGE.glob("*.py"):
        if path.stem == "_compat":
            continue
        text = path.read_text()
        found = [name for name in private if name in text]
        assert not found, f"{path.name} uses {found}; go through _compat"


#: asyncio's modules other than its public namespace: only _compat imports them.
_ASYNCIO_SUBMODULES = {
    "base_events", "constants", "events", "format_helpers", "futures", "selector_events",
    "sslproto", "transports", "trsock", "unix_events", "windows_events", "protocols",
    "runners", "tasks", "streams", "coroutines",
}
#: Handle's private fields: made and read as stock's only in _compat.
_HANDLE_FIELDS = {"_callback", "_args", "_cancelled", "_repr", "_source_traceback"}


@pytest.mark.parametrize("module", sorted(set(ALLOWED) - {"_compat"}))
def test_the_compat_rule(module: str) -> None:
    """Version gates, asyncio's private modules and writes to a handle's
    private fields live in _compat, with the versions they were checked
    against; the rest of the package asks _compat."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "asyncio":
            names = {alias.name for alias in node.names} & _ASYNCIO_SUBMODULES
            assert not names, f"{module} imports asyncio.{names}: go through _compat"
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("asyncio."):
            raise AssertionError(f"{module} imports {node.module}: go through _compat")
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("asyncio."), f"{module} imports {alias.name}"
        if isinstance(node, ast.Attribute) and node.attr == "version_info":
            raise AssertionError(f"{module} reads sys.version_info: use _compat's PY3xx")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in _HANDLE_FIELDS:
                    raise AssertionError(f"{module} writes .{target.attr}: a handle's field")


@pytest.mark.parametrize("folder", ["examples", "benchmarks"])
def test_examples_use_the_public_api(folder: str) -> None:
    for path in (ROOT / folder).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("asyncio_relaxed._"), path
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "asyncio_relaxed":
                    assert not node.attr.startswith("_"), f"{path}: asyncio_relaxed.{node.attr}"
