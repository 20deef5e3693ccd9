"""Settings: defaults, precedence, parsing and error texts of ``_config``.

No event loop and no sockets: ``resolve()`` is fed explicit ``environ`` dicts,
and ``python -E`` is checked in a subprocess.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest

import asyncio_relaxed
from asyncio_relaxed._config import (
    ENV_PREFIX,
    AcceptStrategy,
    Config,
    DatagramMode,
    PartialWrite,
    PipeMode,
    Poller,
    TlsMode,
    WriteMode,
    resolve,
)

FIELDS = [f.name for f in dataclasses.fields(Config)]

DEFAULTS = {
    "write": WriteMode.EAGER,
    "partial_write": PartialWrite.POLL,
    "feed_limit": 4,
    "accept": AcceptStrategy.BATCH,
    "accept_batch": 0,
    "exclusive_accept": False,
    "keepalive": False,
    "keepalive_idle": 0,
    "keepalive_interval": 0,
    "keepalive_count": 0,
    "poller": Poller.AUTO,
    "time_metrics": True,
    "slow_callback": 0.0,
    "tls": TlsMode.OWN,
    "datagram": DatagramMode.OWN,
    "datagram_batch": 32,
    "pipe": PipeMode.OWN,
    "stats_dir": "",
    "read_size": 256 * 1024,
}

ENV_NAMES = {
    "write": "ASYNCIO_RELAXED_WRITE",
    "partial_write": "ASYNCIO_RELAXED_PARTIAL_WRITE",
    "feed_limit": "ASYNCIO_RELAXED_FEED_LIMIT",
    "accept": "ASYNCIO_RELAXED_ACCEPT",
    "accept_batch": "ASYNCIO_RELAXED_ACCEPT_BATCH",
    "exclusive_accept": "ASYNCIO_RELAXED_EXCLUSIVE_ACCEPT",
    "keepalive": "ASYNCIO_RELAXED_KEEPALIVE",
    "keepalive_idle": "ASYNCIO_RELAXED_KEEPALIVE_IDLE",
    "keepalive_interval": "ASYNCIO_RELAXED_KEEPALIVE_INTERVAL",
    "keepalive_count": "ASYNCIO_RELAXED_KEEPALIVE_COUNT",
    "poller": "ASYNCIO_RELAXED_POLLER",
    "time_metrics": "ASYNCIO_RELAXED_TIME_METRICS",
    "slow_callback": "ASYNCIO_RELAXED_SLOW_CALLBACK",
    "tls": "ASYNCIO_RELAXED_TLS",
    "datagram": "ASYNCIO_RELAXED_DATAGRAM",
    "datagram_batch": "ASYNCIO_RELAXED_DATAGRAM_BATCH",
    "pipe": "ASYNCIO_RELAXED_PIPE",
    "stats_dir": "ASYNCIO_RELAXED_STATS_DIR",
    "read_size": "ASYNCIO_RELAXED_READ_SIZE",
}

# One valid, non-default raw token per field, and what it parses to.
NON_DEFAULT = {
    "write": ("deferred", WriteMode.DEFERRED),
    "partial_write": ("feed", PartialWrite.FEED),
    "feed_limit": ("9", 9),
    "accept": ("relaxed", AcceptStrategy.RELAXED),
    "accept_batch": ("16", 16),
    "exclusive_accept": ("Yes", True),
    "keepalive": ("on", True),
    "keepalive_idle": ("30", 30),
    "keepalive_interval": ("5", 5),
    "keepalive_count": ("3", 3),
    "poller": ("select", Poller.SELECT),
    "time_metrics": ("off", False),
    "slow_callback": ("0.25", 0.25),
    "tls": ("stock", TlsMode.STOCK),
    "datagram": ("Stock", DatagramMode.STOCK),
    "datagram_batch": ("1", 1),
    "pipe": ("STOCK", PipeMode.STOCK),
    # A directory that exists wherever the suite runs (this file's own).
    "stats_dir": (str(pathlib.Path(__file__).parent), str(pathlib.Path(__file__).parent)),
    "read_size": ("2048", 2048),
}

ALLOWED = {
    "write": "eager|deferred",
    "partial_write": "poll|feed",
    "feed_limit": "an integer from 1 to 1000",
    "accept": "batch|single|relaxed|balanced",
    "accept_batch": "an integer from 0 to 65535",
    "exclusive_accept": "1|true|yes|on|0|false|no|off",
    "keepalive": "1|true|yes|on|0|false|no|off",
    "keepalive_idle": "an integer from 0 to 32767",
    "keepalive_interval": "an integer from 0 to 32767",
    "keepalive_count": "an integer from 0 to 127",
    "poller": "auto|epoll|poll|select",
    "time_metrics": "1|true|yes|on|0|false|no|off",
    "slow_callback": "a number of seconds from 0 to 3600 (0 turns it off)",
    "tls": "own|stock",
    "datagram": "own|stock",
    "datagram_batch": "an integer from 1 to 1024",
    "pipe": "own|stock",
    "stats_dir": "an existing directory this process can write (create it first), or empty "
                 "to publish nothing",
    "read_size": "an integer from 1024 to 16777216",
}

BAD_VALUES = [
    ("write", "bogus"),
    ("write", ""),
    ("write", "eager deferred"),
    ("partial_write", "wait"),
    ("partial_write", 1),
    ("feed_limit", "0"),
    ("feed_limit", 0),
    ("feed_limit", 1001),
    ("feed_limit", "four"),
    ("feed_limit", "4.0"),
    ("feed_limit", 4.0),
    ("feed_limit", True),
    ("feed_limit", -1),
    ("accept", "balanced-ish"),
    ("accept", "round-robin"),
    ("accept", "balance"),
    ("accept_batch", -1),
    ("accept_batch", "65536"),
    ("exclusive_accept", "maybe"),
    ("keepalive", "2"),
    ("keepalive_idle", -5),
    ("keepalive_count", "128"),
    ("poller", "kqueue-ish"),
    ("poller", "epol"),
    ("read_size", 1023),
    ("read_size", 16 * 1024 * 1024 + 1),
    ("read_size", "64k"),
    ("read_size", "0x10000"),
    ("time_metrics", "sometimes"),
    ("tls", "openssl"),
    ("datagram", "uvloop"),
    ("datagram_batch", 0),
    ("datagram_batch", "1025"),
    ("datagram_batch", True),
    ("pipe", "os"),
    ("slow_callback", "-0.1"),
    ("slow_callback", "3601"),
    ("slow_callback", "nan"),
    ("slow_callback", "100ms"),
    ("slow_callback", True),
    ("stats_dir", "/nonexistent/asyncio-relaxed"),
    ("stats_dir", __file__),  # a file, not a directory
    ("stats_dir", 5),
]


def test_field_table_is_the_documented_one() -> None:
    """Config has exactly the documented settings, in this order."""
    assert FIELDS == list(DEFAULTS)


def test_defaults() -> None:
    """With no keyword and an empty environment every field has its default."""
    config = resolve(environ={})
    assert config == Config()
    for name, value in DEFAULTS.items():
        assert getattr(config, name) == value
        assert type(getattr(config, name)) is type(value)


@pytest.mark.parametrize("name", FIELDS)
def test_env_var_name_and_effect(name: str) -> None:
    """ASYNCIO_RELAXED_<FIELD> sets that field and no other."""
    var = ENV_NAMES[name]
    assert var == ENV_PREFIX + name.upper()
    raw, parsed = NON_DEFAULT[name]
    config = resolve(environ={var: raw})
    assert getattr(config, name) == parsed
    assert dataclasses.replace(config, **{name: DEFAULTS[name]}) == Config()


@pytest.mark.parametrize("name", FIELDS)
def test_lowercase_or_unprefixed_env_names_are_ignored(name: str) -> None:
    """Only the exact upper-case prefixed name is read."""
    raw, _ = NON_DEFAULT[name]
    environ = {ENV_NAMES[name].lower(): raw, name.upper(): raw, name: raw}
    assert resolve(environ=environ) == Config()


@pytest.mark.parametrize("name", FIELDS)
def test_keyword_beats_env(name: str) -> None:
    """A keyword argument wins over the environment variable."""
    raw, _ = NON_DEFAULT[name]
    default = DEFAULTS[name]
    config = resolve({name: default}, environ={ENV_NAMES[name]: raw})
    assert getattr(config, name) == default


@pytest.mark.parametrize("name", FIELDS)
def test_env_beats_default_and_keyword_none_means_unset(name: str) -> None:
    """A keyword of None falls through to the environment, which beats the default."""
    raw, parsed = NON_DEFAULT[name]
    config = resolve({name: None}, environ={ENV_NAMES[name]: raw})
    assert getattr(config, name) == parsed


def test_resolve_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without environ=, resolve() reads os.environ."""
    monkeypatch.setenv("ASYNCIO_RELAXED_READ_SIZE", "4096")
    monkeypatch.setenv("ASYNCIO_RELAXED_WRITE", "deferred")
    config = resolve()
    assert config.read_size == 4096
    assert config.write is WriteMode.DEFERRED


