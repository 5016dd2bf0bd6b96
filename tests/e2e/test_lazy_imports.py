"""A hub start loads only what serving needs: cryptography (~14 MB of RSS) only when it makes its certificates
(the first start), fsspec (~15 MB) only for an upload transport, and never the test doubles of edgehub.testing
(~0.9 MB; ``edgehub link-sim`` loads its simulator when it runs), nor the commands other than ``run`` and
``routes`` (capacity, config, identity, link-sim, status, deadletter, store: imported when named), nor
python-qpid-proton until the hub's first AMQP connection (a hub listening for AMQP with no AMQP device connected
holds none of it; ``--no-amqp`` runs without it: it has no aarch64 wheel), nor wsproto (~1.2 MB) until the first
connection to its WebSocket listener. A serving hub never loads pydantic, the
manifest's models or lark (~15 MB): its deployments are checked in a child process, at start and on each live
update. A hub connected to its MQTT upstream holds no paho, nor urllib.request and what it pulls in (email,
http.client: ~2.6 MB; paho imports it for proxy settings): the upstream speaks MQTT with its own client (and
wsproto only when it goes over a WebSocket). Checked
in a fresh interpreter, since this one has loaded them all for other tests."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from asyncio.subprocess import PIPE, Process
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from proton import Delivery
from proton import Message as AmqpMessage

from edgehub.runtime.certs import ensure_certs
from tests.e2e.hub_process import identity_add
from tests.protocol_heads.amqp.conftest import ProtonClient
from tests.protocol_heads.mqtt.conftest import Paho
from tests.upstream.scripted_broker import scripted

PROBE = """
import sys
from pathlib import Path
import edgehub.runtime.cli
from edgehub.runtime.certs import ensure_certs, server_ssl_context
server_ssl_context(ensure_certs(Path(sys.argv[1])))
CLI_ONLY = (
    "cli.capacity", "cli.identity", "cli.linksim", "cli.status", "cli.store", "cli.config", "capacity", "admin.client"
)
heavy = (
    "cryptography", "fsspec", "edgehub.testing", "proton", "wsproto", *(f"edgehub.runtime.{m}" for m in CLI_ONLY)
)
print(sorted(m for m in heavy if m in sys.modules))
"""


def loaded_by_a_start(certs: Path) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, str(certs)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_start_with_certificates_in_place_loads_neither_cryptography_nor_fsspec_nor_the_test_doubles_nor_cli_tools(
    tmp_path: Path,
) -> None:
    assert ensure_certs(tmp_path / "certs").created
    assert loaded_by_a_start(tmp_path / "certs") == "[]"


def test_the_first_start_loads_cryptography_to_make_its_certificates(tmp_path: Path) -> None:
    assert loaded_by_a_start(tmp_path / "certs") == "['cryptography']"
    assert (tmp_path / "certs" / "ca.pem").is_file()


SERVING = """
import asyncio, json, sys
from pathlib import Path
import edgehub.runtime.cli  # all that edgehub run imports
from edgehub.runtime.admin.client import AdminClient
from edgehub.runtime.admin.files import read_token
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.serve import serve

HEAVY = ("pydantic", "pydantic_core", "lark", "edgehub.manifest.models", "edgehub.routing.parser")
manifest, data = Path(sys.argv[1]), Path(sys.argv[2])
answers = []


def put(client: AdminClient, routes: dict[str, str]) -> object:
    return client.request("PUT", "/twin/desired", {"schemaVersion": "1.1", "routes": routes}, ok=(200, 400))[1]


async def update(stop: asyncio.Event, port: int) -> None:
    try:
        client = AdminClient(port, read_token(data) or "")
        answers.append(await asyncio.to_thread(put, client, {"b": "FROM /messages/* WHERE a = 'x' INTO $upstream"}))
        answers.append(await asyncio.to_thread(put, client, {"c": "FROM /messages/* WHERE a = INTO $upstream"}))
    finally:
        stop.set()


async def main() -> None:
    stop = asyncio.Event()
    tasks = []
    config = HubConfig(manifest=manifest, data_dir=data, mqtt_port=0, mqtts_port=None, admin_port=0)
    await serve(config, stop=stop, on_ready=lambda p: tasks.append(asyncio.create_task(update(stop, p["admin"]))))
    await asyncio.gather(*tasks)


