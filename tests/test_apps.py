"""The application workloads (issue #43, benchmarks/workloads/apps.py): their
parsers and bookkeeping without sockets, their place in the catalog, and a
smoke run of each through ``python -m benchmarks run`` on the pure-Python
build (schema and positive numbers; no timing assertions)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness import loops, processes, services
from benchmarks.workloads import apps, catalog, client, openloop, runner, server
from benchmarks.workloads.catalog import WORKLOADS

APPS = ("uvicorn-json", "uvicorn-json-h11", "uvicorn-json-tls", "aiohttp-pg", "aiohttp-pg-tls",
        "ws-broadcast-1000", "redis-proxy")

# -- RESP --------------------------------------------------------------------------

#: Pipelined commands, one value holding CRLF and a "$" and one empty.
COMMANDS = [[b"SET", b"k1", b"a\r\n$3\r\nb"], [b"GET", b"k1"], [b"PING"],
            [b"SET", b"empty", b""], [b"GET", b"missing"], [b"get", b"empty"]]
STREAM = b"".join(client.resp_command(*c) for c in COMMANDS)


def test_resp_command_is_an_array_of_bulk_strings() -> None:
    assert client.resp_command(b"GET", b"key") == b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n"


def test_resp_parser_reads_pipelined_commands_cut_at_every_byte() -> None:
    assert apps.RespParser().feed(STREAM) == COMMANDS
    for cut in range(len(STREAM) + 1):
        parser = apps.RespParser()
        got = parser.feed(STREAM[:cut]) + parser.feed(STREAM[cut:])
        assert got == COMMANDS, cut
        assert parser.buffer == b""
    parser = apps.RespParser()
    got = []
    for i in range(len(STREAM)):
        got += parser.feed(STREAM[i:i + 1])
    assert got == COMMANDS


def test_resp_parser_refuses_what_is_not_an_array_of_bulk_strings() -> None:
    for bad in (b"PING\r\n", b"*1\r\n+PING\r\n", b"*x\r\n", b"*1\r\n$2\r\nabc\r\n",
                b"*1\r\n$-1\r\n"):
        with pytest.raises(apps.RespError):
            apps.RespParser().feed(bad)


def test_resp_answers_from_the_store() -> None:
    store: dict[bytes, bytes] = {}
    replies = [apps.answer(store, c) for c in COMMANDS]
    assert replies == [b"+OK\r\n", b"$8\r\na\r\n$3\r\nb\r\n", b"+PONG\r\n", b"+OK\r\n",
                       b"$-1\r\n", b"$0\r\n\r\n"]
    assert apps.answer(store, [b"DEL", b"k1"]).startswith(b"-ERR")
    assert apps.answer(store, [b"GET"]).startswith(b"-ERR")


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True


def test_resp_protocol_answers_every_command_of_a_read_in_one_write() -> None:
    proto = apps.RespProtocol({})
    transport = _Transport()
    proto.connection_made(transport)
    proto.data_received(STREAM[:10])  # no whole command yet: no write
    assert transport.writes == []
    proto.data_received(STREAM[10:])
    store: dict[bytes, bytes] = {}
    assert transport.writes == [b"".join(apps.answer(store, c) for c in COMMANDS)]
    proto.data_received(b"PING\r\n")  # an inline command: an error, then the end
    assert transport.writes[-1].startswith(b"-ERR protocol error") and transport.closed


# -- ws-broadcast ----------------------------------------------------------------------


def test_broadcaster_sends_the_next_message_on_the_last_ones_ack() -> None:
    b = apps.Broadcaster()
    first = b.ack((0).to_bytes(8, "little"))  # the client's start
    assert first is not None and len(first) == apps.MESSAGE
    assert int.from_bytes(first[:8], "little") == 1 and int.from_bytes(first[8:16], "little") > 0
    assert b.ack((0).to_bytes(8, "little")) is None  # stale: broadcast 1 is under way
    assert b.ack((2).to_bytes(8, "little")) is None
    assert b.ack(b"1") is None
    second = b.ack((1).to_bytes(8, "little"))
    assert second is not None and int.from_bytes(second[:8], "little") == 2


def test_deliveries_complete_a_broadcast_at_its_last_connection() -> None:
    d = apps.Deliveries(3)
    assert [d.deliver(i, 1) for i in (2, 0, 1)] == [False, False, True]
    assert d.seq == 2
    assert d.deliver(1, 2) is False
    with pytest.raises(ValueError, match="connection 1 received broadcast 2 after 2"):
        d.deliver(1, 2)  # twice on one connection
    with pytest.raises(ValueError, match="while 2 is under way"):
        d.deliver(0, 3)  # one ahead
    assert d.deliver(0, 2) is False and d.deliver(2, 2) is True


# -- uvicorn-json --------------------------------------------------------------------


def test_check_item_takes_the_workloads_body_and_names_what_is_wrong() -> None:
    good = json.loads(catalog.ITEM)
    assert apps.check_item(good) == good
    assert apps.check_item({**good, "price": 0}) != good and isinstance(
        apps.check_item({**good, "price": 0}), dict)
    del good["tags"]
    assert apps.check_item(good) == {**good, "tags": []}
    for bad, field in (([], "object"), ({**good, "name": ""}, "name"),
                       ({**good, "name": 7}, "name"), ({**good, "price": -1}, "price"),
                       ({**good, "price": True}, "price"), ({**good, "price": "1"}, "price"),
                       ({**good, "quantity": 0}, "quantity"),
                       ({**good, "quantity": 1.5}, "quantity"),
                       ({**good, "quantity": True}, "quantity"),
                       ({**good, "tags": ["a", 1]}, "tags"),
                       ({**good, "tags": ["t"] * 11}, "tags")):
        why = apps.check_item(bad)
        assert isinstance(why, str) and field in why, bad


def test_http_request_with_a_body_and_without() -> None:
    assert client.http_request("GET", "/4k", "") == b"GET /4k HTTP/1.1\r\nHost: bench\r\n\r\n"
    request = client.http_request("POST", "/items/42", catalog.ITEM)
    head, _, body = request.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /items/42 HTTP/1.1\r\n")
    assert f"Content-Length: {len(catalog.ITEM)}".encode() in head
    assert body == catalog.ITEM.encode()


def test_wrk_posts_the_body_through_a_lua_script() -> None:
    assert runner.wrk_script(WORKLOADS["http-0b"]) is None
    script = runner.wrk_script(WORKLOADS["uvicorn-json"])
    assert script is not None
    assert 'wrk.method = "POST"' in script
    assert f"wrk.body = {json.dumps(catalog.ITEM)}" in script
    assert 'wrk.headers["Content-Type"] = "application/json"' in script


# -- the catalog and the runner --------------------------------------------------------


def test_the_apps_run_by_name_on_every_loop_that_can_run_them() -> None:
    default = {w.name for w in runner.select(None, full=False)}
    # uvicorn-json is the README table's application row; the rest by name.
    assert default & set(APPS) == {"uvicorn-json"}
    assert {w.name for w in runner.select(["uvicorn-json*", "aiohttp-pg*", "ws-*", "redis-*"],
                                          full=False)} == set(APPS)
    for name in APPS:
        w = WORKLOADS[name]
        assert w.server in server.KINDS and w.client in (*client.KINDS, "wrk"), name
        assert "relaxed-eager-pure" in w.loops and set(loops.PEERS) <= set(w.loops), name
        assert not any(loops.SPECS[n].kind == "floor" for n in w.loops), name
        if w.server == "uvicorn-json":  # uvicorn's --loop names no aiofastnet pairing
            assert not any(loops.SPECS[n].kind == "aiofastnet" for n in w.loops), name
    assert WORKLOADS["uvicorn-json"].loops == WORKLOADS["uvicorn-plaintext"].loops
    assert WORKLOADS["aiohttp-pg-tls"].loops == WORKLOADS["https-0b"].loops
    assert WORKLOADS["aiohttp-pg"].services == ("postgres",)


def test_the_new_fields_leave_the_other_workloads_parameters_as_they_were() -> None:
    for w in WORKLOADS.values():
        params = w.params()
        assert "services" not in params
        if w.name not in APPS and w.client != "open":  # (the open-loop client's body its own)
            assert not {"method", "body", "pipeline"} & set(params), w.name
            assert runner._request_flags(w) == (), w.name
    assert WORKLOADS["redis-proxy"].params()["pipeline"] == 16
    assert WORKLOADS["uvicorn-json"].params()["method"] == "POST"
    command = runner.client_command(WORKLOADS["uvicorn-json"], 0.1, 0.2)
    assert command[command.index("--method") + 1] == "POST"
    assert command[command.index("--body") + 1] == catalog.ITEM
    command = runner.client_command(WORKLOADS["redis-proxy"], 0.1, 0.2)
    assert command[command.index("--pipeline") + 1] == "16"


def test_a_workload_whose_service_is_missing_is_skipped_saying_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = WORKLOADS["aiohttp-pg"]
    monkeypatch.setattr(catalog, "metadata", _Installed())  # every need installed
    monkeypatch.setattr(services, "FILE", tmp_path / ".services.json")
    why = catalog.missing(w)
    assert why is not None and why.startswith("aiohttp-pg needs postgres: no .services.json")
    assert "`.ci/services up`" in why
    (tmp_path / ".services.json").write_text(json.dumps({"redis": {}}))
    assert "names no 'postgres' service" in (catalog.missing(w) or "")
    (tmp_path / ".services.json").write_text(json.dumps({"postgres": {"port": 5}}))
    assert catalog.missing(w) is None
    assert services.read("postgres") == {"port": 5}
    assert catalog.missing(WORKLOADS["redis-proxy"]) is None  # no service needed


class _Installed:
    PackageNotFoundError = LookupError

    @staticmethod
    def version(name: str) -> str:
        return "99.0"


def test_a_non_2xx_response_fails_the_run() -> None:
    w = WORKLOADS["uvicorn-json"]
    result = {"requests": 100, "elapsed": 0.2, "p50_us": 900.0, "p99_us": 2000.0}
    marks = {"cpu": 1.0}, {"cpu": 1.01}
    assert runner._figures(w, "asyncio", 0.2, result, *marks, "builtin")["rate"] == 500
    with pytest.raises(RuntimeError, match="uvicorn-json on asyncio: 100 responses were not 2xx"):
        runner._figures(w, "asyncio", 0.2, {**result, "non_2xx": 100}, *marks, "builtin")


def test_the_resp_client_fails_on_a_wrong_answer() -> None:
    async def main() -> None:
        meter = client.Meter()
        proto = client.RespClient(meter, 0, 2, 3)
        transport = _Transport()
        proto.connection_made(transport)
        assert transport.writes == [client.resp_command(b"SET", b"key:0:0", b"aaa")
                                    + client.resp_command(b"SET", b"key:0:1", b"aaa")]
        proto.data_received(b"+OK\r\n+OK")
        proto.data_received(b"\r\n")  # the keys are set: the first pipeline goes out
        assert transport.writes[-1] == (client.resp_command(b"GET", b"key:0:0")
                                        + client.resp_command(b"GET", b"key:0:1"))
        meter.counting = True
        proto.data_received(b"$3\r\naaa\r\n$3\r\naaa\r\n")
        assert meter.requests == 1 and len(transport.writes) == 3
        proto.data_received(b"$3\r\naaa\r\n$-1\r\n\r\n\r\n\r\n")
        assert meter.requests == 1 and transport.closed
        assert meter.errors and "the server answered" in meter.errors[0]

    asyncio.run(main())


# -- smoke runs --------------------------------------------------------------------


def _pure_loop() -> str:
    """The pure-Python build's preset; where it is the only build (PyPy, a
    checkout without the compiled module), ``relaxed-eager`` runs it."""
    if loops.missing("relaxed-eager-pure") is None:
        return "relaxed-eager-pure"
    if loops.build("relaxed-eager") == "pure":
        return "relaxed-eager"
    pytest.skip(loops.missing("relaxed-eager-pure") or "")


def _smoke_run(name: str, loop: str, folder: Path) -> dict[str, Any]:
    """Workload *name* on *loop*, one 0.2 s window per figure, through
    ``python -m benchmarks run``: its entry in the results, checked free
    of errors."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "--workloads", name, "--loops", loop,
         "--duration", "0.2", "--warmup", "0.1", "--repeat", "1", "--no-syscalls",
         "--no-charts", "--results", str(folder)],
        cwd=processes.ROOT, capture_output=True, text=True, timeout=80)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = folder.glob("*.json")
    (entry,) = json.loads(path.read_text())["workloads"]
    assert entry["errors"] == {} and entry["unsupported"] == {}, entry
    return entry  # type: ignore[no-any-return]