@pytest.mark.parametrize("raw", ["", " ", "\t\n"])
@pytest.mark.parametrize("name", FIELDS)
def test_empty_env_string_means_unset(name: str, raw: str) -> None:
    """An empty (or blank) variable is the same as an unset one."""
    assert getattr(resolve(environ={ENV_NAMES[name]: raw}), name) == DEFAULTS[name]


@pytest.mark.parametrize(
    ("name", "token", "expected"),
    [
        ("write", "DEFERRED", WriteMode.DEFERRED),
        ("write", "  Deferred\n", WriteMode.DEFERRED),
        ("write", "\tEAGER ", WriteMode.EAGER),
        ("partial_write", " FeEd ", PartialWrite.FEED),
        ("poller", "EPOLL", Poller.EPOLL),
        ("poller", " Poll\t", Poller.POLL),
    ],
)
def test_enum_tokens_are_case_and_whitespace_tolerant(
    name: str, token: str, expected: object
) -> None:
    """Enum tokens match case-insensitively with surrounding blanks, by keyword or env."""
    assert getattr(resolve({name: token}, environ={}), name) is expected
    assert getattr(resolve(environ={ENV_NAMES[name]: token}), name) is expected


@pytest.mark.parametrize(
    ("name", "member"),
    [
        ("write", WriteMode.DEFERRED),
        ("partial_write", PartialWrite.FEED),
        ("poller", Poller.POLL),
        ("accept", AcceptStrategy.BALANCED),
    ],
)
def test_enum_members_are_accepted_as_keywords(name: str, member: object) -> None:
    """The enum member itself is a valid keyword value."""
    assert getattr(resolve({name: member}, environ={}), name) is member


