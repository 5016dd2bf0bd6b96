"""The admin API on a real socket (127.0.0.1, port 0): the deployment routes against ``InMemoryDesiredState``,
the token, and every bound on what a client sends."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgehub.core.refusals import RefusalLog
from edgehub.runtime.admin.api import AdminApi
from edgehub.runtime.admin.client import AdminClient, AdminError, running_hub
from edgehub.runtime.admin.files import ensure_token, read_token, remove_port_file, write_port_file
from edgehub.runtime.admin.http import AdminHttpServer, AdminLimits, Request, Response
from edgehub.testing.desired import InMemoryDesiredState

TOKEN = "test-token-0123456789"
LOGGER = "tests.admin"


@asynccontextmanager
async def admin(
    desired: InMemoryDesiredState | None = None,
    *,
    limits: AdminLimits | None = None,
    ready: bool = True,
) -> AsyncIterator[AdminClient]:
    refusals = RefusalLog(logging.getLogger(LOGGER), burst=100)
    api = AdminApi(token=TOKEN, refusals=refusals, desired=desired, ready=lambda: ready)
    async with AdminHttpServer(api, refusals=refusals, limits=limits, holds_token=api.holds_token) as server:
        yield AdminClient(server.port, TOKEN, timeout_s=5.0)


async def call(client: AdminClient, method: str, path: str, body: object | None = None) -> tuple[int, object]:
    return await asyncio.to_thread(client.request, method, path, body, ok=tuple(range(200, 600)))


async def raw_exchange(port: int, data: bytes, *, close_write: bool = False) -> bytes:
    """Send ``data`` and read until the server closes (bounded)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        if close_write:
            writer.write_eof()
        async with asyncio.timeout(10):
            return await reader.read(-1)
    finally:
        writer.close()


def status_of(response: bytes) -> int:
    assert response.startswith(b"HTTP/1.1 "), response[:80]
    return int(response[9:12])


async def test_put_desired_applies_and_reported_shows_its_version() -> None:
    desired = InMemoryDesiredState()
    async with admin(desired) as client:
        status, body = await call(
            client, "PUT", "/twin/desired", {"$version": 7, "routes": {"r": "FROM /* INTO $upstream"}}
        )
        assert status == 200
        assert body == {"code": 200, "description": "applied", "errors": [], "version": 7}
        status, reported = await call(client, "GET", "/twin/reported")
    assert status == 200
    assert isinstance(reported, dict)
    assert reported["lastDesiredVersion"] == 7
    assert reported["desired"] == {"$version": 7, "routes": {"r": "FROM /* INTO $upstream"}}
    assert desired.updates[0][0] == "put"
    assert desired.updates[0][2] == "admin-api 127.0.0.1"


async def test_patch_desired_is_a_json_merge_patch() -> None:
    desired = InMemoryDesiredState(desired={"routes": {"a": "x", "b": "y"}, "ttl": 10})
    async with admin(desired) as client:
        status, body = await call(client, "PATCH", "/twin/desired", {"routes": {"a": None, "c": "z"}, "ttl": 20})
    assert status == 200, body
    assert desired.desired == {"routes": {"b": "y", "c": "z"}, "ttl": 20}


async def test_a_refused_update_answers_400_with_its_errors_and_changes_nothing() -> None:
    desired = InMemoryDesiredState(desired={"routes": {"a": "x"}}, refuse_keys={"bogus"})
    async with admin(desired) as client:
        status, body = await call(client, "PATCH", "/twin/desired", {"bogus": 1, "routes": {"a": "y"}})
    assert status == 400
    assert isinstance(body, dict)
    assert body["errors"] == ["bogus: refused by the test"]
    assert desired.desired == {"routes": {"a": "x"}}


async def test_a_request_without_the_token_is_refused_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    desired = InMemoryDesiredState()
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with admin(desired) as client:
        wrong = AdminClient(client.port, "not-the-token", timeout_s=5.0)
        status, body = await call(wrong, "PUT", "/twin/desired", {"x": 1})
        status_none, _ = await asyncio.to_thread(
            AdminClient(client.port, "", timeout_s=5.0).raw, "GET", "/twin/reported"
        )
    assert (status, status_none) == (401, 401)
    assert isinstance(body, dict)
    assert body["error"] == "bad_credentials"
    assert desired.updates == []
    assert any("refused reason=bad_credentials" in r.getMessage() for r in caplog.records)


