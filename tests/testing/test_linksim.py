"""The link simulator does what it says: rate, delay, hard cut, silent death, restore. Real sockets on loopback.

Assertions are on the simulated link (a 10 kB/s link cannot move 20 kB in under ~2 s), with tolerances wide
enough for a busy machine; nothing here measures the speed of our own code.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from edgehub.testing.linksim import LinkSim, OutageMode, parse_duration_s, parse_rate_bps


async def _read_n(reader: asyncio.StreamReader, n: int) -> bytes:
    return await reader.readexactly(n)


def test_rates_and_durations_parse_like_tc_writes_them() -> None:
    assert parse_rate_bps("64kbit") == 64_000
    assert parse_rate_bps("1.5mbit") == 1_500_000
    assert parse_rate_bps("9600") == 9600
    assert parse_duration_s("300ms") == pytest.approx(0.3)
    assert parse_duration_s("60s") == 60
    assert parse_duration_s("5m") == 300
    with pytest.raises(ValueError, match="not a rate"):
        parse_rate_bps("fast")
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_s("soon")


async def test_link_forwards_bytes_unchanged_in_both_directions(echo_port: int) -> None:
    async with asyncio.timeout(10), LinkSim(target_host="127.0.0.1", target_port=echo_port) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        payload = bytes(range(256)) * 400
        writer.write(payload)
        assert await _read_n(reader, len(payload)) == payload
        writer.close()
        assert link.stats.up_bytes == len(payload)
        assert link.stats.down_bytes == len(payload)


async def test_link_holds_throughput_to_its_rate(echo_port: int) -> None:
    rate_bps = 80_000.0  # 10 kB/s each way
    n = 20_000
    async with asyncio.timeout(20), LinkSim(target_host="127.0.0.1", target_port=echo_port, rate_bps=rate_bps) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        t0 = time.monotonic()
        writer.write(b"x" * n)
        await _read_n(reader, n)
        elapsed = time.monotonic() - t0
        writer.close()
    expected = n * 8 / rate_bps  # both directions shape in a pipeline: the echo adds about one chunk
    assert elapsed >= expected * 0.9
    assert elapsed <= expected * 1.6 + 0.5


async def test_link_delays_each_way_by_its_delay(echo_port: int) -> None:
    delay_s = 0.2
    async with asyncio.timeout(10), LinkSim(target_host="127.0.0.1", target_port=echo_port, delay_s=delay_s) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        rtts = []
        for _ in range(3):
            t0 = time.monotonic()
            writer.write(b"ping")
            await _read_n(reader, 4)
            rtts.append(time.monotonic() - t0)
        writer.close()
    assert min(rtts) >= 2 * delay_s * 0.95
    assert max(rtts) <= 2 * delay_s + 0.5


async def test_bytes_are_counted_as_they_enter_the_link_and_again_as_they_leave_it(echo_port: int) -> None:
    async with asyncio.timeout(10), LinkSim(target_host="127.0.0.1", target_port=echo_port, delay_s=1.0) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(b"hello")
        await asyncio.sleep(0.5)
        assert link.stats.up_sent_bytes == 5  # in the link at once...
        assert link.stats.up_bytes == 0  # ...and out of it only a delay later
        assert await _read_n(reader, 5) == b"hello"
        stats = link.stats
        assert (stats.up_sent_bytes, stats.up_bytes, stats.down_sent_bytes, stats.down_bytes) == (5, 5, 5, 5)
        writer.close()


async def test_jitter_never_reorders_bytes(echo_port: int) -> None:
    async with (
        asyncio.timeout(10),
        LinkSim(target_host="127.0.0.1", target_port=echo_port, delay_s=0.05, jitter_s=0.04, chunk_bytes=16) as link,
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        payload = b"".join(i.to_bytes(4, "big") for i in range(500))
        for i in range(0, len(payload), 16):
            writer.write(payload[i : i + 16])
            await writer.drain()
        assert await _read_n(reader, len(payload)) == payload
        writer.close()


async def test_set_rate_takes_effect_on_an_open_connection(echo_port: int) -> None:
    async with asyncio.timeout(20), LinkSim(target_host="127.0.0.1", target_port=echo_port, rate_bps=8_000) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        link.set_rate(800_000)  # 100 kB/s: 20 kB would take 20 s at the old rate
        t0 = time.monotonic()
        writer.write(b"y" * 20_000)
        await _read_n(reader, 20_000)
        assert time.monotonic() - t0 < 10
        writer.close()
        assert link.rate_bps == 800_000


async def test_cut_resets_open_connections_and_refuses_new_ones_until_restore(echo_port: int) -> None:
    async with asyncio.timeout(10), LinkSim(target_host="127.0.0.1", target_port=echo_port) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(b"a")
        await _read_n(reader, 1)
        link.cut()
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await _read_n(reader, 1)
        writer.close()
        r2, w2 = await asyncio.open_connection("127.0.0.1", link.port)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await _read_n(r2, 1)
        w2.close()
        link.restore()
        r3, w3 = await asyncio.open_connection("127.0.0.1", link.port)
        w3.write(b"back")
        assert await _read_n(r3, 4) == b"back"
        w3.close()


async def test_silent_link_forwards_nothing_and_sends_no_fin_then_resumes_on_restore(echo_port: int) -> None:
    async with asyncio.timeout(10), LinkSim(target_host="127.0.0.1", target_port=echo_port) as link:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        link.go_silent()
        writer.write(b"lost?")
        await writer.drain()
        read = asyncio.ensure_future(reader.read(5))
        done, _ = await asyncio.wait({read}, timeout=0.5)
        assert not done  # neither data nor EOF (a FIN would complete the read with b"")
        assert link.stats.up_bytes == 0
        link.restore()
        assert await read == b"lost?"
        writer.close()


async def test_scheduled_outage_goes_down_then_comes_back(echo_port: int) -> None:
    async with (
        asyncio.timeout(10),
        LinkSim(
            target_host="127.0.0.1", target_port=echo_port, outage=(0.3, 0.6), outage_mode=OutageMode.SILENT
        ) as link,
    ):
        await link.wait_until(up=False)
        down_at = time.monotonic()
        await link.wait_until(up=True)
        assert time.monotonic() - down_at >= 0.25
