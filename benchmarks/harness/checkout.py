"""A loop run from another checkout: ``--baseline DIR`` runs each relaxed preset
also from the asyncio_relaxed in DIR.

The twin of preset ``NAME`` is ``NAME@base``, a row of
:data:`benchmarks.harness.loops.SPECS` whose ``checkout`` is DIR: its server
processes import asyncio_relaxed from DIR, so one run compares a change with
what it changed, next to the same peers.  Each child reports the package it
imported (:func:`relaxed_package`) and :func:`check_package` refuses a
result from the wrong tree.
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib.util
import os
import shutil
import tempfile
import threading

from benchmarks.harness.loops import SPECS

#: Checkout path -> a folder holding only a link to its asyncio_relaxed.
_SHIMS: dict[str, str] = {}
_SHIMS_LOCK = threading.Lock()


def register(name: str, path: object) -> str:
    """Add loop *name* as run from the checkout at *path*; return the twin's name."""
    twin = f"{name}@base"
    spec = SPECS[name]
    SPECS[twin] = dataclasses.replace(spec, name=twin, about=f"{spec.about}, from {path}",
                                      checkout=str(path))
    return twin


def import_dir(name: str) -> str | None:
    """Where a child process running loop *name* must start, or None (this tree).

    ``python -m`` puts its working directory first on sys.path, ahead of
    PYTHONPATH, so a child started in this tree imports this tree's
    asyncio_relaxed whatever PYTHONPATH says.  A baseline's child starts in,
    and puts first on PYTHONPATH, a folder holding only a link to the
    checkout's asyncio_relaxed: that package comes from the checkout,
    benchmarks/ and everything else from this tree, even when the checkout
    has a benchmarks/ of its own.
    """
    path = SPECS[name].checkout
    if path is None:
        return None
    with _SHIMS_LOCK:  # the instructions subcommand asks from several threads
        shim = _SHIMS.get(path)
        if shim is None:
            shim = tempfile.mkdtemp(prefix="relaxed-baseline-")
            os.symlink(os.path.join(path, "asyncio_relaxed"),
                       os.path.join(shim, "asyncio_relaxed"))
            atexit.register(shutil.rmtree, shim, True)  # the link only, not the checkout
            _SHIMS[path] = shim
    return shim


def relaxed_package() -> str | None:
    """The folder this process imports asyncio_relaxed from (children report
    it, and check_package compares it with the tree they should use)."""
    spec = importlib.util.find_spec("asyncio_relaxed")
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def check_package(name: str, package_dir: str | None, root: object) -> None:
    """Refuse a result whose child imported asyncio_relaxed from the wrong tree.

    *package_dir* is what the child reported (the folder of the package it
    imported), *root* this tree."""
    spec = SPECS[name]
    if package_dir is None or spec.kind != "relaxed":
        return
    expected = os.path.realpath(spec.checkout or str(root))
    got = os.path.dirname(os.path.realpath(package_dir))
    if got != expected:
        raise RuntimeError(f"the server of {name} imported asyncio_relaxed from {package_dir}, "
                           f"not from {expected}: its figures would belong to another checkout")