async def test_refusals_of_one_address_share_one_budget_of_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tests.budget")
    refusals = RefusalLog(logging.getLogger("tests.budget"), burst=3)
    api = AdminApi(token=TOKEN, refusals=refusals)
    async with AdminHttpServer(api, refusals=refusals) as server:
        wrong = AdminClient(server.port, "guess", timeout_s=5.0)
        for _ in range(10):  # a new connection, so a new source port, each time
            assert (await asyncio.to_thread(wrong.raw, "GET", "/twin/reported"))[0] == 401
    assert refusals.total == 10
    assert len([r for r in caplog.records if r.name == "tests.budget"]) == 3


async def test_health_needs_no_token_and_ready_says_503_until_ready() -> None:
    async with admin(ready=False) as client:
        anonymous = AdminClient(client.port, "", timeout_s=5.0)
        health = await asyncio.to_thread(anonymous.raw, "GET", "/health")
        ready = await asyncio.to_thread(anonymous.raw, "GET", "/ready")
    assert health[0] == 200
    assert ready[0] == 503


async def test_without_a_deployment_service_the_twin_routes_answer_503() -> None:
    async with admin(None) as client:
        status, body = await call(client, "GET", "/twin/reported")
    assert status == 503
    assert isinstance(body, dict)
    assert "deployment" in str(body["detail"])


@pytest.mark.parametrize(
    ("body", "why"),
    [(b"{not json", "not JSON"), (b"[1, 2]", "JSON object"), (b"[" * 100_000 + b"]" * 100_000, "")],
)
async def test_a_body_that_is_not_a_json_object_is_a_400(body: bytes, why: str) -> None:
    desired = InMemoryDesiredState()
    async with admin(desired, limits=AdminLimits(max_body_bytes=1 << 20)) as client:
        head = f"PUT /twin/desired HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        response = await raw_exchange(client.port, head.encode() + body)
    assert status_of(response) == 400
    assert why.encode() in response
    assert desired.updates == []


@pytest.mark.parametrize("method", ["PUT", "PATCH"])
@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"9" * 5000, b"an integer of 5000 digits"),
        (b"-" + b"9" * 5000, b"an integer of 5000 digits"),
        (b"NaN", b"NaN is not a JSON number"),
        (b"-Infinity", b"-Infinity is not a JSON number"),
    ],
)
async def test_admin_refuses_a_5000_digit_integer_or_a_nan_with_400_and_one_refusal_line(
    caplog: pytest.LogCaptureFixture, method: str, value: bytes, why: bytes
) -> None:
    caplog.set_level(logging.INFO)
    desired = InMemoryDesiredState()
    body = b'{"routes": {"r": "FROM /* INTO $upstream"}, "big": ' + value + b"}"
    async with admin(desired) as client:
        head = f"{method} /twin/desired HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        response = await raw_exchange(client.port, head.encode() + body)
        health = await asyncio.to_thread(client.raw, "GET", "/health")  # the server goes on
    assert status_of(response) == 400
    assert b'"error": "invalid_request"' in response
    assert why in response
    assert health[0] == 200
    assert desired.updates == []
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1
    assert lines[0].startswith("refused reason=invalid_request peer=127.0.0.1")
    assert why.decode() in lines[0]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_body_over_the_limit_is_refused_413_before_it_is_read() -> None:
    async with admin(InMemoryDesiredState(), limits=AdminLimits(max_body_bytes=1000)) as client:
        head = f"PUT /twin/desired HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        head += "Content-Length: 10000000\r\n\r\n"
        response = await raw_exchange(client.port, head.encode())  # no body sent: the answer comes anyway
    assert status_of(response) == 413


async def test_a_chunked_body_over_the_limit_is_refused_413() -> None:
    async with admin(InMemoryDesiredState(), limits=AdminLimits(max_body_bytes=1000)) as client:
        head = f"PUT /twin/desired HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        head += "Transfer-Encoding: chunked\r\n\r\n"
        chunk = b"800\r\n" + b"x" * 0x800 + b"\r\n"
        response = await raw_exchange(client.port, head.encode() + chunk)
    assert status_of(response) == 413


async def test_headers_over_the_limit_are_refused_431() -> None:
    async with admin(limits=AdminLimits(max_header_bytes=1024)) as client:
        head = "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + "a" * 4000 + "\r\n\r\n"
        response = await raw_exchange(client.port, head.encode())
    assert status_of(response) == 431


