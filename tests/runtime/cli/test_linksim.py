"""``edgehub link-sim`` runs a real shaped proxy as its own process."""

from __future__ import annotations

import asyncio
import socket
import sys

from click.testing import CliRunner

from edgehub.runtime.cli import main
from edgehub.runtime.cli.linksim import OUTAGE_MODES
from edgehub.testing.linksim import OutageMode


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_outage_modes_offered_are_the_simulators() -> None:
    assert tuple(m.value for m in OutageMode) == OUTAGE_MODES


def test_link_sim_refuses_a_rate_it_cannot_read() -> None:
    result = CliRunner().invoke(main, ["link-sim", "--listen", "127.0.0.1:0", "--target", "127.0.0.1:1", "--rate", "x"])
    assert result.exit_code == 2
    assert "not a rate" in result.output


async def test_link_sim_command_forwards_to_its_target_with_delay() -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readexactly(5))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    target = server.sockets[0].getsockname()[1]
    listen = _free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from edgehub.runtime.cli import main; main()",
        "link-sim",
        "--listen",
        f"127.0.0.1:{listen}",
        "--target",
        f"127.0.0.1:{target}",
        "--rate",
        "64kbit",
        "--delay",
        "50ms",
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(15):
            assert proc.stderr is not None
            while b"listening" not in await proc.stderr.readline():
                pass
            reader, writer = await asyncio.open_connection("127.0.0.1", listen)
            writer.write(b"hello")
            assert await reader.readexactly(5) == b"hello"
            writer.close()
    finally:
        proc.terminate()
        await proc.wait()
        server.close()


def test_tc_mode_refuses_delay_which_tbf_cannot_do() -> None:
    result = CliRunner().invoke(main, ["link-sim", "--tc-netns", "x", "--rate", "64kbit", "--delay", "300ms"])
    assert result.exit_code == 2
    assert "rate only" in result.output


def test_proxy_mode_needs_listen_and_target() -> None:
    result = CliRunner().invoke(main, ["link-sim", "--rate", "64kbit"])
    assert result.exit_code == 2
    assert "--listen and --target are required" in result.output
