"""The folders show the architecture: bottom modules know nothing of asyncio.

_config, _stats, _interest and _writes are state machines tested without
sockets or a loop (h11 style), _poller and _accept with sockets only; only
_loop binds them; examples and benchmarks use the
public namespace only.  Read with ast, so a new import that breaks the
layering fails here.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "asyncio_relaxed"

# module -> modules of the package it may import
ALLOWED = {
    "_config": set(),
    "_stats": set(),
    "_interest": set(),
    "_backends": set(),
    "_poller": {"_backends", "_interest", "_stats"},
    "_writes": {"_stats"},
    "_sockets": set(),
    "_shared": {"_config", "_sockets", "_stats", "_writes"},
    "_accept": {"_config", "_sockets"},
    "_compat": set(),
    "_basetransport": {"_compat", "_shared"},
    "_transport": {"_basetransport", "_compat", "_shared", "_sockets", "_writes"},
    "_tlsengine": {"_compat"},
    "_tls": {"_compat", "_shared", "_tlsengine", "_transport"},
    "_datagram": {"_basetransport", "_compat", "_shared"},
    "_pipes": {"_basetransport", "_compat", "_shared", "_writes"},
    "_serving": {"_accept", "_compat", "_config", "_shared", "_sockets", "_stats", "_tls",
                 "_transport"},
    "_health": set(),
    "_slow": {"_compat"},
    "_version": set(),
    "_startup": {"_config", "_version"},
    "_publish": {"_startup", "_stats", "_version"},
    "_loop": {"_accept", "_compat", "_config", "_datagram", "_health", "_pipes", "_poller",
              "_publish", "_serving", "_shared", "_slow", "_startup", "_stats", "_tls",
              "_transport"},
    "_builds": {"_config", "_loop", "_speedups"},
    "_policy": {"_builds", "_compat", "_config"},
    "__init__": {"_accept", "_builds", "_compat", "_config", "_health", "_policy", "_slow",
                 "_stats", "_version"},
    "pool": {"_publish"},
    "metrics": {"_health", "_publish", "_stats", "pool"},
    "_top": {"_publish", "pool"},
    "__main__": {"_builds", "_config", "_startup", "_top", "_version"},
    "gunicorn": set(),  # the public API only (import asyncio_relaxed)
}
BOTTOM = {"_config", "_stats", "_interest", "_backends", "_poller", "_writes", "_sockets",
          "_shared", "_accept", "_health", "_startup", "_publish", "pool", "_top"}


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


#: The compiled twin (a .pyx, read with a pattern): the pure modules whose
#: classes it subclasses or whose names it reads.
SPEEDUPS_ALLOWED = {"_accept", "_backends", "_basetransport", "_compat", "_datagram", "_health",
                    "_interest", "_loop", "_poller", "_serving", "_shared", "_sockets", "_stats",
                    "_tls", "_tlsengine", "_transport", "_writes"}


def test_the_compiled_module_imports_what_it_accelerates() -> None:
    source = "\n".join(path.read_text() for path in PACKAGE.glob("_speedups*.p*"))
    found = set()
    for grouped, single in re.findall(r"^from \. import (?:\(([^)]*)\)|(.+)$)", source, re.M):
        found.update(name.strip() for name in (grouped or single).split(",") if name.strip())
    found.update(re.findall(r"^from \.(\w+) import", source, re.M))
    assert found, "no import of the package found in _speedups"
    assert found <= SPEEDUPS_ALLOWED, found - SPEEDUPS_ALLOWED


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


# -- benchmarks/: three parts that import one way ------------------------------------

BENCHMARKS = ROOT / "benchmarks"
#: The part of benchmarks/ a module belongs to -> the parts it may import.
#: The harness (loops, processes, maths, tables, results, tls) imports no
#: other part; the throughput workloads import the harness; the count tools
#: import the harness and the workloads whose apps they count in process
#: (the uvicorn count's Starlette app: the same code as the timed
#: workload's), never the other way; the command line imports all three;
#: only ``python -m benchmarks`` (__main__) imports the command line.
BENCH_ALLOWED = {
    "__init__": set(),
    "harness": {"harness"},
    "workloads": {"harness", "workloads"},
    "counts": {"harness", "workloads", "counts"},
    "cli": {"harness", "workloads", "counts"},
    "__main__": {"cli"},
}


def _bench_module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _bench_part(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _bench_imports(path: pathlib.Path) -> set[str]:
    """The modules of benchmarks/ that *path* imports, anywhere in it
    (functions too: a lazy import is an import)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "benchmarks")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] != "benchmarks":
                continue
            found.add(node.module)
            for alias in node.names:  # "from benchmarks.harness import loops": a module
                sub = f"{node.module}.{alias.name}"
                if (ROOT / (sub.replace(".", "/") + ".py")).exists():
                    found.add(sub)
    return found


def _bench_graph() -> dict[str, set[str]]:
    return {_bench_module(p): _bench_imports(p) for p in sorted(BENCHMARKS.rglob("*.py"))}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import circle of *graph* (module -> modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_benchmarks_import_one_way() -> None:
    graph = _bench_graph()
    assert "benchmarks.harness.loops" in graph and "benchmarks.cli" in graph
    for module, imported in graph.items():
        part = _bench_part(module)
        assert part in BENCH_ALLOWED, f"{module}: a new part of benchmarks/? list it here"
        for other in imported:
            if other == "benchmarks" or (other.endswith(("harness", "workloads", "counts")) and \
                    other.count(".") == 1):
                continue  # a package's (empty) __init__
            assert _bench_part(other) in BENCH_ALLOWED[part], (
                f"{module} imports {other}: against the direction "
                f"({part} may import {sorted(BENCH_ALLOWED[part]) or 'nothing'})")


def test_benchmarks_have_no_import_circle() -> None:
    assert _cycle(_bench_graph()) is None, _cycle(_bench_graph())


#: Calls that start a process, and those that write a file.
_SPAWNS = {("subprocess", "Popen"), ("subprocess", "run"), ("subprocess", "call"),
           ("subprocess", "check_call"), ("subprocess", "check_output"), ("os", "system"),
           ("os", "posix_spawn"), ("os", "execv"), ("os", "execvp")}
_WRITES = {"write_text", "write_bytes", "savefig", "dump"}


@pytest.mark.parametrize("path", sorted(BENCHMARKS.rglob("*.py")), ids=lambda p: p.name)
def test_one_child_launcher_and_one_results_writer(path: pathlib.Path) -> None:
    """Processes start in harness/processes.py only; files are written by
    harness/results.py only (the certificates by trustme, in harness/tls.py)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        if (owner, func.attr) in _SPAWNS:
            assert path.name == "processes.py", f"{path}: {owner}.{func.attr}: use processes.spawn"
        if func.attr in _WRITES:
            assert path.name == "results.py", f"{path}: .{func.attr}(): use results.save"


#: The write states' fields: _writes makes every transition (docs/design.md,
#: "The write queue"); a transport only sets the first state when it is made.
_WRITE_STATE_FIELDS = {"_write_state", "_feeds"}


@pytest.mark.parametrize("module", sorted(set(ALLOWED) - {"_writes"}))
def test_only_the_write_queue_moves_the_write_states(module: str) -> None:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if function.name == "__init__":
            continue
        for node in ast.walk(function):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr in _WRITE_STATE_FIELDS:
                        raise AssertionError(
                            f"{module}.{function.name} assigns .{target.attr}: ask _writes")