@pytest.mark.bench
@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", APPS)
def test_smoke_app_workload(name: str, tmp_path: Path) -> None:
    """Each application workload through the command line, on the pure
    build, with the shortest window the smoke tests use: it runs without
    error and its figures are positive."""
    w = WORKLOADS[name]
    why = catalog.missing(w)
    if why:
        pytest.skip(why)
    loop = _pure_loop()
    entry = _smoke_run(name, loop, tmp_path)
    assert entry["unit"] == w.unit and set(entry["loops"]) == {loop}
    data: dict[str, Any] = entry["loops"][loop]
    med = data["median"]
    assert med["rate"] > 0 and med["cpu_us_per_unit"] > 0
    assert 0 < med["p50_us"] <= med["p99_us"]
    assert med["callbacks_per_unit"] > 0  # the server's loop.statistics()
    if w.tls:
        assert data["client"].endswith("TLS 1.3"), data["client"]
    if name == "ws-broadcast-1000":  # a broadcast is 1,000 deliveries
        assert data["samples"][0]["broadcasts"] > 0
    if name == "redis-proxy":  # 16 commands per pipeline
        assert data["samples"][0]["pipelines"] > 0


OPEN_REDIS = "openloop-redis-proxy-uvloop80"


def test_redis_proxy_has_an_open_loop_window_of_the_same_pipelines() -> None:
    """redis-proxy's server under the open-loop client: 16 pipelined GETs a
    request, of a 64 B value the server holds from the start, at 80 % of
    uvloop's capacity on every loop that runs redis-proxy."""
    w, closed = WORKLOADS[OPEN_REDIS], WORKLOADS["redis-proxy"]
    assert (w.server, w.client, w.protocol, w.pipeline, w.loads, w.rate_of) == (
        closed.server, "open", "redis", closed.pipeline, (80,), "uvloop")
    assert w.loops == closed.loops and not w.default and catalog.missing(w) is None
    assert OPEN_REDIS in {x.name for x in runner.select(["openloop-*"], full=False)}
    command = runner.client_command(w, 0.1, 0.2)
    assert command[command.index("--protocol") + 1] == "redis"
    assert command[command.index("--pipeline") + 1] == "16"
    assert command[command.index("--body") + 1] == "GET key"
    server_cmd = runner.server_command(w, "asyncio")
    assert server_cmd[server_cmd.index("--value") + 1] == str(closed.response)
    # What the server answers the client's request: 16 bulk strings of 64 B,
    # which the client's framer counts as one answer.
    request = openloop.request_bytes(w.protocol, body=w.body, pipeline=w.pipeline)
    store = {b"key": b"v" * 64}
    replies = b"".join(apps.answer(store, c) for c in apps.RespParser().feed(request))
    assert replies == (
        b"$64\r\n" + b"v" * 64 + b"\r\n") * 16
    assert openloop.framer(w.protocol, pipeline=w.pipeline).feed(replies) == 1