@pytest.mark.parametrize(
    ("member", "token"),
    [
        (WriteMode.EAGER, "eager"),
        (WriteMode.DEFERRED, "deferred"),
        (PartialWrite.POLL, "poll"),
        (PartialWrite.FEED, "feed"),
        (Poller.AUTO, "auto"),
        (Poller.EPOLL, "epoll"),
        (Poller.POLL, "poll"),
        (Poller.SELECT, "select"),
        (AcceptStrategy.BALANCED, "balanced"),
    ],
)
def test_enum_str_is_the_token(member: object, token: str) -> None:
    """str() of a mode is the token accepted in env vars and flags."""
    assert str(member) == token
    assert f"{member}" == token


def test_tls_pipe_and_datagram_share_one_type() -> None:
    """The three settings that choose the loop's own transports or stock's
    take one enum, by any of its names, from the package too."""
    assert TlsMode is PipeMode is DatagramMode is asyncio_relaxed.Transports
    assert asyncio_relaxed.TlsMode is asyncio_relaxed.Transports
    assert [m.value for m in asyncio_relaxed.Transports] == ["own", "stock"]
    config = resolve({"tls": "stock", "pipe": "own", "datagram": "STOCK"}, {})
    assert (config.tls, config.pipe, config.datagram) == (
        asyncio_relaxed.Transports.STOCK, PipeMode.OWN, TlsMode.STOCK)


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        ("feed_limit", "1", 1),
        ("feed_limit", "1000", 1000),
        ("feed_limit", " 12\n", 12),
        ("feed_limit", "1_000", 1000),
        ("read_size", "1024", 1024),
        ("read_size", str(16 * 1024 * 1024), 16 * 1024 * 1024),
        ("read_size", "262_144", 262144),
    ],
)
def test_integer_bounds_are_inclusive(name: str, raw: str, expected: int) -> None:
    """Integer settings accept both bounds, blanks and underscores, by keyword or env."""
    assert getattr(resolve(environ={ENV_NAMES[name]: raw}), name) == expected
    assert getattr(resolve({name: raw}, environ={}), name) == expected
    assert getattr(resolve({name: expected}, environ={}), name) == expected


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_bad_keyword_value_names_keyword_value_and_allowed(name: str, value: object) -> None:
    """A bad keyword value raises ValueError naming the keyword, repr(value) and what is allowed."""
    with pytest.raises(ValueError) as info:
        resolve({name: value}, environ={})
    message = str(info.value)
    assert message.startswith(f"{name}={value!r} ")
    assert ENV_PREFIX not in message
    assert message.endswith(f"allowed: {ALLOWED[name]}")


# A blank variable means unset, so only the non-blank strings are bad in the environment.
BAD_ENV_VALUES = [(n, v) for n, v in BAD_VALUES if isinstance(v, str) and v.strip()]


@pytest.mark.parametrize(("name", "value"), BAD_ENV_VALUES)
def test_bad_env_value_names_variable_value_and_allowed(name: str, value: str) -> None:
    """A bad env value raises ValueError naming the variable, repr(value) and what is allowed."""
    with pytest.raises(ValueError) as info:
        resolve(environ={ENV_NAMES[name]: value})
    message = str(info.value)
    assert message.startswith(f"{ENV_NAMES[name]}={value!r} ")
    assert message.endswith(f"allowed: {ALLOWED[name]}")