async def test_a_request_that_does_not_arrive_in_time_is_refused_408(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with admin(limits=AdminLimits(header_timeout_s=0.3)) as client:
        response = await raw_exchange(client.port, b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
    assert status_of(response) == 408
    assert any("refused reason=request_timeout" in r.getMessage() for r in caplog.records)


async def test_malformed_http_is_a_400_and_the_server_goes_on() -> None:
    async with admin() as client:
        response = await raw_exchange(client.port, b"\x16\x03\x01 not http at all\r\n\r\n")
        health = await asyncio.to_thread(client.raw, "GET", "/health")
    assert status_of(response) == 400
    assert health[0] == 200


async def idle_connections(port: int, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``count`` connections that send nothing: each holds a slot from its accept (the server accepts in order,
    so they hold theirs before any connection opened after them is served)."""
    return [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)]


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it closed (bounded in time)."""
    async with asyncio.timeout(10):
        return await reader.read(-1)


async def test_idle_connections_in_every_slot_do_not_keep_the_token_holder_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    # A header timeout far longer than the test: the slots stay held unless something frees one.
    limits = AdminLimits(max_connections=4, header_timeout_s=60.0)
    async with admin(InMemoryDesiredState(), limits=limits) as client:
        held = await idle_connections(client.port, 4)
        try:
            status, _ = await call(client, "GET", "/twin/reported")  # the CLI: the token, one request
            assert status == 200
            # The stranger's connection that had waited longest made room for it.
            assert await closed_by_server(held[0][0]) == b""
        finally:
            for _, writer in held:
                writer.close()
    assert any(
        "refused reason=too_many_connections" in r.getMessage() and "closed for a newer connection" in r.getMessage()
        for r in caplog.records
    )


async def test_a_connection_without_a_whole_request_head_is_closed_after_the_header_timeout_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with admin(limits=AdminLimits(header_timeout_s=0.2, request_timeout_s=60.0)) as client:
        (silent_reader, silent), (partial_reader, partial) = await idle_connections(client.port, 2)
        try:
            partial.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
            assert await closed_by_server(silent_reader) == b""  # it asked nothing: closed, nothing to answer
            assert status_of(await closed_by_server(partial_reader)) == 408
        finally:
            silent.close()
            partial.close()
    lines = [r.getMessage() for r in caplog.records if "refused reason=request_timeout" in r.getMessage()]
    assert len(lines) == 2
    assert all("timeout_s=0.2 phase=head" in line for line in lines)


async def test_a_token_holders_request_may_take_the_request_timeout_a_strangers_only_the_header_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with admin(InMemoryDesiredState(), limits=AdminLimits(header_timeout_s=0.3, request_timeout_s=60.0)) as c:
        body = b'{"$version": 1}'
        head = "PATCH /twin/desired HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n{}\r\n"
        stranger_r, stranger = await asyncio.open_connection("127.0.0.1", c.port)
        holder_r, holder = await asyncio.open_connection("127.0.0.1", c.port)
        try:
            stranger.write(head.format(len(body), "").encode() + body[:5])  # the body is slow to come
            holder.write(head.format(len(body), f"Authorization: Bearer {TOKEN}\r\n").encode() + body[:5])
            assert status_of(await closed_by_server(stranger_r)) == 408
            holder.write(body[5:])  # after the stranger's 0.3 s: the holder's request is still awaited
            async with asyncio.timeout(10):
                assert (await holder_r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        finally:
            stranger.close()
            holder.close()
    assert any(
        "refused reason=request_timeout" in r.getMessage() and "timeout_s=0.3" in r.getMessage() for r in caplog.records
    )


async def test_a_new_connection_is_answered_503_only_while_every_slot_is_in_its_handler() -> None:
    release = asyncio.Event()
    entered: asyncio.Queue[None] = asyncio.Queue()

    async def stalls(request: Request) -> Response:
        entered.put_nowait(None)
        await release.wait()
        return Response.json(200, {})

    refusals = RefusalLog(logging.getLogger(LOGGER))
    async with AdminHttpServer(stalls, refusals=refusals, limits=AdminLimits(max_connections=2)) as server:
        held = await idle_connections(server.port, 2)
        try:
            for _, writer in held:
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                async with asyncio.timeout(10):
                    await entered.get()
            response = await raw_exchange(server.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status_of(response) == 503
        finally:
            release.set()
            for _, writer in held:
                writer.close()


async def test_unknown_routes_are_404_and_wrong_methods_405() -> None:
    async with admin(InMemoryDesiredState()) as client:
        missing, _ = await call(client, "GET", "/nothing/here")
        wrong, _ = await call(client, "DELETE", "/twin/desired")
    assert (missing, wrong) == (404, 405)


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    async with admin() as client:
        request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        response = await raw_exchange(
            client.port, request * 2 + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    assert response.count(b"HTTP/1.1 200") == 3


async def test_head_gets_the_headers_of_get_without_a_body(caplog: pytest.LogCaptureFixture) -> None:
    async with admin() as client:
        request = (
            b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        response = await raw_exchange(client.port, request)
    head, _, rest = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"content-length: 20" in head  # GET's length ({"status": "alive"} and a newline) ...
    assert rest.startswith(b"HTTP/1.1 200")  # ... and no body before the next answer
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_a_taken_port_is_an_os_error_that_says_what_to_do() -> None:
    refusals = RefusalLog(logging.getLogger(LOGGER))
    async with admin() as client:
        with pytest.raises(OSError, match=r"admin API cannot listen on 127\.0\.0\.1:.*--admin-port 0"):
            async with AdminHttpServer(AdminApi(token=TOKEN, refusals=refusals), refusals=refusals, port=client.port):
                pass


def test_the_admin_api_refuses_to_listen_beyond_loopback() -> None:
    refusals = RefusalLog(logging.getLogger(LOGGER))
    api = AdminApi(token=TOKEN, refusals=refusals)
    with pytest.raises(ValueError, match="loopback"):
        AdminHttpServer(api, refusals=refusals, host="0.0.0.0")


def test_the_token_file_is_made_0600_and_kept(tmp_path: Path) -> None:
    token = ensure_token(tmp_path)
    path = tmp_path / "admin.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(token) >= 40
    assert ensure_token(tmp_path) == token == read_token(tmp_path)
    os.chmod(path, 0o644)
    assert ensure_token(tmp_path) == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_running_hub_finds_the_api_from_the_port_file_and_ignores_a_stale_one(tmp_path: Path) -> None:
    token = ensure_token(tmp_path)
    refusals = RefusalLog(logging.getLogger(LOGGER))
    async with AdminHttpServer(AdminApi(token=token, refusals=refusals), refusals=refusals) as server:
        assert await asyncio.to_thread(running_hub, tmp_path) is None  # no port file yet
        write_port_file(tmp_path, server.port)
        found = await asyncio.to_thread(running_hub, tmp_path)
        assert found is not None
        assert found.port == server.port
        port = server.port
    # The server is gone, its file left behind (as a killed hub leaves it): not a running hub.
    assert await asyncio.to_thread(running_hub, tmp_path) is None
    remove_port_file(tmp_path, port)
    assert not (tmp_path / "admin.port").exists()


async def test_the_client_raises_admin_error_with_the_reason() -> None:
    async with admin(InMemoryDesiredState(refuse_keys={"bad"})) as client:
        with pytest.raises(AdminError) as info:
            await asyncio.to_thread(client.request, "PUT", "/twin/desired", {"bad": 1})
    assert info.value.status == 400
    assert json.dumps("bad") in json.dumps(info.value.detail) or "bad" in info.value.detail


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=300),
            st.sampled_from(
                [
                    b"GET /health HTTP/1.1\r\n",
                    b"PUT /twin/desired HTTP/1.1\r\n",
                    b"HEAD /health HTTP/1.1\r\n",
                    b"Host: x\r\n",
                    f"Authorization: Bearer {TOKEN}\r\n".encode(),
                    b"Content-Length: 3\r\n",
                    b"Content-Length: -1\r\n",
                    b"Transfer-Encoding: chunked\r\n",
                    b"\r\n",
                    b"3\r\nabc\r\n0\r\n\r\n",
                    b"{}",
                ]
            ),
        ),
        max_size=8,
    )
)
async def test_whatever_a_client_sends_gets_an_answer_or_a_close_and_never_a_traceback(
    caplog: pytest.LogCaptureFixture, parts: list[bytes]
) -> None:
    caplog.clear()
    async with admin(InMemoryDesiredState(), limits=AdminLimits(request_timeout_s=0.5)) as client:
        response = await raw_exchange(client.port, b"".join(parts), close_write=True)
        health = await asyncio.to_thread(client.raw, "GET", "/health")
    assert response == b"" or response.startswith(b"HTTP/1.1 ")
    assert health[0] == 200
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
