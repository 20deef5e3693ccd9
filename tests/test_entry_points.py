"""The one-line switches: run(), new_event_loop(), the policy, install()."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import asyncio_relaxed


async def which_loop() -> type:
    return type(asyncio.get_running_loop())


def test_run_uses_our_loop_with_options() -> None:
    async def main() -> tuple[type, str]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, asyncio_relaxed.Loop)
        return type(loop), loop.config.write.value

    assert asyncio_relaxed.run(main(), write="deferred") == (asyncio_relaxed.Loop, "deferred")


def test_run_returns_and_raises_like_asyncio_run() -> None:
    async def boom() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        asyncio_relaxed.run(boom())
    assert asyncio_relaxed.run(which_loop()) is asyncio_relaxed.Loop


def test_run_rejects_a_bad_setting_before_running() -> None:
    coro = which_loop()
    with pytest.raises(ValueError, match=r"write='fast'.*allowed: eager\|deferred"):
        asyncio_relaxed.run(coro, write="fast")
    coro.close()


def test_new_event_loop_is_a_selector_event_loop() -> None:
    loop = asyncio_relaxed.new_event_loop()
    try:
        assert isinstance(loop, asyncio.SelectorEventLoop)
        assert loop.run_until_complete(which_loop()) is asyncio_relaxed.Loop
    finally:
        loop.close()


def test_bad_environment_setting_fails_at_loop_creation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCIO_RELAXED_PARTIAL_WRITE", "sometimes")
    with pytest.raises(ValueError) as info:
        asyncio_relaxed.new_event_loop()
    message = str(info.value)
    assert "ASYNCIO_RELAXED_PARTIAL_WRITE" in message
    assert "'sometimes'" in message
    assert "poll|feed" in message


def test_keyword_beats_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCIO_RELAXED_WRITE", "deferred")
    loop = asyncio_relaxed.new_event_loop(write="eager")
    try:
        assert loop.config.write is asyncio_relaxed.WriteMode.EAGER
    finally:
        loop.close()
    loop = asyncio_relaxed.new_event_loop()
    try:
        assert loop.config.write is asyncio_relaxed.WriteMode.DEFERRED
    finally:
        loop.close()


@pytest.mark.parametrize("poller", ["poll", "select"])
def test_forced_poller_backends_work(poller: str) -> None:
    async def main() -> bytes:
        server = await asyncio.start_server(
            lambda r, w: (w.write(b"hi"), w.close()), "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data = await reader.read()
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        assert asyncio.get_running_loop().statistics().backend == poller
        return data

    assert asyncio_relaxed.run(main(), poller=poller) == b"hi"


def test_stdlib_selector_argument_is_wrapped() -> None:
    import selectors

    loop = asyncio_relaxed.Loop(selectors.PollSelector())
    try:
        assert loop.statistics().backend == "poll"
        assert loop.run_until_complete(which_loop()) is asyncio_relaxed.Loop
    finally:
        loop.close()


@contextlib.contextmanager
def deprecated_policies() -> Iterator[list[warnings.WarningMessage]]:
    """Records the warnings of the block; on 3.14+ each access of a policy
    name must warn once, attributed to this file (the caller's line)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    if sys.version_info >= (3, 14):
        assert caught, "no DeprecationWarning on 3.14+"
        for w in caught:
            assert w.category is DeprecationWarning, w
            assert w.filename == __file__, f"attributed to {w.filename}:{w.lineno}"
    else:
        assert not caught, [str(w.message) for w in caught]


def _policy_getter() -> Any:
    # asyncio.get_event_loop_policy warns on 3.14+; the private twin does not.
    return getattr(asyncio.events, "_get_event_loop_policy", asyncio.get_event_loop_policy)


def _policy_setter() -> Any:
    return getattr(asyncio.events, "_set_event_loop_policy", asyncio.set_event_loop_policy)


def test_policy_and_install() -> None:
    old = _policy_getter()()
    try:
        with deprecated_policies() as caught:
            policy = asyncio_relaxed.EventLoopPolicy(write="deferred")
        loop = policy.new_event_loop()
        try:
            assert isinstance(loop, asyncio_relaxed.Loop)
            assert loop.config.write is asyncio_relaxed.WriteMode.DEFERRED
        finally:
            loop.close()
        with deprecated_policies() as caught:
            asyncio_relaxed.install()
        # One warning (the attribute's), not asyncio's from inside install().
        assert len(caught) == (1 if sys.version_info >= (3, 14) else 0)
        assert asyncio.run(which_loop()) is asyncio_relaxed.Loop
    finally:
        _policy_setter()(old)


def test_policy_rejects_bad_option_at_creation() -> None:
    with deprecated_policies(), pytest.raises(ValueError, match="feed_limit=0"):
        asyncio_relaxed.EventLoopPolicy(feed_limit=0)


def test_policy_is_lazy_and_warns_on_314() -> None:
    """On 3.14+ the policy names warn like asyncio's, at the caller's line;
    before, they do not.  Either way _policy is imported only when asked."""
    code = (
        "import sys, warnings; warnings.simplefilter('error');"
        "import asyncio_relaxed;"
        "assert 'asyncio_relaxed._policy' not in sys.modules;"
        "p = asyncio_relaxed.EventLoopPolicy;"
        "assert 'asyncio_relaxed._policy' in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if sys.version_info >= (3, 14):
        assert result.returncode == 1
        assert '<string>", line 1' in result.stderr and "DeprecationWarning" in result.stderr
    else:
        assert result.returncode == 0, result.stderr


ENTRY_POINTS = """
import asyncio, sys
import asyncio_relaxed

async def main():
    return type(asyncio.get_running_loop()).__name__

assert asyncio_relaxed.run(main()) == "Loop"
loop = asyncio_relaxed.new_event_loop()
assert loop.run_until_complete(main()) == "Loop"
loop.close()
if sys.version_info >= (3, 12):
    assert asyncio.run(main(), loop_factory=asyncio_relaxed.new_event_loop) == "Loop"
with asyncio.Runner(loop_factory=asyncio_relaxed.new_event_loop) as runner:
    assert runner.run(main()) == "Loop"
import asyncio_relaxed.gunicorn as workers
for name in ("GunicornWebWorker", "UvicornWorker"):
    getattr(workers, name)
"""


def test_entry_points_raise_no_deprecation_warning() -> None:
    """run(), new_event_loop(), the loop factory, Runner and the gunicorn
    workers under -W error::DeprecationWarning (3.14+ deprecates policies)."""
    result = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", ENTRY_POINTS],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr


#: asyncio as it is without its policy system (CPython's main branch for
#: 3.16, gh-127949): the public policy names and the classes our policy
#: would derive from are gone.  The loop's policy is made first, as a 3.16
#: asyncio would keep its loop state without one.
HIDE_POLICIES = """
import asyncio, asyncio.events as events, asyncio.unix_events as unix_events
getattr(events, "_get_event_loop_policy", asyncio.get_event_loop_policy)()
for module, names in (
    (asyncio, ("AbstractEventLoopPolicy", "DefaultEventLoopPolicy",
               "get_event_loop_policy", "set_event_loop_policy")),
    (events, ("AbstractEventLoopPolicy", "_AbstractEventLoopPolicy",
              "BaseDefaultEventLoopPolicy", "_BaseDefaultEventLoopPolicy",
              "get_event_loop_policy", "set_event_loop_policy")),
    (unix_events, ("DefaultEventLoopPolicy", "_DefaultEventLoopPolicy",
                   "_UnixDefaultEventLoopPolicy")),
):
    for name in names:
        module.__dict__.pop(name, None)
    # 3.14 serves the deprecated names through the module's __getattr__.
    def __getattr__(name, names=names, served=module.__dict__.get("__getattr__")):
        if name in names or served is None:
            raise AttributeError(name)
        return served(name)
    module.__getattr__ = __getattr__
"""


def test_works_without_asyncio_policies() -> None:
    """3.16 by design: everything but the policy works without asyncio's
    policy classes; EventLoopPolicy and install() fail, saying what to use."""
    code = HIDE_POLICIES + ENTRY_POINTS + """
for name in ("EventLoopPolicy", "install"):
    try:
        getattr(asyncio_relaxed, name)
    except AttributeError as exc:
        assert "policy system" in str(exc) and "loop_factory" in str(exc), exc
    else:
        raise AssertionError(name + " did not fail")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_unknown_attribute_error() -> None:
    with warnings.catch_warnings():
        with pytest.raises(AttributeError, match="no attribute 'nope'"):
            asyncio_relaxed.nope  # noqa: B018


def test_python_m_prints_settings_and_their_source() -> None:
    """Every setting, set or not, with its keyword, its variable, its value
    and its source, in columns that line up whatever the names' lengths."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCIO_RELAXED_")}
    env.update(ASYNCIO_RELAXED_WRITE="deferred", ASYNCIO_RELAXED_EXCLUSIVE_ACCEPT="yes",
               ASYNCIO_RELAXED_WRTIE="eager")
    out = subprocess.run(
        [sys.executable, "-m", "asyncio_relaxed"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert f"asyncio_relaxed {asyncio_relaxed.__version__}" in out.stdout
    lines = out.stdout.splitlines()
    header = next(line for line in lines if "environment variable" in line)
    starts = [header.index(title) for title in ("environment variable", "value", "set by")]
    names = [name for name, *_ in asyncio_relaxed.Config().describe()]
    rows = {line.split()[0]: line for line in lines if line.split()[:1] and
            line.split()[0] in names}
    assert list(rows) == names, out.stdout
    set_here = {"write": "deferred", "exclusive_accept": "on"}
    defaults = asyncio_relaxed.Config()
    for name, line in rows.items():
        default = getattr(defaults, name)
        shown = set_here.get(name, ("on" if default else "off") if isinstance(default, bool)
                             else str(default) or "(none)")
        assert line[starts[0]:].startswith("ASYNCIO_RELAXED_" + name.upper() + " "), line
        assert line[starts[1] - 1] == " " and line[starts[1]:].split()[0] == shown, line
        assert line[starts[2]:] == ("environment" if name in set_here else "default"), line
    assert ("ASYNCIO_RELAXED_WRTIE is not a setting of asyncio_relaxed "
            f"{asyncio_relaxed.__version__}; ignored (did you mean ASYNCIO_RELAXED_WRITE?)"
            in out.stdout)
    assert "IOV_MAX" in out.stdout


def test_python_m_reports_an_invalid_setting() -> None:
    env = {**os.environ, "ASYNCIO_RELAXED_ACCEPT_NOTHING": "", "ASYNCIO_RELAXED_FEED_LIMIT": "-3"}
    out = subprocess.run(
        [sys.executable, "-m", "asyncio_relaxed"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 2
    assert "ASYNCIO_RELAXED_FEED_LIMIT='-3'" in out.stdout


def test_python_m_help() -> None:
    out = subprocess.run([sys.executable, "-m", "asyncio_relaxed", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m asyncio_relaxed")
    assert "top" in out.stdout and "every setting" in out.stdout
    out = subprocess.run([sys.executable, "-m", "asyncio_relaxed", "top", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "--json" in out.stdout and "DIR" in out.stdout


def test_python_m_into_a_closed_pipe_ends_quietly() -> None:
    """`python -m asyncio_relaxed | head -n 3`: the reader goes away first."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the command writes a byte
    try:
        out = subprocess.run([sys.executable, "-m", "asyncio_relaxed"], stdout=write_end,
                             stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert out.returncode == 0
    assert out.stderr == ""


def test_python_m_top_needs_a_directory(tmp_path: Any) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCIO_RELAXED_")}
    out = subprocess.run([sys.executable, "-m", "asyncio_relaxed", "top", "--json"],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "ASYNCIO_RELAXED_STATS_DIR" in out.stderr
    out = subprocess.run([sys.executable, "-m", "asyncio_relaxed", "top", str(tmp_path / "x")],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "is not a directory" in out.stderr


def test_python_m_top_once(tmp_path: Any) -> None:
    """One snapshot, as JSON and as the table, of a loop publishing here."""
    loop = asyncio_relaxed.new_event_loop(stats_dir=str(tmp_path), accept="single")
    try:
        env = {**os.environ, "ASYNCIO_RELAXED_STATS_DIR": str(tmp_path), "COLUMNS": "200"}
        out = subprocess.run([sys.executable, "-m", "asyncio_relaxed", "top", "--json"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        document = json.loads(out.stdout)
        (row,) = document["workers"]
        assert row["pid"] == os.getpid() and row["accept"] == "single"
        assert row["connections"] == 0 and not row["stale"]
        assert document["pool"]["workers"] == 1
        pytest.importorskip("rich")
        out = subprocess.run([sys.executable, "-m", "asyncio_relaxed", "top", "--once"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        (line,) = [line for line in out.stdout.splitlines() if f" {os.getpid()} " in line]
        assert "single" in line
        assert "1 workers (0 stale)" in out.stdout
    finally:
        loop.close()


def test_metrics_and_pool_are_reachable_after_import_without_their_peers() -> None:
    code = ("import sys, asyncio_relaxed\n"
            "assert asyncio_relaxed.metrics.PoolCollector and asyncio_relaxed.pool.read\n"
            "assert not {'prometheus_client', 'opentelemetry', 'rich'} & set(sys.modules), "
            "sorted(sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