def test_bad_env_value_repr_keeps_the_raw_text() -> None:
    """The message quotes the variable exactly as set, blanks included."""
    with pytest.raises(ValueError, match=r"^ASYNCIO_RELAXED_FEED_LIMIT=' 0 ' "):
        resolve(environ={"ASYNCIO_RELAXED_FEED_LIMIT": " 0 "})


def test_bad_env_value_is_ignored_when_keyword_given() -> None:
    """A keyword wins, so a broken variable for the same field is not parsed."""
    config = resolve({"write": "deferred"}, environ={"ASYNCIO_RELAXED_WRITE": "bogus"})
    assert config.write is WriteMode.DEFERRED


def test_unknown_keyword_is_a_type_error_listing_known_options() -> None:
    """An unknown keyword raises TypeError naming it and every known option."""
    with pytest.raises(TypeError) as info:
        resolve({"writ": "eager", "zzz": 1, "write": "eager"}, environ={})
    assert str(info.value) == (
        "unknown asyncio_relaxed option(s): writ, zzz; "
        "known: " + ", ".join(sorted(FIELDS))
    )


def test_unknown_keyword_is_checked_before_values() -> None:
    """The TypeError comes first even when another value is bad too."""
    with pytest.raises(TypeError, match="unknown asyncio_relaxed option"):
        resolve({"write": "bogus", "nope": 1}, environ={})


def _run_child(*flags: str) -> subprocess.CompletedProcess[str]:
    root = pathlib.Path(asyncio_relaxed.__file__).resolve().parent.parent
    env = {**os.environ, "ASYNCIO_RELAXED_WRITE": "bogus"}
    code = (
        "import sys; from asyncio_relaxed._config import resolve; "
        "print(sys.flags.ignore_environment, resolve().write)"
    )
    # cwd=root puts the package on sys.path even under -E (which drops PYTHONPATH).
    return subprocess.run(
        [sys.executable, *flags, "-c", code],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_python_E_ignores_the_environment() -> None:
    """Under python -E a bogus ASYNCIO_RELAXED_WRITE is invisible."""
    child = _run_child("-E")
    assert child.returncode == 0, child.stderr
    assert child.stdout == "1 eager\n"


def test_without_E_the_bogus_environment_fails() -> None:
    """The same child without -E fails, naming the variable."""
    child = _run_child()
    assert child.returncode == 1
    assert child.stdout == ""
    assert (
        "ValueError: ASYNCIO_RELAXED_WRITE='bogus' is not a valid setting; "
        "allowed: eager|deferred" in child.stderr
    )


def test_config_is_frozen() -> None:
    """A resolved Config cannot be changed."""
    config = resolve(environ={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.write = WriteMode.DEFERRED  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.read_size = 1  # type: ignore[misc]
    assert config == Config()


def test_describe_has_a_row_per_field() -> None:
    """describe() gives (field, env var, value, unit, reason) for every field, in order."""
    config = resolve({"feed_limit": 7}, environ={"ASYNCIO_RELAXED_POLLER": "poll"})
    rows = config.describe()
    assert [row[0] for row in rows] == FIELDS
    units = {
        "write": "mode",
        "partial_write": "mode",
        "feed_limit": "iterations",
        "accept": "strategy",
        "accept_batch": "connections",
        "exclusive_accept": "flag",
        "keepalive": "flag",
        "keepalive_idle": "seconds",
        "keepalive_interval": "seconds",
        "keepalive_count": "probes",
        "poller": "backend",
        "time_metrics": "flag",
        "tls": "mode",
        "datagram": "mode",
        "datagram_batch": "datagrams",
        "pipe": "mode",
        "slow_callback": "seconds",
        "stats_dir": "directory",
        "read_size": "bytes",
    }
    for name, var, value, unit, why in rows:
        assert var == ENV_NAMES[name]
        assert value == getattr(config, name)
        assert unit == units[name]
        assert isinstance(why, str)
        assert len(why.strip()) > 20
    values = {row[0]: row[2] for row in rows}
    assert values["feed_limit"] == 7
    assert values["poller"] is Poller.POLL


@pytest.mark.parametrize("where", ["keyword", "env"])
def test_accept_balanced_by_keyword_or_env(where: str) -> None:
    if where == "keyword":
        config = resolve({"accept": "balanced"}, environ={})
    else:
        config = resolve({}, environ={"ASYNCIO_RELAXED_ACCEPT": " Balanced "})
    assert config.accept is AcceptStrategy.BALANCED