asyncio.run(main())
print(json.dumps({"loaded": sorted(m for m in HEAVY if m in sys.modules), "answers": answers}))
"""


def test_a_serving_hub_applies_and_refuses_deployments_without_loading_pydantic_or_lark(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"a": "FROM /* INTO $upstream"}}))
    args = [sys.executable, "-c", SERVING, str(manifest), str(tmp_path / "data")]
    out = subprocess.run(args, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    applied, refused = seen["answers"]
    assert applied["code"] == 200, applied
    assert refused["code"] == 400
    assert any(e.startswith("routes.c: ") for e in refused["errors"]), refused
    assert seen["loaded"] == []


# The end of a script that runs a hub until its ``watch(stop, ports)`` returns, then prints what it ``seen``.
SERVE_UNTIL_WATCHED = """

async def main() -> None:
    stop = asyncio.Event()
    tasks = []
    await serve(config(), stop=stop, on_ready=lambda p: tasks.append(asyncio.create_task(watch(stop, p))))
    await asyncio.gather(*tasks)


asyncio.run(main())
print(json.dumps(seen))
"""

AMQP_SERVING = (
    """
import asyncio, json, sys
from pathlib import Path
import edgehub.runtime.cli  # all that edgehub run imports
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.serve import serve

seen = {}


def config() -> HubConfig:
    return HubConfig(manifest=Path(sys.argv[1]), data_dir=Path(sys.argv[2]), mqtts_port=None, amqp_port=0)


async def watch(stop: asyncio.Event, ports: dict[str, int]) -> None:
    try:
        seen["listening"] = "proton" in sys.modules
        print(ports["amqp"], flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the test's AMQP client has sent a message and closed
        seen["served"] = "proton" in sys.modules
    finally:
        stop.set()
"""
    + SERVE_UNTIL_WATCHED
)


@asynccontextmanager
async def hub_child(script: str, *args: str) -> AsyncIterator[Process]:
    """``script`` in a fresh interpreter with ``args``, its standard streams piped; killed if still running after."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args, stdin=PIPE, stdout=PIPE, stderr=PIPE
    )
    try:
        yield child
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def test_a_hub_serving_amqp_loads_proton_at_its_first_amqp_connection_which_it_serves(tmp_path: Path) -> None:
    manifest, data = tmp_path / "manifest.json", tmp_path / "data"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"a": "FROM /* INTO $upstream"}}))
    cs = await identity_add(data, "dev1")
    async with asyncio.timeout(60), hub_child(AMQP_SERVING, str(manifest), str(data)) as child:
        assert child.stdout is not None
        port = int(await child.stdout.readline() or b"0")
        assert port, (await child.communicate())[1].decode()
        client = await ProtonClient.connect(
            port, user=f"dev1@sas.{cs.host_name}", password=cs.sas_token(int(time.time()) + 3600)
        )
        sender = await client.sender("/devices/dev1/messages/events")
        delivery = await client.send(sender, AmqpMessage(body=b'{"t": 1}'))
        await client.close()
        out, err = await child.communicate(b"done\n")
    assert child.returncode == 0, err.decode()
    assert delivery.remote_state == Delivery.ACCEPTED
    assert json.loads(out.decode().strip().splitlines()[-1]) == {"listening": False, "served": True}


WS_SERVING = (
    """
import asyncio, json, sys
from pathlib import Path
import edgehub.runtime.cli  # all that edgehub run imports
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.serve import serve

seen = {}


def config() -> HubConfig:
    return HubConfig(manifest=Path(sys.argv[1]), data_dir=Path(sys.argv[2]), mqtts_port=None, ws_port=0)


async def watch(stop: asyncio.Event, ports: dict[str, int]) -> None:
    try:
        seen["listening"] = "wsproto" in sys.modules
        print(ports["ws"], flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the test's WebSocket client has published and closed
        seen["served"] = "wsproto" in sys.modules
    finally:
        stop.set()
"""
    + SERVE_UNTIL_WATCHED
)


async def test_a_hub_serving_websockets_loads_wsproto_at_its_first_websocket_connection(tmp_path: Path) -> None:
    manifest, data = tmp_path / "manifest.json", tmp_path / "data"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"a": "FROM /* INTO $upstream"}}))
    cs = await identity_add(data, "dev1")
    async with asyncio.timeout(60), hub_child(WS_SERVING, str(manifest), str(data)) as child:
        assert child.stdout is not None
        port = int(await child.stdout.readline() or b"0")
        assert port, (await child.communicate())[1].decode()
        device = Paho.make("dev1", websocket_path="/$iothub/websocket")
        user = f"{cs.host_name}/dev1/?api-version=2021-04-12"
        assert await device.connect(port, user=user, password=cs.sas_token(int(time.time()) + 3600)) == 0
        mid = device.publish("devices/dev1/messages/events/", b'{"t": 1}')
        assert await device.publishes.get() == (mid, 0)
        await device.close()
        out, err = await child.communicate(b"done\n")
    assert child.returncode == 0, err.decode()
    assert json.loads(out.decode().strip().splitlines()[-1]) == {"listening": False, "served": True}


