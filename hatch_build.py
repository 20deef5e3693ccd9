"""hatchling's build hook for the wheel: compile asyncio_relaxed._speedups, or
leave the pure-Python loop alone and say why in one line.

Theory of operation
===================

The pure-Python modules are the loop; ``asyncio_relaxed/_speedups.pyx`` (with
the ``_speedups_*.pxi`` files it includes) is its compiled accelerator, which
``asyncio_relaxed._builds`` imports under ``try``.  A missing compiled module
is therefore never an error: this hook builds it where it can and otherwise
lets the wheel carry the pure loop alone, as aiohttp, yarl and frozenlist do.

Registered for the wheel target only (pyproject.toml), so the sdist carries
the sources and this file, never a build.  hatchling calls
:meth:`SpeedupsBuildHook.initialize` with *version* ``"standard"`` for a wheel
and ``"editable"`` for ``pip install -e``:

* standard: the module is compiled in a temporary directory and put in the
  wheel at ``asyncio_relaxed/_speedups<EXT_SUFFIX>`` (``force_include``); the
  wheel is then tagged for this interpreter and platform (``pure_python`` off,
  ``infer_tag`` on: cp311-cp311-linux_x86_64, ...).  Without it the wheel
  stays py3-none-any.
* editable: hatchling's editable wheel puts the checkout on ``sys.path``, so
  the module is compiled beside the .pyx, where that import finds it.  The
  name carries EXT_SUFFIX (``.cpython-311-x86_64-linux-gnu.so``), so every
  Python installed editable from one checkout keeps its own.  It is compiled
  again only when the .pyx, a .pxi or this file is newer than it, and it
  replaces the old one by rename, so a process that has the old one loaded
  keeps a valid mapping.  When this Python gets the pure loop, its in-place
  module is removed, so the import finds no stale build.

Which build, decided in :meth:`SpeedupsBuildHook.pure_reason`, in this order:
``ASYNCIO_RELAXED_NO_EXTENSIONS`` on (aiohttp's ``AIOHTTP_NO_EXTENSIONS``;
read with the run-time parser of ``asyncio_relaxed/_config.py``, so the same
tokens mean the same: 1/true/yes/on, empty is off); not CPython (PyPy); a
free-threaded CPython (the module assumes the GIL, and #errors on
Py_GIL_DISABLED); a CPython newer than the newest one the package's
classifiers name (the module reads CPython's own structures, whose layout a
new version may change: it is compiled there once the classifier is added
and the suite has run); Cython or setuptools not importable (pyproject.toml's
[build-system] requires them on CPython; a ``--no-build-isolation`` build may
lack them); no working C compiler (a probe extension that includes Python.h
is built first); the module fails to compile.  Each pure outcome prints one
line on stderr (:func:`say`) naming the reason; a failed compile's line
quotes the compiler's first error and names the file holding its whole
output.  pip shows a build backend's output with ``-v``; ``python -m build``
always does.

The compiler is setuptools' ``build_ext`` with this interpreter's sysconfig
CFLAGS (Debian's CPython 3.14 and 3.15: -g -O2 -Wall; a CPython built from
source with its default OPT, pyenv's: -g -O3 -Wall; no -Werror), plus the
caller's CFLAGS, as every setuptools extension gets them.  It runs in a child
process (this file run as a script) whose output is captured: a failed step
keeps it in a file beside the generated C and quotes its first error, a good
one prints nothing of it.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

MODULE = "asyncio_relaxed._speedups"
SOURCE = "asyncio_relaxed/_speedups.pyx"
#: The files SOURCE includes: an edit to any of them rebuilds the module.
INCLUDES = "asyncio_relaxed/_speedups_*.pxi"
NO_EXTENSIONS_VAR = "ASYNCIO_RELAXED_NO_EXTENSIONS"
#: The package's settings module, whose boolean parser reads NO_EXTENSIONS_VAR.
CONFIG = "asyncio_relaxed/_config.py"

# A C extension that includes Python.h: if this does not build and link, the
# toolchain does not work, and the line says so instead of blaming the module.
PROBE_C = """\
#include <Python.h>

