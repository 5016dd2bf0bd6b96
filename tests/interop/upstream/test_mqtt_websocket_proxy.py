"""The MQTT upstream over a WebSocket through an HTTP CONNECT proxy, for sites where only the proxy leaves: a real
Mosquitto with a ``protocol websockets`` listener, a real tinyproxy in front of it, both on free ports."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from edgehub.core import Message
from edgehub.delivery.endpoint import QueuedMessage
from edgehub.testing.certs import TestCA
from edgehub.testing.mqtt_collector import MqttCollector
from edgehub.testing.peers import MosquittoPeer, PeerWay, free_port
from edgehub.testing.tinyproxy import TinyproxyPeer
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings, ProxySettings, TlsSettings
from edgehub.upstream.mqtt.transport import MqttUpstream
from edgehub.upstream.segment import decode_segment

pytestmark = [pytest.mark.interop, pytest.mark.timeout(90)]


def _batch(n: int, start: int = 0) -> list[QueuedMessage]:
    return [
        QueuedMessage(
            message=Message(body=b'{"n": %d}' % i, system_properties={"edgeMessageId": f"e-{i}"}),
            offset=i,
            priority=5,
            enqueued_at_s=1.7e9 + i,
            ttl_s=3600,
        )
        for i in range(start, start + n)
    ]


def _settings(ws_port: int, proxy: ProxySettings | None) -> MqttUpstreamSettings:
    return MqttUpstreamSettings(
        host="127.0.0.1",
        port=ws_port,
        websocket_path="/mqtt",
        proxy=proxy,
        client_id="hub1",
        hub_id="hub1",
        keepalive_s=2,
        connect_timeout_s=3.0,
        ack_timeout_s=5.0,
        reconnect_min_s=0.1,
        reconnect_max_s=0.5,
    )


async def _sent(up: MqttUpstream, batch: list[QueuedMessage]) -> None:
    """Send ``batch`` until it is all acknowledged (a send on a connection that just went may fail: it is
    sent again, as the executor would)."""
    async with asyncio.timeout(30):
        while True:
            await up.wait_connected()
            result = await up.send(batch)
            if not result.failed:
                return


async def test_the_upstream_reaches_mosquitto_over_a_websocket_through_tinyproxy_and_again_after_a_restart(
    tmp_path: Path,
) -> None:
    ws_port = free_port()
    async with (
        MosquittoPeer(
            tmp_path / "broker",
            way=PeerWay.BINARY,
            extra_config=[f"listener {ws_port} 127.0.0.1", "protocol websockets"],
        ) as broker,
        TinyproxyPeer(tmp_path / "proxy", basic_auth=("edge", "s3cret")) as proxy,
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
    ):
        settings = _settings(ws_port, ProxySettings(proxy.host, proxy.port, username="edge", password="s3cret"))
        assert "s3cret" not in repr(settings)
        async with MqttUpstream(settings) as up:
            await _sent(up, _batch(5))
            await sink.wait_for(1)
            assert proxy.connects == 1  # it went through the proxy...
            records = decode_segment(sink.messages[0].payload)
            assert [r.edge_message_id for r in records] == [f"e-{i}" for i in range(5)]

            await proxy.stop()  # ...the proxy goes away, and the tunnel with it
            await up.wait_for(lambda: not up.connected)
            await proxy.start()  # back on the same port
            await _sent(up, _batch(5, start=5))
            await sink.wait_for(2)
            assert up.status().connects == 2
            records = [r for m in sink.messages for r in decode_segment(m.payload)]
            assert {r.edge_message_id for r in records} == {f"e-{i}" for i in range(10)}


async def test_a_proxy_that_wants_other_credentials_is_a_refusal_backed_off_hard_and_never_shows_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "edgehub.upstream.mqtt.transport")
    async with TinyproxyPeer(tmp_path / "proxy", basic_auth=("edge", "s3cret")) as proxy:
        settings = _settings(free_port(), ProxySettings(proxy.host, proxy.port, username="edge", password="wrong"))
        async with MqttUpstream(settings) as up:
            async with asyncio.timeout(20):
                await up.wait_for(lambda: "upstream.connect_refused" in caplog.text)
            assert not up.connected
        # a refusal (backed off hard: an operator has to fix the credentials), naming the proxy and its answer
        [line] = [r.getMessage() for r in caplog.records if "upstream.connect_refused" in r.getMessage()]
        assert f"proxy {proxy.host}:{proxy.port} refused CONNECT" in line
        assert "s3cret" not in caplog.text
        assert "wrong" not in caplog.text


async def test_the_upstream_reaches_mosquitto_over_wss_through_tinyproxy_checking_the_brokers_certificate(
    tmp_path: Path,
) -> None:
    """The whole way a site that lets only HTTPS out through its proxy takes: CONNECT, TLS to the broker (its
    certificate checked against the test CA and the broker's name), the upgrade, MQTT."""
    ca = TestCA(tmp_path / "pki")
    pair = ca.server()  # SAN localhost and 127.0.0.1
    wss_port = free_port()
    tls_listener = [f"listener {wss_port} 127.0.0.1", "protocol websockets"]
    tls_listener += [f"certfile {pair.cert}", f"keyfile {pair.key}"]
    async with (
        MosquittoPeer(tmp_path / "broker", way=PeerWay.BINARY, extra_config=tls_listener) as broker,
        TinyproxyPeer(tmp_path / "proxy") as proxy,
        MqttCollector(host=broker.host, port=broker.port, topic="edgehub/#") as sink,
    ):
        settings = replace(
            _settings(wss_port, ProxySettings(proxy.host, proxy.port)),
            host="localhost",
            tls=TlsSettings(ca_certs=str(ca.ca_pem)),
        )
        async with MqttUpstream(settings) as up:
            await _sent(up, _batch(3))
            await sink.wait_for(1)
        assert proxy.connects == 1
        assert [r.edge_message_id for r in decode_segment(sink.messages[0].payload)] == ["e-0", "e-1", "e-2"]