def test_each_command_imported_when_named_is_found_under_its_name() -> None:
    from click.testing import CliRunner

    from edgehub.runtime.cli import main

    runner = CliRunner()
    listing = runner.invoke(main, ["--help"])
    for name in ("capacity", "deadletter", "identity", "link-sim", "status", "store"):
        assert f"  {name} " in listing.output, listing.output
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        assert f"Usage: main {name} " in result.output or f"Usage: edgehub {name} " in result.output, result.output


def test_a_start_serving_amqp_without_proton_installed_is_refused_with_its_reason(tmp_path: Path) -> None:
    # None in sys.modules is Python's own mark of a module that cannot be imported: proton as if not installed.
    absent = "import sys; sys.modules['proton'] = sys.modules['cproton'] = None; from edgehub.runtime.cli import main"
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"a": "FROM /* INTO $upstream"}}))
    run = ["run", "--manifest", str(manifest), "--data-dir", str(tmp_path / "data"), "--mqtts-port", "0"]
    args = [*run, "--mqtt-port", "0", "--amqps-port", "0", "--admin-port", "0"]
    out = subprocess.run([sys.executable, "-c", f"{absent}; main()", *args], capture_output=True, text=True, timeout=90)
    assert out.returncode == 1, out.stderr
    assert "edgehub: the AMQP head needs python-qpid-proton (missing: proton, cproton)" in out.stderr, out.stderr
    assert "--no-amqp" in out.stderr
    assert "Traceback" not in out.stderr


MQTT_UPSTREAM_SERVING = (
    """
import asyncio, json, sys
from pathlib import Path
import edgehub.runtime.cli  # all that edgehub run imports
from edgehub.runtime.compose.config import HubConfig
from edgehub.runtime.compose.serve import serve
from edgehub.upstream.mqtt.settings import MqttUpstreamSettings

HEAVY = ("paho", "urllib.request", "email", "http.client", "wsproto")  # wsproto: only over a WebSocket
seen = {}


def config() -> HubConfig:
    upstream = MqttUpstreamSettings(host="127.0.0.1", port=int(sys.argv[3]), client_id="edge1", hub_id="edge1")
    return HubConfig(
        manifest=Path(sys.argv[1]), data_dir=Path(sys.argv[2]), mqtts_port=None, amqps_port=None, upstream=upstream
    )


async def watch(stop: asyncio.Event, ports: dict[str, int]) -> None:
    try:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # the test answered the CONNECT and saw the twin's SUBSCRIBE
        seen["loaded"] = sorted(m for m in HEAVY if m in sys.modules)
    finally:
        stop.set()
"""
    + SERVE_UNTIL_WATCHED
)


async def test_a_hub_connected_to_its_mqtt_upstream_holds_no_paho_nor_urllib_request(tmp_path: Path) -> None:
    manifest, data = tmp_path / "manifest.json", tmp_path / "data"
    manifest.write_text(json.dumps({"schemaVersion": "1.1", "routes": {"a": "FROM /* INTO $upstream"}}))
    ensure_certs(data / "certs")  # in place, as on every start but the first (which loads cryptography, email)
    async with (
        asyncio.timeout(60),
        scripted() as broker,  # the upstream broker: this test answers for it
        hub_child(MQTT_UPSTREAM_SERVING, str(manifest), str(data), str(broker.port)) as child,
    ):
        assert child.stdout is not None
        assert await child.stdout.readline() == b"ready\n", (await child.communicate())[1].decode()
        await broker.next_connection()
        assert (await broker.read_packet())[0] == 0x10  # CONNECT
        broker.write(b"\x20\x02\x00\x00")  # CONNACK: accepted
        assert (await broker.read_packet())[0] == 0x82  # the twin's SUBSCRIBE: the connection is up and in use
        out, err = await child.communicate(b"done\n")
    assert child.returncode == 0, err.decode()
    assert json.loads(out.decode().strip().splitlines()[-1]) == {"loaded": []}