static struct PyModuleDef probe = {PyModuleDef_HEAD_INIT, "_probe", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__probe(void) { return PyModule_Create(&probe); }
"""

# The line of a build log that says what failed: a C compiler's diagnostic
# (gcc and clang: "file:line:col: error: ...", "fatal error: ..."), Cython's
# (file.pyx:line:col: message, printed after the quoted source), or the one
# the child prints for the exception that ended it ("error: command 'gcc'
# failed: No such file or directory").
_FIRST_ERROR = re.compile(
    r"^(?:\S+:\d+:\d+: (?:fatal )?error: .*"
    r"|\S+\.(?:pyx|pxi|pxd):\d+:\d+: .*"
    r"|error: .*)$",
    re.MULTILINE,
)


def say(message: str) -> None:
    """The hook's one line on stderr (pip shows it with -v)."""
    print(f"asyncio_relaxed: {message}", file=sys.stderr, flush=True)


class BuildFailed(Exception):
    """A step in the child process failed; args: the step, its first error."""


class SpeedupsBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    """Compiles asyncio_relaxed._speedups into the wheel, or in place for an
    editable install (the module docstring tells how and when)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        # The build's directory, which finalize() removes; one whose build
        # failed is kept, for the log and the C that its line names.
        self._temp: str | None = None
        if self.target_name != "wheel":
            return
        editable = version == "editable"
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        in_place = os.path.join(self.root, *MODULE.split(".")) + suffix
        reason = self.pure_reason()
        if reason is None and editable and self.up_to_date(in_place):
            say(f"{os.path.relpath(in_place, self.root)} is up to date; not compiled again")
            return
        started = time.monotonic()
        if reason is None:
            temp = tempfile.mkdtemp(prefix="asyncio_relaxed-build-")
            try:
                self.child("probe", temp)
                built = self.child("compile", temp)
                self._temp = temp
            except BuildFailed as exc:
                step, first = exc.args
                what = "no working C compiler" if step == "probe" else f"compiling {SOURCE} failed"
                reason = f"{what}: {first} (whole output: {os.path.join(temp, step)}.log)"
        if reason is not None:
            removed = ""
            if editable and os.path.exists(in_place):
                os.remove(in_place)
                removed = f"; removed {os.path.relpath(in_place, self.root)}, built before"
            say(f"the pure-Python loop is installed, not the compiled module: {reason}{removed}")
            return
        if editable:
            # Rename over the old file, not write into it: a running process
            # may have it mapped.
            staged = f"{in_place}.{os.getpid()}.tmp"
            shutil.copyfile(built, staged)
            os.replace(staged, in_place)
            where = os.path.relpath(in_place, self.root)
        else:
            build_data["force_include"][built] = MODULE.replace(".", "/") + suffix
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            where = "the wheel"
        say(
            f"compiled {MODULE} for {self.python()} in {time.monotonic() - started:.1f} s"
            f" (into {where})"
        )

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)

    @staticmethod
    def python() -> str:
        """This interpreter's name and version: "CPython 3.14", "PyPy 3.11"."""
        return f"{platform.python_implementation()} {sys.version_info[0]}.{sys.version_info[1]}"

    def pure_reason(self) -> str | None:
        """Why this build gets the pure loop only, or None: compile it."""
        raw = os.environ.get(NO_EXTENSIONS_VAR, "")
        if raw.strip() and self.config_module()._parse_bool(NO_EXTENSIONS_VAR, raw):
            return f"{NO_EXTENSIONS_VAR}={raw.strip()} at build time"
        if sys.implementation.name != "cpython":
            return f"{self.python()} is not CPython"
        if sysconfig.get_config_var("Py_GIL_DISABLED"):
            return f"{self.python()} is free-threaded, and the compiled module assumes the GIL"
        newest = self.newest_python()
        if sys.version_info[:2] > newest:
            return (
                f"{self.python()} is newer than the newest Python the compiled module is"
                f" tested on ({newest[0]}.{newest[1]}, pyproject.toml's classifiers)"
            )
        for requirement in ("Cython", "setuptools"):
            try:
                importlib.import_module(requirement)
            except ImportError as exc:
                return (
                    f"{requirement} does not import ({exc}); pyproject.toml's [build-system]"
                    f" requires it, a build without isolation needs it installed"
                )
        return None

