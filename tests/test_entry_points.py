"""The one-line switches: run(), new_event_loop(), the policy, install()."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import warnings

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


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="policies deprecated on 3.14+")
def test_policy_and_install() -> None:
    old = asyncio.get_event_loop_policy()
    try:
        policy = asyncio_relaxed.EventLoopPolicy(write="deferred")
        loop = policy.new_event_loop()
        try:
            assert isinstance(loop, asyncio_relaxed.Loop)
            assert loop.config.write is asyncio_relaxed.WriteMode.DEFERRED
        finally:
            loop.close()
        asyncio_relaxed.install()
        assert asyncio.run(which_loop()) is asyncio_relaxed.Loop
    finally:
        asyncio.set_event_loop_policy(old)


def test_policy_rejects_bad_option_at_creation() -> None:
    with pytest.raises(ValueError, match="feed_limit=0"):
        asyncio_relaxed.EventLoopPolicy(feed_limit=0)


def test_policy_is_lazy_and_warns_on_314(monkeypatch: pytest.MonkeyPatch) -> None:
    """On 3.14+ the policy names warn like asyncio's; before, they do not."""
    code = (
        "import sys, warnings; warnings.simplefilter('error');"
        "import asyncio_relaxed;"
        "assert '_policy' not in dir(asyncio_relaxed) or True;"
        "assert 'asyncio_relaxed._policy' not in sys.modules;"
        "p = asyncio_relaxed.EventLoopPolicy;"
        "assert 'asyncio_relaxed._policy' in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if sys.version_info >= (3, 14):
        assert "DeprecationWarning" in result.stderr
    else:
        assert result.returncode == 0, result.stderr


def test_unknown_attribute_error() -> None:
    with warnings.catch_warnings():
        with pytest.raises(AttributeError, match="no attribute 'nope'"):
            asyncio_relaxed.nope  # noqa: B018


def test_python_m_prints_settings_and_their_source() -> None:
    env = {**os.environ, "ASYNCIO_RELAXED_WRITE": "deferred"}
    out = subprocess.run(
        [sys.executable, "-m", "asyncio_relaxed"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert f"asyncio_relaxed {asyncio_relaxed.__version__}" in out.stdout
    assert "from ASYNCIO_RELAXED_WRITE" in out.stdout
    assert "IOV_MAX" in out.stdout


def test_python_m_reports_an_invalid_setting() -> None:
    env = {**os.environ, "ASYNCIO_RELAXED_ACCEPT_NOTHING": "", "ASYNCIO_RELAXED_FEED_LIMIT": "-3"}
    out = subprocess.run(
        [sys.executable, "-m", "asyncio_relaxed"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 2
    assert "ASYNCIO_RELAXED_FEED_LIMIT='-3'" in out.stdout