@pytest.mark.bench
@pytest.mark.timeout(90)
def test_smoke_redis_proxy_open_loop(tmp_path: Path) -> None:
    """The open-loop window through the command line on the pure build
    (uvloop first: the rate is 80 % of its capacity): it runs without error,
    and its figures, the client's headroom among them, are positive."""
    w = WORKLOADS[OPEN_REDIS]
    if loops.missing("uvloop"):
        pytest.skip(f"{OPEN_REDIS} sets its rate from uvloop's capacity: "
                    f"{loops.missing('uvloop')}")
    loop = _pure_loop()
    entry = _smoke_run(w.name, loop, tmp_path)
    assert set(entry["loops"]) == {"uvloop", loop}
    data: dict[str, Any] = entry["loops"][loop]
    assert "redis x16" in data["client"], data["client"]
    med = data["median"]
    assert med["rate"] > 0 and med["target_80"] > 0 and med["achieved_rate_80"] > 0
    assert 0 < med["p50_us_80"] <= med["p99_us_80"]
    assert med["client_headroom_80"] > 0


def test_a_loop_without_tls_servers_is_noted_not_served(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn-json-tls's startup probe: a loop whose create_server(ssl=)
    raises NotImplementedError (rloop 0.5.0's) is named with its error."""
    from benchmarks.harness import tls

    if tls.missing():
        pytest.skip(tls.missing() or "")
    tls.make(tmp_path)
    monkeypatch.setenv(tls.ENV, str(tmp_path))

    class NoTls(asyncio.SelectorEventLoop):
        async def create_server(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("ssl") is not None:
                raise NotImplementedError("no TLS here")
            return await super().create_server(*args, **kwargs)

    for make, refused in ((NoTls, True), (asyncio.SelectorEventLoop, False)):
        loop = make()
        try:
            why = loop.run_until_complete(apps.tls_refused(loop))
        finally:
            loop.close()
        if refused:
            assert why is not None and why.endswith(
                "NoTls: create_server(ssl=) raised NotImplementedError: no TLS here")
        else:
            assert why is None