    def config_module(self) -> ModuleType:
        """asyncio_relaxed/_config.py, loaded alone from its file: the
        package is not on the build backend's sys.path, and importing it would
        run all of it."""
        name = "_asyncio_relaxed_build_config"
        spec = importlib.util.spec_from_file_location(name, os.path.join(self.root, CONFIG))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # dataclasses looks the module up by name while it makes the classes.
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            del sys.modules[name]
        return module

    def newest_python(self) -> tuple[int, int]:
        """The highest "Programming Language :: Python :: 3.X" classifier."""
        versions = [
            (int(major), int(minor))
            for major, minor in (
                c.rsplit(" :: ", 1)[1].split(".")
                for c in self.metadata.core.classifiers
                if re.fullmatch(r"Programming Language :: Python :: \d+\.\d+", c)
            )
        ]
        return max(versions)

    def up_to_date(self, built: str) -> bool:
        """Whether *built* is newer than the sources and this hook."""
        if not os.path.exists(built):
            return False
        sources = [SOURCE, *glob.glob(INCLUDES, root_dir=self.root), "hatch_build.py"]
        newest = max(os.path.getmtime(os.path.join(self.root, s)) for s in sources)
        return os.path.getmtime(built) >= newest

    def child(self, step: str, temp: str) -> str:
        """Run *step* of :func:`build` in a child Python in the checkout and
        return the path it built; keep its output in *temp*/*step*.log, and
        raise BuildFailed with the first error in it when it failed."""
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), step, temp],
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        with open(os.path.join(temp, f"{step}.log"), "w") as log:
            log.write(done.stdout)
        built = re.findall(r"^built: (.+)$", done.stdout, re.MULTILINE)
        if done.returncode == 0 and built and os.path.isfile(built[-1]):
            return built[-1]
        # Without a diagnostic of a known form: the output's last line.
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        match = _FIRST_ERROR.search(done.stdout)
        first = match.group(0) if match else (lines[-1] if lines else f"exit {done.returncode}")
        raise BuildFailed(step, first.strip())


def build(step: str, temp: str) -> None:
    """In the child process: build the probe ("probe") or the module ("compile")
    under *temp* with setuptools' build_ext, and print "built: " and the
    built file's path."""
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    if step == "probe":
        source = os.path.join(temp, "probe", "_probe.c")
        os.makedirs(os.path.dirname(source))
        with open(source, "w") as file:
            file.write(PROBE_C)
        extension = Extension("_probe", [source])
        lib = os.path.join(temp, "probe")
    else:
        from Cython.Build import cythonize

        # The generated C goes to temp, not beside the .pyx: Pythons building
        # from one checkout at once do not share it.  build_dir keeps the
        # package path, so Cython names the source asyncio_relaxed/_speedups.pyx
        # in tracebacks (relative to the checkout, the working directory).
        [extension] = cythonize(
            [Extension(MODULE, [SOURCE])],
            build_dir=os.path.join(temp, "c"),
            language_level=3,
            force=True,
            quiet=True,
        )
        lib = os.path.join(temp, "lib")
    command = build_ext(Distribution({"name": "asyncio-relaxed", "ext_modules": [extension]}))
    command.build_lib = lib
    command.build_temp = os.path.join(temp, f"obj-{step}")
    command.ensure_finalized()
    command.run()
    print(f"built: {command.get_ext_fullpath(extension.name)}")


if __name__ == "__main__":
    try:
        build(*sys.argv[1:])
    except Exception as exc:
        # The traceback for the log, then the line SpeedupsBuildHook.child
        # quotes when no compiler diagnostic came before it.
        traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
